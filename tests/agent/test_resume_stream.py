"""Turns that outlive their client's connection: a client that goes away leaves the turn running,
ResumeStream replays what it missed and follows the turn to its stream_end, on this Agent or (with
the session bus) on another replica. Real Agents, the store on PostgreSQL, the simulator over HTTP."""

from __future__ import annotations

import asyncio
import os
import signal

import grpc
import pytest

from ollama_sim import Reply
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import agent_pb2_grpc
from palimpsest.v1 import session_store_pb2 as store_pb
from tests.conftest import agent_settings
from tests.helpers.calls import end_of, expect_status, full, text_of
from tests.helpers.replica_agents import two_agents
from tests.helpers.waiting import until

# Each test starts from the simulator's deterministic echo.
pytestmark = pytest.mark.usefixtures("fresh_sim")

END = pb.StreamEndReason
WORDS = " ".join(f"w{i}" for i in range(60))


async def leave_after(agent, texts: int, **request) -> list[pb.AgentEvent]:
    """A RunStream whose client goes away after `texts` text deltas: the events it had."""
    call = agent.RunStream(pb.RunStreamRequest(**request))
    seen: list[pb.AgentEvent] = []
    async for event in call:
        seen.append(event)
        if sum(e.HasField("text_delta") for e in seen) == texts:
            call.cancel()
            break
    return seen


async def resume(agent, session_id: str, turn_id: str = "", after_seq: int = 0) -> list[pb.AgentEvent]:
    return [
        e
        async for e in agent.ResumeStream(
            pb.ResumeStreamRequest(session_id=session_id, turn_id=turn_id, after_seq=after_seq), timeout=60
        )
    ]


async def stored_answer(store, session_id: str) -> str:
    async def answered() -> bool:
        messages = (await full(store, session_id)).messages
        return len(messages) == 2 and messages[-1].role == "assistant"

    assert await until(answered, 60)
    last = (await full(store, session_id)).messages[-1]
    assert "partial" not in last.metadata or last.metadata["partial"] is False
    return last.content


def assert_continues(before: list[pb.AgentEvent], after: list[pb.AgentEvent]) -> None:
    """The resumed events are exactly the ones missed: one turn, numbered on without a gap or a repeat."""
    whole = before + after
    assert [e.seq for e in whole] == list(range(1, len(whole) + 1))
    assert len({e.turn_id for e in whole}) == 1 and whole[0].turn_id


async def test_a_client_that_goes_away_leaves_the_turn_running_and_resumes_it(agent, store, ollama_sim):
    ollama_sim.script(Reply(text=WORDS, chunk_delay=0.02))
    before = await leave_after(agent, 3, text="count for me")
    session_id, turn_id = before[0].session_id, before[0].turn_id
    after = await resume(agent, session_id, turn_id, before[-1].seq)
    assert_continues(before, after)
    assert end_of(after).reason == END.STREAM_END_REASON_COMPLETED
    assert text_of(before + after) == WORDS == end_of(after).text
    assert await stored_answer(store, session_id) == WORDS  # the whole answer, not a partial one
    # Once more from the start, now that the turn has ended: the same events.
    again = await resume(agent, session_id, after_seq=0)
    assert [e.SerializeToString() for e in again] == [e.SerializeToString() for e in before + after]


async def test_a_resume_after_the_end_replays_and_a_resume_at_the_end_is_empty(agent, store, ollama_sim):
    ollama_sim.script(Reply(text="short answer"))
    events = [e async for e in agent.RunStream(pb.RunStreamRequest(text="hi"))]
    session_id, turn_id = events[0].session_id, events[0].turn_id
    assert await resume(agent, session_id, turn_id, events[-1].seq) == []
    tail = await resume(agent, session_id, turn_id, events[-1].seq - 2)
    assert tail == events[-2:]


async def test_stop_ends_a_turn_whose_client_went_away(agent, store, ollama_sim):
    ollama_sim.script(Reply(text=WORDS, chunk_delay=0.2))
    before = await leave_after(agent, 1, text="a slow one")
    session_id = before[0].session_id
    assert (await agent.Stop(pb.StopRequest(session_id=session_id))).stopped
    after = await resume(agent, session_id, before[0].turn_id, before[-1].seq)
    assert end_of(after).reason == END.STREAM_END_REASON_STOPPED
    messages = (await full(store, session_id)).messages
    assert messages[-1].metadata["partial"] is True and "w59" not in messages[-1].content


async def test_stop_on_disconnect_stops_the_turn_and_keeps_partial_text(agent, store, ollama_sim):
    ollama_sim.script(Reply(text=WORDS, chunk_delay=0.2))
    before = await leave_after(agent, 1, text="count", stop_on_disconnect=True)
    session_id = before[0].session_id

    async def partial_saved() -> bool:
        return len((await full(store, session_id)).messages) == 2

    assert await until(partial_saved)
    messages = (await full(store, session_id)).messages
    assert messages[1].role == "assistant" and messages[1].metadata["partial"] is True
    assert messages[1].content and "w59" not in messages[1].content
    after = await resume(agent, session_id, before[0].turn_id, before[-1].seq)
    assert end_of(after).reason == END.STREAM_END_REASON_STOPPED


async def test_a_unary_run_whose_caller_gives_up_still_stores_its_answer(agent, store, ollama_sim):
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="small"))).session
    ollama_sim.script(Reply(text=WORDS, chunk_delay=0.05))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await agent.Run(pb.RunRequest(session_id=session.id, text="take your time"), timeout=0.5)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert await stored_answer(store, session.id) == WORDS
    assert end_of(await resume(agent, session.id)).text == WORDS


async def test_resume_refuses_what_it_cannot_give_and_names_the_field(agent, store, ollama_sim):
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="small"))).session
    for request, code, words in [
        (pb.ResumeStreamRequest(), grpc.StatusCode.INVALID_ARGUMENT, "session_id"),
        (pb.ResumeStreamRequest(session_id=session.id, after_seq=-1), grpc.StatusCode.INVALID_ARGUMENT, "after_seq"),
        (pb.ResumeStreamRequest(session_id=session.id), grpc.StatusCode.NOT_FOUND, "no turn of session"),
        (pb.ResumeStreamRequest(session_id="00000000-0000-4000-8000-000000000000"), grpc.StatusCode.NOT_FOUND, ""),
    ]:
        details = await expect_status(resume_call(agent, request), code)
        assert words in details
    ollama_sim.script(Reply(text="done"))
    events = [e async for e in agent.RunStream(pb.RunStreamRequest(session_id=session.id, text="hi"))]
    turn_id = events[0].turn_id
    details = await expect_status(
        resume_call(
            agent, pb.ResumeStreamRequest(session_id=session.id, turn_id=turn_id, after_seq=events[-1].seq + 1)
        ),
        grpc.StatusCode.OUT_OF_RANGE,
    )
    assert details.startswith("after_seq") and f"at seq {events[-1].seq}" in details
    # Another session's turn is not reached through this one.
    other = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="small"))).session
    await expect_status(
        resume_call(agent, pb.ResumeStreamRequest(session_id=other.id, turn_id=turn_id)), grpc.StatusCode.NOT_FOUND
    )


async def resume_call(agent, request: pb.ResumeStreamRequest) -> list[pb.AgentEvent]:
    return [e async for e in agent.ResumeStream(request, timeout=30)]


@pytest.fixture(scope="module")
async def forgetful_agent(base_settings, store_server, compressor_server, ollama_sim, profiles_file):
    """Keeps no ended turn, and little of a running one (10 kB)."""
    from palimpsest.agent.app import start_agent

    running = await start_agent(
        agent_settings(
            base_settings,
            store_server,
            compressor_server,
            ollama_sim,
            profiles_file,
            stream_keep_s=0.0,
            stream_keep_bytes=10_000,
        ),
        port=0,
    )
    async with grpc.aio.insecure_channel(running.address) as channel:
        yield agent_pb2_grpc.AgentStub(channel)
    await running.stop(0)


async def test_what_is_no_longer_kept_is_said_not_replayed_with_a_hole(forgetful_agent, store, ollama_sim):
    words = " ".join(f"word{i}" for i in range(2000))  # far more than 10 kB of events
    ollama_sim.script(Reply(text=words, chunk_delay=0.001))
    before = await leave_after(forgetful_agent, 1, text="a long one")
    session_id, turn_id = before[0].session_id, before[0].turn_id

    async def trimmed() -> bool:
        try:
            await resume_call(
                forgetful_agent,
                pb.ResumeStreamRequest(session_id=session_id, turn_id=turn_id, after_seq=before[-1].seq),
            )
        except grpc.aio.AioRpcError as err:
            return err.code() in (grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.NOT_FOUND)
        return False

    # Whether the reader asks while the turn runs (trimmed: OUT_OF_RANGE naming after_seq) or after
    # it ended (kept 0 s: NOT_FOUND), it is told, never handed a stream with a hole in it.
    assert await until(trimmed, 60)
    assert await stored_answer(store, session_id) == words
    await expect_status(
        resume_call(forgetful_agent, pb.ResumeStreamRequest(session_id=session_id)), grpc.StatusCode.NOT_FOUND
    )


async def test_a_turn_is_resumed_on_another_replica_through_the_session_bus(
    base_settings, store_server, compressor_server, ollama_sim, profiles_file, store
):
    async with two_agents(
        base_settings, store_server, compressor_server, ollama_sim, profiles_file, True, replica_events=True
    ) as agents:
        session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="small"))).session
        watch = agents[1].WatchSession(pb.WatchSessionRequest(session_id=session.id))
        await watch.initial_metadata()  # the second replica's bus listens: it hears the turn from its start
        ollama_sim.script(Reply(text=WORDS, chunk_delay=0.05))
        before = await leave_after(agents[0], 3, session_id=session.id, text="count on the first replica")
        watch.cancel()

        async def heard() -> bool:  # the bus carries events after a moment, at most once
            try:
                async for _ in agents[1].ResumeStream(
                    pb.ResumeStreamRequest(session_id=session.id, turn_id=before[0].turn_id, after_seq=before[-1].seq),
                    timeout=0.5,
                ):
                    break
            except grpc.aio.AioRpcError as err:
                return err.code() != grpc.StatusCode.NOT_FOUND
            return True

        assert await until(heard)
        after = await resume(agents[1], session.id, before[0].turn_id, before[-1].seq)
        assert_continues(before, after)
        assert text_of(before + after) == WORDS and end_of(after).reason == END.STREAM_END_REASON_COMPLETED
        assert await stored_answer(store, session.id) == WORDS


async def test_a_compactions_events_name_no_turn_it_ends_with_its_call(agent, store, ollama_sim):
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="small"))).session
    for i in range(5):
        ollama_sim.script(Reply(text=f"answer number {i} " + "filler " * 40))
        turn = [
            e async for e in agent.RunStream(pb.RunStreamRequest(session_id=session.id, text=f"question {i} " * 30))
        ]
    turn_id = turn[0].turn_id
    events = [e async for e in agent.Compact(pb.CompactRequest(session_id=session.id))]
    assert events and not any(e.turn_id for e in events)  # nothing to resume: ResumeStream would say so
    assert (await resume(agent, session.id))[-1].turn_id == turn_id  # the latest turn is still the last turn


@pytest.fixture
async def killable_and_kept(base_settings, store_server, compressor_server, ollama_sim, profiles_file, tmp_path):
    """Replica A, a real Agent process to kill with SIGKILL; replica B in this process. Session bus on."""
    from palimpsest.agent.app import start_agent
    from palimpsest.shared.ports import free_port
    from tests.helpers.fault_services import Service

    port = free_port()
    env = {
        **os.environ,
        "PALIMPSEST_STORE_ADDR": store_server.address,
        "PALIMPSEST_COMPRESSOR_ADDR": compressor_server.address,
        "OLLAMA_HOST": ollama_sim.url,
        "PALIMPSEST_PROFILES": profiles_file,
        "PALIMPSEST_REPLICA_EVENTS": "1",
        "PALIMPSEST_SESSION_TITLES": "0",
        "PALIMPSEST_DATA_DIR": str(tmp_path / "a"),
        "PALIMPSEST_AUTH_ENABLED": "0",
        "PALIMPSEST_AGENT_ADDR": f"127.0.0.1:{port}",
    }
    a = Service("palimpsest.agent", port, env, tmp_path / "agent-a.log")
    await a.start()
    b = await start_agent(
        agent_settings(base_settings, store_server, compressor_server, ollama_sim, profiles_file, replica_events=True),
        port=0,
    )
    channels = [grpc.aio.insecure_channel(a.address), grpc.aio.insecure_channel(b.address)]
    try:
        yield a, [agent_pb2_grpc.AgentStub(c) for c in channels]
    finally:
        for channel in channels:
            await channel.close()
        a.stop_now()
        await b.stop(0)


async def test_a_turn_lost_with_its_killed_replica_is_not_found_on_the_other(killable_and_kept, store, ollama_sim):
    """Replica B keeps A's turn from the bus while A says it runs it; once A is killed, a resume on
    B replays what B heard and then says the turn is lost (NOT_FOUND), instead of waiting on it."""
    a, (agent_a, agent_b) = killable_and_kept
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="small"))).session
    watch = agent_b.WatchSession(pb.WatchSessionRequest(session_id=session.id))
    await watch.initial_metadata()  # B's bus listens: it hears the turn from its start
    ollama_sim.script(Reply(text=" ".join(f"w{i}" for i in range(400)), chunk_delay=0.1))
    before = await leave_after(agent_a, 3, session_id=session.id, text="count slowly")
    while (await asyncio.wait_for(watch.read(), 30)).seq < before[-1].seq:
        pass  # B has heard as far as the client saw
    watch.cancel()
    a.proc.send_signal(signal.SIGKILL)
    await asyncio.to_thread(a.proc.wait, 30)
    resumed: list[pb.AgentEvent] = []
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for event in agent_b.ResumeStream(
            pb.ResumeStreamRequest(session_id=session.id, turn_id=before[0].turn_id, after_seq=before[-1].seq),
            timeout=60,
        ):
            resumed.append(event)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND and "lost with that replica" in caught.value.details()
    assert_continues(before, resumed)  # what B heard before A died, without a hole
    await expect_status(
        resume_call(agent_b, pb.ResumeStreamRequest(session_id=session.id, turn_id=before[0].turn_id)),
        grpc.StatusCode.NOT_FOUND,
    )

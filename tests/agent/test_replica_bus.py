"""Stop and WatchSession across Agent replicas (PALIMPSEST_REPLICA_EVENTS): two Agents on one store,
a turn on one, and the other stops it or watches it — through the store's session bus, over
PostgreSQL LISTEN/NOTIFY. Without the bus, neither reaches the other replica."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest

from ollama_sim import Reply
from palimpsest.agent.replica_bus import ReplicaBus
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import session_store_pb2 as store_pb
from tests.helpers.bus_faults import drop_listen_connection
from tests.helpers.replica_agents import two_agents
from tests.helpers.waiting import until

END = pb.StreamEndReason


async def streaming(agent, session_id: str, started: asyncio.Event) -> list[pb.AgentEvent]:
    events = []
    async for event in agent.RunStream(pb.RunStreamRequest(session_id=session_id, text="a long one")):
        events.append(event)
        if event.HasField("text_delta"):
            started.set()
    return events


async def a_turn_streaming(agent, store, ollama_sim) -> tuple[str, asyncio.Task]:
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="small"))).session
    ollama_sim.script(Reply(text=" ".join(f"w{i}" for i in range(200)), chunk_delay=0.05))
    started = asyncio.Event()
    task = asyncio.create_task(streaming(agent, session.id, started))
    await asyncio.wait_for(started.wait(), 30)
    return session.id, task


@pytest.mark.parametrize("bus", [True, False], ids=["bus", "no bus"])
async def test_stop_from_the_other_agent_stops_the_turn_only_with_the_bus(
    base_settings, store_server, compressor_server, ollama_sim, profiles_file, store, bus
):
    async with two_agents(
        base_settings, store_server, compressor_server, ollama_sim, profiles_file, True, replica_events=bus
    ) as agents:
        session_id, turn = await a_turn_streaming(agents[0], store, ollama_sim)
        stopped = await agents[1].Stop(pb.StopRequest(session_id=session_id))
        if not bus:
            assert not stopped.stopped
            assert (await agents[0].Stop(pb.StopRequest(session_id=session_id))).stopped
        else:
            assert stopped.stopped
        events = await asyncio.wait_for(turn, 30)
    assert events[-1].stream_end.reason == END.STREAM_END_REASON_STOPPED


async def test_stop_where_no_turn_runs_on_any_replica_says_so(
    base_settings, store_server, compressor_server, ollama_sim, profiles_file, store
):
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="small"))).session
    async with two_agents(
        base_settings, store_server, compressor_server, ollama_sim, profiles_file, True, replica_events=True
    ) as agents:
        assert not (await agents[1].Stop(pb.StopRequest(session_id=session.id))).stopped


async def watched(watch) -> list[pb.AgentEvent]:
    seen = []
    while not (seen and seen[-1].HasField("stream_end")):
        seen.append(await asyncio.wait_for(watch.read(), 30))
    return seen


async def test_a_watcher_on_one_agent_sees_a_turn_on_the_other_whole_and_in_order(
    base_settings, store_server, compressor_server, ollama_sim, profiles_file, store
):
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="small"))).session
    # A stream_end of ~20 KB: four NOTIFYs. (In 400 deltas: a watcher keeps its newest 1,024 events.)
    long_answer = " ".join(f"{i:03d}-" + "x" * 45 for i in range(400))
    async with two_agents(
        base_settings, store_server, compressor_server, ollama_sim, profiles_file, True, replica_events=True
    ) as agents:
        watch = agents[1].WatchSession(pb.WatchSessionRequest(session_id=session.id))
        await watch.initial_metadata()  # in place, the other replica's turns included
        ollama_sim.script(Reply(text=long_answer))
        own = [e async for e in agents[0].RunStream(pb.RunStreamRequest(session_id=session.id, text="go on"))]
        seen = await watched(watch)
        watch.cancel()
    assert seen[0].HasField("turn_started") and seen[0].turn_started.text == "go on"
    assert [e for e in seen if e.seq] == own  # every event of the turn, as its own client saw it
    assert seen[-1].stream_end.text == long_answer


async def test_a_watcher_sees_each_event_once_when_the_turn_runs_on_its_own_agent(
    base_settings, store_server, compressor_server, ollama_sim, profiles_file, store
):
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="small"))).session
    async with two_agents(
        base_settings, store_server, compressor_server, ollama_sim, profiles_file, True, replica_events=True
    ) as agents:
        watch = agents[0].WatchSession(pb.WatchSessionRequest(session_id=session.id))
        await watch.initial_metadata()
        ollama_sim.script(Reply(text="just once"))
        own = [e async for e in agents[0].RunStream(pb.RunStreamRequest(session_id=session.id, text="hi"))]
        seen = await watched(watch)
        # A second turn's start comes next, not a copy of the first turn's events from the bus.
        ollama_sim.script(Reply(text="again"))
        await agents[1].Run(pb.RunRequest(session_id=session.id, text="second"))
        after = await asyncio.wait_for(watch.read(), 30)
        watch.cancel()
    assert [e for e in seen if e.seq] == own
    assert after.HasField("turn_started") and after.turn_started.text == "second"


async def test_an_agent_listens_again_after_the_stores_listen_connection_drops(
    base_settings, store_server, compressor_server, ollama_sim, profiles_file, store, database_url
):
    bus = store_server.servicer.bus
    async with two_agents(
        base_settings, store_server, compressor_server, ollama_sim, profiles_file, True, replica_events=True
    ) as agents:
        dropped = await drop_listen_connection(bus, database_url)
        assert await until(lambda: bus.connection_pid not in (None, dropped))
        session_id, turn = await a_turn_streaming(agents[0], store, ollama_sim)
        assert (await agents[1].Stop(pb.StopRequest(session_id=session_id))).stopped
        events = await asyncio.wait_for(turn, 30)
    assert events[-1].stream_end.reason == END.STREAM_END_REASON_STOPPED


class HungStore:
    """A store whose bus takes nothing: every publish waits forever (a store replica frozen)."""

    def __init__(self):
        self.batches: list[list[int]] = []  # the seqs of each publish's events

    async def PublishSessionMessages(self, request):
        self.batches.append([pb.ReplicaMessage.FromString(m.payload).event.seq for m in request.messages])
        await asyncio.Event().wait()

    def ListenSessionMessages(self, request, timeout=None):
        async def never():
            await asyncio.Event().wait()
            yield  # pragma: no cover

        return never()


async def test_the_outbox_never_waits_for_the_store_and_keeps_the_newest_events(monkeypatch):
    from palimpsest.agent import replica_bus

    monkeypatch.setattr(replica_bus, "OUTBOX_MESSAGES", 100)
    store = HungStore()
    bus = ReplicaBus(store, "r1", deliver=lambda e: None, stop_here=lambda s: False)
    bus.start()
    session_id = str(uuid.uuid4())
    try:
        for i in range(1, 251):  # publish returns at once each time, whatever the store does
            bus.publish(pb.AgentEvent(session_id=session_id, seq=i, text_delta=pb.TextDelta(text="x")))
        assert await until(lambda: len(store.batches) == 1)
        assert bus.dropped == 150 and store.batches[0] == list(range(151, 251))  # the newest 100 kept
        bus.publish(pb.AgentEvent(session_id=session_id, seq=251, text_delta=pb.TextDelta(text="x")))
        assert len(store.batches) == 1  # queued behind the publish that hangs
    finally:
        await bus.close(flush_s=0.1)


async def test_a_turn_on_one_agent_sees_what_a_turn_on_the_other_wrote_since_its_warm_copy(
    base_settings, store_server, compressor_server, ollama_sim, profiles_file, store
):
    """Agent A keeps a warm copy of the session after its turn; Agent B then runs a turn on it. A's
    next turn must start from the session as B left it: the warm copy is checked by revision (the
    store refuses A's first write as stale, A reloads), never trusted as it was kept."""
    from palimpsest.agent.app import start_agent
    from palimpsest.v1 import agent_pb2_grpc
    from tests.conftest import agent_settings

    settings = agent_settings(
        base_settings, store_server, compressor_server, ollama_sim, profiles_file, turn_claims=True, turn_claim_ttl_s=5
    )
    running = [await start_agent(settings, port=0) for _ in range(2)]
    prompts: list[list[str]] = []  # the user messages of each model call, as the model saw them

    def answer(body):
        users = [m["content"] for m in body["messages"] if m["role"] == "user"]
        prompts.append(users)
        return Reply(text=f"answer to {users[-1]}")

    ollama_sim.set_responder(answer)
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="small"))).session
    try:
        async with (
            grpc.aio.insecure_channel(running[0].address) as a,
            grpc.aio.insecure_channel(running[1].address) as b,
        ):
            on_a, on_b = agent_pb2_grpc.AgentStub(a), agent_pb2_grpc.AgentStub(b)
            await on_a.Run(pb.RunRequest(session_id=session.id, text="one on A"))
            await asyncio.gather(*running[0].servicer.deps.post_turn_tasks)  # A's warm copy is kept
            assert len(running[0].servicer.sessions._warm) == 1
            await on_b.Run(pb.RunRequest(session_id=session.id, text="two on B"))
            third = await on_a.Run(pb.RunRequest(session_id=session.id, text="three on A"))
    finally:
        ollama_sim.set_responder(None)
        for r in running:
            await r.stop(0)
    assert third.reason == END.STREAM_END_REASON_COMPLETED
    assert prompts[-1][-3:] == ["one on A", "two on B", "three on A"]
    stored = [
        (m.role, m.content)
        for m in (
            await store.GetSession(
                store_pb.GetSessionRequest(session_id=session.id, view=store_pb.SESSION_VIEW_DISPLAY)
            )
        ).session.messages
    ]
    assert stored == [
        ("user", "one on A"),
        ("assistant", "answer to one on A"),
        ("user", "two on B"),
        ("assistant", "answer to two on B"),
        ("user", "three on A"),
        ("assistant", "answer to three on A"),
    ]

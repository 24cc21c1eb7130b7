"""What readers may cost the Agent: a client that never reads its turn's stream holds nothing but
the turn's kept events (bounded); the streams that follow a session (WatchSession, ResumeStream)
are capped per user and per session; a client that leaves is no error. Real Agents, the store on
PostgreSQL, the simulator over HTTP, a real gRPC server for the leaving clients."""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from dataclasses import replace

import grpc
import pytest

from ollama_sim import Reply
from palimpsest.agent.watchers import WATCH_QUEUE_BYTES, WATCH_QUEUE_EVENTS, SessionWatchers
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import agent_pb2_grpc
from palimpsest.v1 import session_store_pb2 as store_pb
from tests.conftest import agent_settings, bearer
from tests.helpers.waiting import until

# Each test starts from the simulator's deterministic echo.
pytestmark = pytest.mark.usefixtures("fresh_sim")

END = pb.StreamEndReason
KEEP_BYTES = 1024 * 1024


@pytest.fixture(scope="module")
async def capped(base_settings, store_server_auth, compressor_server, ollama_sim, profiles_file):
    """An Agent with auth on, 1 MB of kept events, and room for 3 followers per user, 2 per session."""
    from palimpsest.agent.app import start_agent

    settings = replace(
        agent_settings(base_settings, store_server_auth, compressor_server, ollama_sim, profiles_file),
        auth_enabled=True,
        stream_keep_bytes=KEEP_BYTES,
        watchers_per_user=3,
        watchers_per_session=2,
    )
    running = await start_agent(settings, port=0)
    async with grpc.aio.insecure_channel(running.address) as channel:
        yield running, agent_pb2_grpc.AgentStub(channel)
    await running.stop(0)


async def new_session(store_auth, who) -> str:
    return (await store_auth.CreateSession(store_pb.CreateSessionRequest(profile_id="small"), metadata=who)).session.id


async def watching(agent, session_id: str, who) -> grpc.aio.UnaryStreamCall:
    """A WatchSession once the Agent has answered it: in place, or refused."""
    call = agent.WatchSession(pb.WatchSessionRequest(session_id=session_id), metadata=who)
    await call.initial_metadata()
    return call


async def refusal(call) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await asyncio.wait_for(call.read(), 30)  # (a watch in place has nothing to say: it fails the test)
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.value.details()
    return error.value.details()


# -- slow readers --------------------------------------------------------------------------------
async def test_a_client_that_never_reads_holds_only_the_kept_events_and_is_told_to_resume(
    capped, store_auth, ollama_sim
):
    """The turn runs to its end and stores its answer; what waited for the client was the turn's
    kept log (within PALIMPSEST_STREAM_KEEP_MB), not a queue of its own: reading at last, it gets
    what its connection took on the way, then OUT_OF_RANGE saying where to resume, and the resume
    ends with the whole answer."""
    running, agent = capped
    me = bearer(f"slow-{uuid.uuid4().hex[:8]}")
    session_id = await new_session(store_auth, me)
    words = " ".join(f"w{i}" for i in range(20_000))  # events of about 2.5 MB: past the 1 MB kept
    ollama_sim.script(Reply(text=words))

    async def stored() -> bool:
        messages = (
            await store_auth.GetSession(
                store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_DISPLAY), metadata=me
            )
        ).session.messages
        return len(messages) == 2 and messages[-1].content == words

    # A client whose connection takes no more than HTTP/2's first window (no BDP probe to widen it):
    # what the Agent sends past that waits on the client, as on a slow link.
    async with grpc.aio.insecure_channel(running.address, options=[("grpc.http2.bdp_probe", 0)]) as narrow:
        call = agent_pb2_grpc.AgentStub(narrow).RunStream(
            pb.RunStreamRequest(session_id=session_id, text="a long one"), metadata=me
        )
        assert await until(stored, 120)  # the turn went on without its reader
        assert running.servicer.turn_logs.bytes <= KEEP_BYTES
        seen: list[pb.AgentEvent] = []
        with pytest.raises(grpc.aio.AioRpcError) as behind:
            async for event in call:
                seen.append(event)
    assert behind.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert "fell behind" in behind.value.details() and not any(e.HasField("stream_end") for e in seen)
    resume_from = int(re.search(r"ResumeStream with after_seq (\d+)", behind.value.details())[1])
    rest = [
        e
        async for e in agent.ResumeStream(
            pb.ResumeStreamRequest(session_id=session_id, turn_id=seen[0].turn_id, after_seq=resume_from),
            metadata=me,
            timeout=60,
        )
    ]
    assert [e.seq for e in rest] == list(range(resume_from + 1, resume_from + 1 + len(rest)))
    assert rest[-1].stream_end.reason == END.STREAM_END_REASON_COMPLETED and rest[-1].stream_end.text == words


def test_a_stalled_watcher_keeps_the_newest_events_within_its_bounds():
    watchers = SessionWatchers()
    with watchers.watching("s1", "u") as stalled, watchers.watching("s1", "u") as other:
        for i in range(WATCH_QUEUE_EVENTS * 4):
            watchers.publish("s1", b"%06d" % i)
        assert len(stalled._payloads) == WATCH_QUEUE_EVENTS and stalled._payloads[-1] == b"%06d" % (i,)
        big = b"x" * 4096
        for _ in range(2 * WATCH_QUEUE_BYTES // len(big)):
            watchers.publish("s1", big)
        assert stalled._bytes <= WATCH_QUEUE_BYTES
        # One event serialized once: every watcher holds the same bytes, not a copy each.
        assert all(a is b for a, b in zip(stalled._payloads, other._payloads))
        huge = b"y" * (2 * WATCH_QUEUE_BYTES)  # a final answer larger than the bound: still delivered
        watchers.publish("s1", huge)
        assert list(stalled._payloads) == [huge]


# -- caps on the streams that follow a session ---------------------------------------------------
async def test_streams_following_sessions_are_capped_per_user_and_per_session_naming_the_setting(
    capped, store_auth, user
):
    _, agent = capped
    alice, bob = bearer(user), bearer(f"{user}-bob")
    first, second, third = [await new_session(store_auth, alice) for _ in range(3)]
    bobs = await new_session(store_auth, bob)
    open_calls = [await watching(agent, first, alice), await watching(agent, first, alice)]
    details = await refusal(await watching(agent, first, alice))  # a third on one session
    assert details.startswith("PALIMPSEST_WATCHERS_PER_SESSION:") and first in details
    open_calls.append(await watching(agent, second, alice))
    details = await refusal(await watching(agent, third, alice))  # a fourth for one user
    assert details.startswith("PALIMPSEST_WATCHERS_PER_USER:") and user in details
    # A resume follows a session too, and is counted as a watch is.
    resume = agent.ResumeStream(pb.ResumeStreamRequest(session_id=third), metadata=alice)
    assert (await refusal(resume)).startswith("PALIMPSEST_WATCHERS_PER_USER:")
    # Refused before anything else is done for the call: not even whether the session exists.
    assert (await refusal(await watching(agent, str(uuid.uuid4()), alice))).startswith("PALIMPSEST_WATCHERS_PER_USER")
    open_calls.append(await watching(agent, bobs, bob))  # another user is not held back
    open_calls.pop(0).cancel()  # one of Alice's ends: once the Agent has seen it go, she may open one again
    watchers = capped[0].servicer._watchers
    assert await until(lambda: watchers._by_user[user] == 2)
    open_calls.append(await watching(agent, third, alice))
    for call in open_calls:
        assert not call.done()
        call.cancel()


# -- clients that leave ----------------------------------------------------------------------------
async def test_a_client_that_left_while_it_was_answered_is_no_error(base_settings, caplog):
    """gRPC refuses a send on a call whose client has gone (ExecuteBatchError); a servicer that
    meets it, and gRPC's own log of it, say at most a debug line."""
    from grpc._cython.cygrpc import ExecuteBatchError

    from palimpsest.shared.server import start_server

    started, refused = asyncio.Event(), asyncio.Event()

    async def answer_after_the_client_left(request, context):
        started.set()
        try:
            await asyncio.Event().wait()  # until the client leaves (the call is cancelled)
        except asyncio.CancelledError:
            pass
        try:
            await context.send_initial_metadata(())  # on a call that is over: gRPC refuses it
        finally:
            refused.set()
        yield b""

    handler = grpc.method_handlers_generic_handler(
        "test.Leaving", {"Watch": grpc.unary_stream_rpc_method_handler(answer_after_the_client_left)}
    )
    running = await start_server(
        lambda server: server.add_generic_rpc_handlers((handler,)), [], settings=base_settings, port=0
    )
    try:
        with (
            caplog.at_level(logging.DEBUG, logger="palimpsest.server"),
            caplog.at_level(logging.DEBUG, logger="grpc._cython.cygrpc"),
        ):
            async with grpc.aio.insecure_channel(running.address) as channel:
                call = channel.unary_stream("/test.Leaving/Watch")(b"")
                await asyncio.wait_for(started.wait(), 30)
                call.cancel()
                await asyncio.wait_for(refused.wait(), 30)
            try:  # gRPC's own log line for such a refusal, as its aio server writes it
                raise ExecuteBatchError('Failed "execute_batch"')
            except ExecuteBatchError:
                logging.getLogger("grpc._cython.cygrpc").exception(
                    "ExecuteBatchError raised in core by servicer method [/test.Leaving/Watch]"
                )
    finally:
        await running.stop(0)
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not errors, [r.getMessage() for r in errors]
    left = [r for r in caplog.records if "client left" in r.getMessage()]
    assert {r.name for r in left} == {"palimpsest.server", "grpc._cython.cygrpc"}, left

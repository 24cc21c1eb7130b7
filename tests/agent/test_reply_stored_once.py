"""A turn's answer is stored exactly once, or the client is told it was not: the Agent retries the
write under one idempotency key while the SessionStore does not answer. The faults are real: the
Agent reaches the store through a TCP relay that holds the store's answers or cuts its connections."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from dataclasses import replace

import grpc

from ollama_sim import Reply
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import agent_pb2_grpc
from tests.conftest import agent_settings
from tests.helpers.calls import full
from tests.helpers.relay import Relay
from tests.helpers.waiting import until

END = pb.StreamEndReason
ANSWER = "one two three four five six"


@asynccontextmanager
async def relayed_agent(base_settings, store_server, compressor_server, ollama_sim, profiles_file, **overrides):
    """An Agent whose every store call crosses a relay; yields (its stub, the relay)."""
    from palimpsest.agent.app import start_agent

    host, port = store_server.address.rsplit(":", 1)
    relay = Relay((host, int(port)))
    await relay.start()
    settings = replace(
        agent_settings(base_settings, store_server, compressor_server, ollama_sim, profiles_file),
        store_addr=f"127.0.0.1:{relay.port}",
        **overrides,
    )
    running = await start_agent(settings, port=0)
    try:
        async with grpc.aio.insecure_channel(running.address) as channel:
            yield agent_pb2_grpc.AgentStub(channel), relay
    finally:
        relay.thaw()
        await running.stop(0)


async def first_text(stream) -> pb.AgentEvent:
    """Events up to the first token of the answer: from then on only the answer's write is left."""
    async for event in stream:
        if event.HasField("text_delta"):
            return event
    raise AssertionError("the stream ended before the answer began")


async def rest_of(stream) -> list[pb.AgentEvent]:
    return [e async for e in stream]


async def test_an_answer_whose_acknowledgement_was_lost_is_stored_once(
    base_settings, store_server, compressor_server, ollama_sim, profiles_file, store, caplog
):
    async with relayed_agent(
        base_settings,
        store_server,
        compressor_server,
        ollama_sim,
        profiles_file,
        rpc_timeout_s=4.0,
        reply_write_deadline_s=30.0,
    ) as (agent, relay):
        ollama_sim.script(Reply(text=ANSWER, chunk_delay=0.05))
        stream = agent.RunStream(pb.RunStreamRequest(text="count to six"))
        session_id = (await first_text(stream)).session_id
        relay.hold_answers()  # the write arrives and commits; its acknowledgement does not come back

        async def committed_and_retried() -> bool:
            stored = [m.content for m in (await full(store, session_id)).messages if m.role == "assistant"]
            return stored == [ANSWER] and any("retry" in r.getMessage() for r in caplog.records)

        assert await until(committed_and_retried), "the answer was not written, or its write was not retried"
        relay.thaw()
        events = await asyncio.wait_for(rest_of(stream), timeout=30)
    assert events[-1].stream_end.reason == END.STREAM_END_REASON_COMPLETED, [e.error for e in events]
    assert [(m.role, m.content) for m in (await full(store, session_id)).messages] == [
        ("user", "count to six"),
        ("assistant", ANSWER),
    ]


async def test_an_answer_that_could_not_be_stored_says_so_and_where_its_text_is(
    base_settings, store_server, compressor_server, ollama_sim, profiles_file, store
):
    async with relayed_agent(
        base_settings,
        store_server,
        compressor_server,
        ollama_sim,
        profiles_file,
        rpc_timeout_s=4.0,
        reply_write_deadline_s=1.5,
    ) as (agent, relay):
        ollama_sim.script(Reply(text=ANSWER, chunk_delay=0.05))
        stream = agent.RunStream(pb.RunStreamRequest(text="count to six"))
        first = await first_text(stream)
        await relay.cut()  # the store is gone for longer than the Agent keeps retrying
        events = [first, *await asyncio.wait_for(rest_of(stream), timeout=30)]
        end = events[-1].stream_end
        assert end.reason == END.STREAM_END_REASON_ERROR and end.text == ANSWER
        # (A loaded machine may add a "without the Compressor" warning: not what is looked at here.)
        errors = [e.error.message for e in events if e.HasField("error") and "Compressor" not in e.error.message]
        assert len(errors) == 1 and "not stored" in errors[0] and "stream_end" in errors[0], errors
        assert [m.role for m in (await full(store, first.session_id)).messages] == ["user"]

        await relay.start()  # back: the session takes the next turn
        ollama_sim.script(Reply(text="stored this time"))
        again: list = []

        async def next_turn() -> bool:
            # Until the Agent's channel has found the store again (its reconnect backoff is up to
            # 2 s), opening the turn is a plain UNAVAILABLE the client may retry; nothing is stored.
            try:
                again[:] = [
                    e async for e in agent.RunStream(pb.RunStreamRequest(session_id=first.session_id, text="again"))
                ]
                return True
            except grpc.aio.AioRpcError as error:
                assert error.code() == grpc.StatusCode.UNAVAILABLE, error
                return False

        assert await until(next_turn, 30)
        assert again[-1].stream_end.reason == END.STREAM_END_REASON_COMPLETED, [e.error for e in again]
    assert [m.content for m in (await full(store, first.session_id)).messages if m.role == "assistant"] == [
        "stored this time"
    ]

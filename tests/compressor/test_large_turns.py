"""A session whose context is larger than one gRPC message still takes turns and compacts: the
store reads it in parts, the size check gets each very long message as its head and tail, and
the model gets each cut to its budget. The three services run with a 4 MB message limit (and a
2 MB cap per message) so the test needs megabytes, not the default's hundreds."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from ollama_sim import Reply
from ollama_sim.prompt import count_text_tokens
from ollama_sim.vocabulary import tokenizer_metadata
from palimpsest.compressor.model_tokenizers import TokenCounter
from palimpsest.compressor.vocabulary import build_tokenizer
from palimpsest.shared.channels import open_channel
from palimpsest.shared.context_view import SIZE_CHECK_SLICE_CHARS
from palimpsest.v1 import agent_pb2 as apb
from palimpsest.v1 import agent_pb2_grpc, common_pb2, session_store_pb2_grpc
from palimpsest.v1 import session_store_pb2 as pb

Message = common_pb2.Message
MB = 1024 * 1024
LIMIT = 4 * MB
LOG = 3 * MB // 2


def dense_log(seed: int, chars: int) -> str:
    rng = random.Random(seed)
    lines, size = [], 0
    while size < chars:
        line = (
            f"2026-11-30T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z "
            f"{rng.choice(['INFO', 'WARN', 'ERROR'])} 10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.7 "
            f"req={rng.getrandbits(48):012x} GET /v2/orders/{rng.randint(1, 10**6)} {rng.randint(1, 4000)}ms"
        )
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)[:chars]


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter(build_tokenizer(tokenizer_metadata("qwen3.6")), "test")


@pytest.mark.slow  # three size-check slices of text, also encoded whole to compare
def test_a_very_long_text_is_cut_exactly_as_if_encoded_whole(counter):
    text = dense_log(1, 3 * SIZE_CHECK_SLICE_CHARS)
    whole = counter.tokenizer.encode(text, add_special_tokens=False).offsets
    head, tail = counter.head_and_tail(text, 700, 600)
    assert head == text[: whole[699][1]] and tail == text[whole[-600][0] :]
    # Counted from its head and tail, scaled to its length: within a percent of the whole count.
    assert abs(counter.count(text) - len(whole)) / len(whole) < 0.01


@pytest.mark.slow
def test_a_text_whose_slices_hold_too_few_tokens_is_encoded_whole(counter):
    text = "=" * (3 * SIZE_CHECK_SLICE_CHARS)  # long runs: very long tokens, few of them per slice
    whole = counter.tokenizer.encode(text, add_special_tokens=False).offsets
    head, tail = counter.head_and_tail(text, len(whole) // 2, 10)
    assert head == text[: whole[len(whole) // 2 - 1][1]] and tail == text[whole[-10][0] :]


@pytest.fixture(scope="module")
async def services(base_settings, database_url, ollama_sim, profiles_file):
    from palimpsest.agent.app import start_agent
    from palimpsest.compressor.app import start_compressor
    from palimpsest.store.app import start_store

    settings = replace(
        base_settings,
        max_message_bytes=LIMIT,
        message_max_bytes=2 * MB,
        hot_window_bytes=64 * MB,
        ollama_host=ollama_sim.url,
        profiles_path=profiles_file,
    )
    store = await start_store(settings, port=0, dsn=database_url)
    compressor = await start_compressor(replace(settings, store_addr=store.address), port=0)
    agent = await start_agent(replace(settings, store_addr=store.address, compressor_addr=compressor.address), port=0)
    try:
        async with (
            open_channel(agent.address, settings) as agent_channel,
            open_channel(store.address, settings) as store_channel,
        ):
            yield agent_pb2_grpc.AgentStub(agent_channel), session_store_pb2_grpc.SessionStoreStub(store_channel)
    finally:
        await agent.stop(0)
        await compressor.stop(0)
        await store.stop(0)


async def test_a_context_past_the_message_limit_takes_a_turn_and_compacts(services, ollama_sim):
    agent, store = services
    session = (await store.CreateSession(pb.CreateSessionRequest(profile_id="small", model="qwen3.6"))).session
    logs = [dense_log(seed, LOG) for seed in range(4)]  # 6 MB of context, one 4 MB message at most
    for i, log in enumerate(logs):
        call = common_pb2.ToolCall(id=f"c{i}", name="read_file", arguments_json='{"path": "/var/log/app.log"}')
        await store.AppendMessages(
            pb.AppendMessagesRequest(
                session_id=session.id,
                messages=[
                    Message(role="user", content=f"read log {i}"),
                    Message(role="assistant", tool_calls=[call]),
                    Message(role="tool", name="read_file", tool_call_id=f"c{i}", content=log),
                ],
            )
        )
    ollama_sim.set_responder(lambda body: Reply(text="- the logs show resets\nKEYS: resets"))
    try:
        compacted = [e async for e in agent.Compact(apb.CompactRequest(session_id=session.id), timeout=120)]
        assert any(e.HasField("context_compressed") for e in compacted), compacted
        await store.AppendMessages(
            pb.AppendMessagesRequest(
                session_id=session.id,
                messages=[
                    Message(role="user", content="and one more"),
                    Message(role="assistant", tool_calls=[call]),
                    Message(role="tool", name="read_file", tool_call_id=f"c{len(logs)}", content=logs[0]),
                ],
            )
        )
        events = [
            e async for e in agent.RunStream(apb.RunStreamRequest(session_id=session.id, text="what now?"), timeout=120)
        ]
        assert events[-1].stream_end.reason == apb.STREAM_END_REASON_COMPLETED, [
            e.error for e in events if e.HasField("error")
        ]
        sent = ollama_sim.bodies()[-1]["messages"]
        # No log reached the model whole: each view fits its budget.
        for message in sent:
            assert count_text_tokens(str(message.get("content") or "")) <= 8192 // 6 + 16
    finally:
        ollama_sim.set_responder(None)
    tools, before = [], 0
    while True:  # pages of at most half the message limit: about one log each
        page = await store.GetHistoryPage(pb.GetHistoryPageRequest(session_id=session.id, limit=50, before_seq=before))
        tools = [m.content for m in page.messages if m.role == "tool"] + tools
        if not page.has_more:
            break
        before = page.messages[0].seq
    assert tools == [*logs, logs[0]]  # the display history keeps every byte
    await store.DeleteSession(pb.DeleteSessionRequest(session_id=session.id))


def test_the_size_check_request_stays_under_the_limit():
    """What the Agent sends the Compressor for such a context: a few megabytes, not dozens."""
    from palimpsest.shared.context_view import sliced_for_size_check

    messages = [Message(role="tool", content=dense_log(seed, LOG)) for seed in range(4)]
    sliced = sliced_for_size_check(messages)
    assert sum(m.ByteSize() for m in messages) > LIMIT > 2 * sum(m.ByteSize() for m in sliced)
    assert all(len(m.content) == 2 * SIZE_CHECK_SLICE_CHARS for m in sliced)


async def test_a_stored_message_never_carries_a_slice_length(services):
    """`sliced_from_chars` only travels in a size check's request: the store keeps no such thing,
    so no stored row can make its own count scaled."""
    _, store = services
    session = (await store.CreateSession(pb.CreateSessionRequest(profile_id="small"))).session
    await store.AppendMessages(
        pb.AppendMessagesRequest(
            session_id=session.id, messages=[Message(role="user", content="short", sliced_from_chars=10**12)]
        )
    )
    page = await store.GetHistoryPage(pb.GetHistoryPageRequest(session_id=session.id))
    assert [m.sliced_from_chars for m in page.messages] == [0]
    await store.DeleteSession(pb.DeleteSessionRequest(session_id=session.id))

"""The Compressor counts with the model's own vocabulary end to end: the simulator serves it on
/api/show, the size check answers exact, never loses a turn to a tool result that does not fit,
and a model without a vocabulary falls back to the calibrated estimate."""

from __future__ import annotations

import json

from ollama_sim import Reply
from ollama_sim.prompt import count_prompt_tokens
from palimpsest.agent.context_builder import apply_cuts
from palimpsest.compressor.model_tokenizers import ModelTokenizers
from palimpsest.shared.context_view import to_ollama_messages
from palimpsest.shared.ollama import OllamaClient
from palimpsest.v1 import agent_pb2, common_pb2
from palimpsest.v1 import compressor_pb2 as pb
from palimpsest.v1.common_pb2 import Message, ToolCall

LOGS = "\n".join(
    f"2026-11-30T10:{i % 60:02d}:17Z ERROR [worker-{i % 7}] 10.0.{i % 255}.7 reset id=0x{i * 7919:08x}"
    for i in range(2000)
)


def turn_with_result(result: str, user: str = "read the log") -> list[Message]:
    return [
        Message(role="system", content="You are a careful assistant."),
        Message(role="user", content=user),
        Message(
            role="assistant", tool_calls=[ToolCall(id="c1", name="read", arguments_json='{"path": "/var/log/app"}')]
        ),
        Message(role="tool", name="read", tool_call_id="c1", content=result),
    ]


async def test_the_size_check_counts_exactly_with_the_models_vocabulary(compressor):
    messages = turn_with_result(LOGS[:3000])
    reply = await compressor.CheckContextSize(
        pb.CheckContextSizeRequest(model="qwen3.6", messages=messages, window=8192)
    )
    real = count_prompt_tokens(to_ollama_messages(apply_cuts(messages, reply.cuts)))
    assert [c.index for c in reply.cuts] == [3]  # dense logs: over a sixth of the window, so cut
    assert reply.method == pb.ESTIMATE_METHOD_EXACT and reply.decision == pb.SIZE_DECISION_FITS
    assert reply.shape.messages == 4 and reply.shape.tool_calls == 1 and reply.shape.tool_results == 1
    assert real <= reply.tokens <= real * 1.1 + 80  # never low; before any report, within the prior's margin


async def test_a_tool_result_that_does_not_fit_is_cut_further_instead_of_losing_the_turn(compressor):
    settings = pb.CompressionSettings(message_token_budget=20_000)  # the view alone would not cut it
    messages = turn_with_result(LOGS)
    reply = await compressor.CheckContextSize(
        pb.CheckContextSizeRequest(model="qwen3.6", messages=messages, window=8192, settings=settings)
    )
    assert reply.decision == pb.SIZE_DECISION_FITS and reply.tokens <= reply.limit
    [cut] = reply.cuts
    assert cut.index == 3 and "truncated" in cut.content
    assert cut.content.startswith(LOGS[:200]) and cut.content.endswith(LOGS[-200:])
    view = list(messages)
    view[3] = Message(role="tool", name="read", tool_call_id="c1", content=cut.content)
    assert count_prompt_tokens(to_ollama_messages(view)) <= reply.limit


async def test_too_large_only_when_the_users_own_words_cannot_fit(compressor):
    messages = turn_with_result("ok", user="please read: " + LOGS)
    reply = await compressor.CheckContextSize(
        pb.CheckContextSizeRequest(model="qwen3.6", messages=messages, window=8192)
    )
    assert reply.decision == pb.SIZE_DECISION_TOO_LARGE and not reply.fits and reply.tokens > reply.limit


async def test_a_model_without_a_vocabulary_is_counted_by_the_calibrated_estimate(compressor):
    reply = await compressor.CheckContextSize(
        pb.CheckContextSizeRequest(model="tiny", messages=turn_with_result(LOGS[:3000]), window=8192)
    )
    assert reply.method in (pb.ESTIMATE_METHOD_FALLBACK, pb.ESTIMATE_METHOD_CALIBRATED)
    assert reply.decision == pb.SIZE_DECISION_FITS
    # No exact content count, but the shape a report teaches the per-class rates with: every
    # character of the view (contents and tool calls) in one class.
    shape = reply.shape
    assert shape.content_tokens == 0 and shape.messages == 4 and shape.tool_calls == 1
    classes = (
        shape.chars_space,
        shape.chars_digit,
        shape.chars_latin,
        shape.chars_cjk,
        shape.chars_other_letter,
        shape.chars_symbol,
    )
    view = apply_cuts(turn_with_result(LOGS[:3000]), reply.cuts)
    view_text = sum(len(m.content) for m in view) + len('{"name": "read", "arguments": {"path": "/var/log/app"}}')
    assert sum(classes) == view_text and shape.chars_digit > 0 and shape.chars_latin > 0


async def test_tool_schemas_are_counted(compressor):
    schema = json.dumps(
        {
            "type": "function",
            "function": {"name": "read", "description": "Read a file " * 30, "parameters": {"type": "object"}},
        }
    )
    messages = turn_with_result("short")
    bare = await compressor.CheckContextSize(
        pb.CheckContextSizeRequest(model="qwen3.6", messages=messages, window=8192)
    )
    with_tools = await compressor.CheckContextSize(
        pb.CheckContextSizeRequest(model="qwen3.6", messages=messages, window=8192, tool_schemas=[schema])
    )
    assert with_tools.shape.tools == 1 and with_tools.tokens - bare.tokens > 90


async def test_the_tokenizer_is_built_once_per_digest_and_then_read_from_disk(ollama_sim, tmp_path):
    first = OllamaClient(ollama_sim.url)
    try:
        counter = await ModelTokenizers(first, tmp_path).counter("qwen3.6")
        assert counter is not None and counter.count("hello world") == 2
    finally:
        await first.aclose()
    assert len(list(tmp_path.glob("*.json"))) == 1
    before = sum(1 for r in ollama_sim.requests if r.path == "/api/show")
    second = OllamaClient(ollama_sim.url)
    try:
        again = await ModelTokenizers(second, tmp_path).counter("qwen3.6")
        assert again is not None and again.count("hello world") == 2
    finally:
        await second.aclose()
    assert sum(1 for r in ollama_sim.requests if r.path == "/api/show") == before  # no second 13 MB fetch


async def test_an_unknown_model_gets_no_counter_and_no_failed_request(ollama_sim, tmp_path):
    client = OllamaClient(ollama_sim.url)
    try:
        tokenizers = ModelTokenizers(client, tmp_path)
        assert await tokenizers.counter("no-such-model") is None
        assert await tokenizers.counter("tiny") is None  # no vocabulary: the fallback, once
    finally:
        await client.aclose()


async def test_usage_events_say_how_the_count_was_made(agent, ollama_sim):
    ollama_sim.script(Reply(text="hello"))
    events = [e async for e in agent.RunStream(agent_pb2.RunStreamRequest(text="hi there"))]
    [usage] = [e.usage for e in events if e.HasField("usage")]
    assert usage.count_method == "reported" and usage.context_tokens == usage.prompt_tokens


async def _stored_context(store, messages: list[Message]) -> str:
    from palimpsest.v1 import session_store_pb2 as store_pb

    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="exact", model="qwen3.6"))).session
    await store.AppendMessages(store_pb.AppendMessagesRequest(session_id=session.id, messages=messages))
    return session.id


async def _uncounted(store, session_id: str, digest: str) -> int:
    from palimpsest.v1 import session_store_pb2 as store_pb

    reply = await store.GetBaseline(store_pb.GetBaselineRequest(session_id=session_id, token_digest=digest))
    return len(reply.context_tokens.uncounted)


async def test_a_stored_context_is_counted_once_then_summed_by_the_store(compressor, compressor_server, store):
    import asyncio

    messages = turn_with_result(LOGS[:20_000])[1:] + [Message(role="assistant", content="The log shows resets.")]
    session_id = await _stored_context(store, messages)
    by_messages = await compressor.EstimateTokens(
        pb.EstimateTokensRequest(model="qwen3.6", messages=messages, window=8192)
    )
    first = await compressor.EstimateTokens(
        pb.EstimateTokensRequest(session_id=session_id, model="qwen3.6", window=8192)
    )
    assert first.method == pb.ESTIMATE_METHOD_EXACT
    digest = (await compressor_server.servicer.tokenizers.counter("qwen3.6")).digest
    await asyncio.gather(*compressor_server.servicer._writes)  # written back off the request's path
    assert await _uncounted(store, session_id, digest) == 0
    again = await compressor.EstimateTokens(
        pb.EstimateTokensRequest(session_id=session_id, model="qwen3.6", window=8192)
    )
    # Content tokens, not totals: the template's fit moves while other tests report on this model.
    content = first.shape.content_tokens
    assert abs(content - by_messages.shape.content_tokens) <= 4  # the stored tool call is re-serialized
    # The stored sum caps the oversized tool result at the view's budget plus a seam: never lower.
    assert 0 <= again.shape.content_tokens - content <= 8
    assert again.shape.messages == 4 and again.shape.tool_results == 1 and again.shape.tool_calls == 1
    incoming = await compressor.EstimateTokens(
        pb.EstimateTokensRequest(
            session_id=session_id, model="qwen3.6", window=8192, incoming=[Message(role="user", content="and now?")]
        )
    )
    assert incoming.shape.messages == 5 and incoming.shape.content_tokens > again.shape.content_tokens


async def test_token_counts_need_their_tokenizer_and_sane_values(store):
    import hashlib

    import grpc
    import pytest

    from palimpsest.v1 import session_store_pb2 as store_pb

    session_id = await _stored_context(store, [Message(role="user", content="hi")])
    for request, field in (
        (
            store_pb.SetTokenCountsRequest(session_id=session_id, counts=[common_pb2.TokenCount(seq=1, tokens=3)]),
            "token_digest",
        ),
        (
            store_pb.SetTokenCountsRequest(
                session_id=session_id, token_digest="d", counts=[common_pb2.TokenCount(seq=1, tokens=-3)]
            ),
            "counts",
        ),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await store.SetTokenCounts(request)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in error.value.details()
    hi = hashlib.md5(b"hi").hexdigest()
    for md5 in ("", "not-a-hash"):
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await store.SetTokenCounts(
                store_pb.SetTokenCountsRequest(
                    session_id=session_id,
                    token_digest="d",
                    counts=[common_pb2.TokenCount(seq=1, tokens=3, content_md5=md5)],
                )
            )
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "content_md5" in error.value.details()
    # A count made from other content than the row's is not kept (no caller can put a count on a
    # row it never read); the row's own content's is.
    wrong = await store.SetTokenCounts(
        store_pb.SetTokenCountsRequest(
            session_id=session_id,
            token_digest="d",
            counts=[common_pb2.TokenCount(seq=1, tokens=1, content_md5=hashlib.md5(b"x").hexdigest())],
        )
    )
    assert wrong.updated == 0
    reply = await store.SetTokenCounts(
        store_pb.SetTokenCountsRequest(
            session_id=session_id, token_digest="d", counts=[common_pb2.TokenCount(seq=1, tokens=3, content_md5=hi)]
        )
    )
    assert reply.updated == 1
    summed = await store.GetBaseline(store_pb.GetBaselineRequest(session_id=session_id, token_digest="d"))
    assert summed.context_tokens.counted_tokens == 3 and not summed.context_tokens.uncounted
    other = await store.GetBaseline(store_pb.GetBaselineRequest(session_id=session_id, token_digest="other"))
    assert other.context_tokens.counted_messages == 0 and len(other.context_tokens.uncounted) == 1


async def test_without_a_vocabulary_a_result_is_still_cut_further_rather_than_the_turn_lost(compressor):
    settings = pb.CompressionSettings(message_token_budget=20_000)  # the view alone would not cut it
    reply = await compressor.CheckContextSize(
        pb.CheckContextSizeRequest(model="tiny", messages=turn_with_result(LOGS), window=8192, settings=settings)
    )
    assert reply.method != pb.ESTIMATE_METHOD_EXACT
    assert reply.decision == pb.SIZE_DECISION_FITS and reply.tokens <= reply.limit
    assert [c.index for c in reply.cuts] == [3]


class BrokenVocabularyOllama(OllamaClient):
    """An Ollama whose model carries a vocabulary that cannot load (a merge of unknown tokens): a
    fault the simulator cannot be made to serve, so only /api/show is replaced."""

    async def show(self, model: str, *, verbose: bool = False) -> dict:
        return {
            "model_info": {
                "tokenizer.ggml.model": "gpt2",
                "tokenizer.ggml.pre": "qwen2",
                "tokenizer.ggml.tokens": ["a", "b"],
                "tokenizer.ggml.merges": ["c d"],
            }
        }


async def test_a_vocabulary_that_does_not_load_falls_back_once(ollama_sim, tmp_path, caplog):
    client = BrokenVocabularyOllama(ollama_sim.url)
    try:
        tokenizers = ModelTokenizers(client, tmp_path)
        assert await tokenizers.counter("qwen3.6") is None
        assert await tokenizers.counter("qwen3.6") is None
    finally:
        await client.aclose()
    warnings = [r for r in caplog.records if "counted by the calibrated estimate" in r.getMessage()]
    assert len(warnings) == 1 and "does not load" in warnings[0].getMessage()


async def test_an_agents_turns_leave_their_messages_counted_in_the_store(agent, store, compressor_server, ollama_sim):
    """A message is counted once, by the first size check that sees it stored; the store then
    sums it for everyone (EstimateTokens, the context meter, another Compressor replica)."""
    import asyncio

    from palimpsest.v1 import session_store_pb2 as store_pb

    ollama_sim.script(Reply(text="first answer"), Reply(text="second answer"))
    first = [e async for e in agent.RunStream(agent_pb2.RunStreamRequest(text="count me once"))]
    session_id = first[0].session_id
    second = [e async for e in agent.RunStream(agent_pb2.RunStreamRequest(session_id=session_id, text="and me"))]
    assert second[-1].stream_end.reason == agent_pb2.STREAM_END_REASON_COMPLETED
    model = [e.model_info.model for e in first if e.HasField("model_info")][0]
    digest = (await compressor_server.servicer.tokenizers.counter(model)).digest

    async def uncounted() -> list[str]:
        reply = await store.GetBaseline(store_pb.GetBaselineRequest(session_id=session_id, token_digest=digest))
        return [m.content for m in reply.context_tokens.uncounted]

    await asyncio.gather(*compressor_server.servicer._writes)  # written off the request's path
    # The first turn's two messages were seen stored by the second turn's size check; the second
    # turn's are counted by the next check that sees them.
    assert await uncounted() == ["and me", "second answer"]


def test_a_dense_result_priced_high_by_learned_rates_is_still_cut_until_it_fits():
    """A model without a vocabulary whose rates learned a script at three tokens a character: two
    results in it are over the limit by more than their size at the view's fixed rate. Cutting them
    re-prices them at the learned rates, so the prompt fits (their saving at chars / 1.8 alone left
    it over, and the turn ended CONTEXT_TOO_LARGE)."""
    from palimpsest.compressor.calibration import Rates
    from palimpsest.compressor.pricing import Pricing
    from palimpsest.compressor.size_check import deepen_cuts

    rates = Rates(overhead=40, per_message=6, rates=(0.25, 0.5, 0.25, 1.0, 3.0, 0.5), margin=0, observed=8)
    pricing = Pricing(line=None, budget=8192 // 6, image_fallback=1024, rates=rates)
    glyphs = "ꙮ" * 2400
    messages = [
        *turn_with_result(glyphs),
        Message(role="assistant", tool_calls=[ToolCall(id="c2", name="read", arguments_json='{"path": "/var/log/b"}')]),
        Message(role="tool", name="read", tool_call_id="c2", content=glyphs),
    ]
    assert pricing.count_view(pricing.view(messages)[0]).tokens > 2 * 6144
    deepened = deepen_cuts(pricing, messages, [], 6144)
    assert deepened is not None
    view, cuts, estimate = deepened
    assert estimate.tokens <= 6144 and sorted(cuts) == [3, 5]
    assert estimate.tokens >= pricing.count_view(view).tokens  # never below a fresh count of what is sent

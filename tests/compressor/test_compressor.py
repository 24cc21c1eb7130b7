"""The Compressor over real servers: the store on PostgreSQL and the Ollama simulator over HTTP."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import replace

import grpc
import pytest

from ollama_sim import Reply
from palimpsest.shared.prose_weight import PRUNED_NOTE
from palimpsest.v1 import common_pb2, compressor_pb2_grpc
from palimpsest.v1 import compressor_pb2 as pb
from palimpsest.v1 import session_store_pb2 as store_pb
from tests.helpers.calls import expect_status, full, shown
from tests.helpers.compressor_calls import (
    MODEL,
    SUMMARY_ONLY,
    WINDOW,
    Message,
    compress,
    filler,
    session_with,
    summary_bodies,
    tool_turns,
    turns,
)


def summary_reply(body) -> Reply:
    """Summaries for every unscripted call: bullet points and the KEYS line."""
    return Reply(
        text="- The user asked about deploys; we used kubectl.\n- Decided on blue-green.\n"
        "KEYS: kubectl, blue-green, deploy.yaml"
    )


@pytest.fixture(autouse=True)
def summaries(ollama_sim):
    ollama_sim.set_responder(summary_reply)
    yield
    ollama_sim.set_responder(None)


# -- estimates and calibration -------------------------------------------------------------------
async def test_without_observations_the_estimate_is_chars_over_1_8(compressor):
    model = f"fresh-{uuid.uuid4().hex[:6]}"
    reply = await compressor.EstimateTokens(
        pb.EstimateTokensRequest(model=model, messages=[Message(role="user", content="x" * 900)], window=WINDOW)
    )
    assert reply.method == pb.ESTIMATE_METHOD_FALLBACK
    assert reply.tokens == -(-reply.chars // 1.8)


async def test_recorded_baselines_calibrate_the_next_estimate(compressor):
    model = f"cal-{uuid.uuid4().hex[:6]}"
    for chars, tokens in [(4000, 1100), (8000, 2100)]:
        r = await compressor.RecordBaseline(
            pb.RecordBaselineRequest(model=model, prompt_eval_count=tokens, sent_tokens=tokens, sent_chars=chars)
        )
        assert r.recorded and not r.truncated
    reply = await compressor.EstimateTokens(
        pb.EstimateTokensRequest(model=model, messages=[Message(role="user", content="y" * 5991)], window=100_000)
    )
    assert reply.method == pb.ESTIMATE_METHOD_CALIBRATED
    assert abs(reply.tokens - 1600) <= 5  # on the line through (4000, 1100) and (8000, 2100)


async def test_prompts_with_images_do_not_calibrate(compressor):
    model = f"img-{uuid.uuid4().hex[:6]}"
    for chars, tokens in [(4000, 5100), (8000, 6100)]:
        await compressor.RecordBaseline(
            pb.RecordBaselineRequest(
                model=model, prompt_eval_count=tokens, sent_tokens=tokens, sent_chars=chars, had_images=True
            )
        )
    reply = await compressor.EstimateTokens(
        pb.EstimateTokensRequest(model=model, messages=[Message(role="user", content="z" * 900)])
    )
    assert reply.method == pb.ESTIMATE_METHOD_FALLBACK


def exact_shape(content_tokens: int, messages: int = 3) -> common_pb2.PromptShape:
    return common_pb2.PromptShape(content_tokens=content_tokens, messages=messages)


@pytest.mark.parametrize("reported, truncated", [(979, True), (980, False), (1100, False)])
async def test_a_report_below_the_exact_content_count_is_a_cut_prompt(compressor, store, profile, reported, truncated):
    session_id = await session_with(store, profile, turns(1))
    await compressor.RecordBaseline(
        pb.RecordBaselineRequest(
            session_id=session_id,
            model=MODEL,
            prompt_eval_count=900,
            sent_tokens=900,
            through_seq=2,
            window=WINDOW,
            method=pb.ESTIMATE_METHOD_EXACT,
            shape=exact_shape(850),
        )
    )
    reply = await compressor.RecordBaseline(
        pb.RecordBaselineRequest(
            session_id=session_id,
            model=MODEL,
            prompt_eval_count=reported,
            sent_tokens=1040,
            through_seq=2,
            window=WINDOW,
            method=pb.ESTIMATE_METHOD_EXACT,
            shape=exact_shape(1000),
        )
    )
    assert reply.truncated is truncated and reply.recorded is not truncated
    baseline = (await store.GetBaseline(store_pb.GetBaselineRequest(session_id=session_id))).baseline
    assert baseline.tokens == (900 if truncated else reported)  # the honest baseline survives
    assert baseline.context_truncated is truncated


@pytest.mark.parametrize(
    "change, field",
    [
        ({"window": 0}, "window"),
        ({"prompt_eval_count": 9000}, "prompt_eval_count"),
        ({"shape": common_pb2.PromptShape(content_tokens=800, messages=-1)}, "shape"),
    ],
)
async def test_a_bad_exact_report_is_refused_and_changes_nothing(compressor, store, profile, change, field):
    session_id = await session_with(store, profile, turns(1))
    request = pb.RecordBaselineRequest(
        session_id=session_id,
        model=MODEL,
        prompt_eval_count=900,
        sent_tokens=900,
        through_seq=2,
        window=8192,
        method=pb.ESTIMATE_METHOD_EXACT,
        shape=exact_shape(850),
    )
    for name, value in change.items():
        if name == "shape":
            request.shape.CopyFrom(value)
        else:
            setattr(request, name, value)
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await compressor.RecordBaseline(request)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in error.value.details()
    assert not (await store.GetBaseline(store_pb.GetBaselineRequest(session_id=session_id))).HasField("baseline")


async def test_an_estimate_never_raises_the_cut_alarm(compressor, store, profile):
    """Only an exact count proves a cut: a calibrated estimate 60% too high once flagged an honest
    3,770-token prompt as cut and forced a needless compression."""
    session_id = await session_with(store, profile, turns(1))
    reply = await compressor.RecordBaseline(
        pb.RecordBaselineRequest(
            session_id=session_id,
            model=MODEL,
            prompt_eval_count=3770,
            sent_tokens=6134,
            through_seq=2,
            window=8192,
            method=pb.ESTIMATE_METHOD_CALIBRATED,
        )
    )
    assert reply.truncated is False and reply.recorded is True
    baseline = (await store.GetBaseline(store_pb.GetBaselineRequest(session_id=session_id))).baseline
    assert baseline.context_truncated is False


async def test_session_estimates_use_the_baseline_plus_the_delta(compressor, store, profile):
    session_id = await session_with(store, profile, turns(2))
    model = f"delta-{uuid.uuid4().hex[:6]}"  # no calibration line: other tests calibrate qwen3.6
    await compressor.RecordBaseline(
        pb.RecordBaselineRequest(
            session_id=session_id, model=model, prompt_eval_count=3000, sent_tokens=3000, through_seq=4
        )
    )
    await store.AppendMessages(
        store_pb.AppendMessagesRequest(session_id=session_id, messages=[Message(role="user", content="a" * 180)])
    )
    reply = await compressor.EstimateTokens(
        pb.EstimateTokensRequest(
            session_id=session_id, model=model, window=WINDOW, incoming=[Message(role="user", content="b" * 180)]
        )
    )
    assert reply.method == pb.ESTIMATE_METHOD_BASELINE_DELTA
    assert reply.baseline_tokens == 3000 and 150 < reply.delta_tokens < 300


async def test_the_memory_message_is_paid_in_the_baseline_like_the_system_prompt(compressor, store, profile):
    """The prompt a baseline measured began with the system prompt and the memory message (neither
    stored, both unchanged until a compression drops the baseline): the delta counts neither again."""
    session_id = await session_with(store, profile, turns(2))
    model = f"delta-{uuid.uuid4().hex[:6]}"  # no calibration line: other tests calibrate qwen3.6
    await compressor.RecordBaseline(
        pb.RecordBaselineRequest(
            session_id=session_id, model=model, prompt_eval_count=3000, sent_tokens=3000, through_seq=4
        )
    )
    context = list(
        (
            await store.GetSession(
                store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_CONTEXT)
            )
        ).session.context
    )
    system = Message(role="system", content="You are Palimpsest.")
    memory = Message(role="system", content="## What I remember about the user\n- " + "Prefers tea. " * 40)
    incoming = Message(role="user", content="b" * 180)

    async def tokens(*head: Message) -> int:
        reply = await compressor.CheckContextSize(
            pb.CheckContextSizeRequest(
                session_id=session_id, model=model, window=WINDOW, messages=[*head, *context, incoming]
            )
        )
        assert reply.method == pb.ESTIMATE_METHOD_BASELINE_DELTA
        return reply.tokens

    assert await tokens(system, memory) == await tokens(system) > 3000


async def test_estimates_count_the_truncated_view_not_a_megabyte(compressor):
    huge = Message(role="tool", name="read_log", content="log line\n" * 120_000)
    reply = await compressor.EstimateTokens(pb.EstimateTokensRequest(model="m", messages=[huge], window=WINDOW))
    assert reply.tokens <= WINDOW // 6 + 50


@pytest.mark.parametrize("window, limit", [(4096, 4096 - 1024), (100_000, 100_000 - 2048)])
async def test_output_reserve_is_capped_at_a_quarter_of_the_window(compressor, window, limit):
    reply = await compressor.CheckContextSize(
        pb.CheckContextSizeRequest(model="m", window=window, messages=[Message(role="user", content="hello")])
    )
    assert reply.fits and reply.limit == limit
    big = await compressor.CheckContextSize(
        pb.CheckContextSizeRequest(
            model="m", window=window, messages=[Message(role="user", content="w " * int(limit * 1.9))]
        )
    )
    assert not big.fits and big.tokens > limit


async def test_bad_estimate_input_is_invalid(compressor):
    await expect_status(
        compressor.EstimateTokens(pb.EstimateTokensRequest(window=-1)), grpc.StatusCode.INVALID_ARGUMENT, "window"
    )
    await expect_status(
        compressor.CheckContextSize(pb.CheckContextSizeRequest(model="m")), grpc.StatusCode.INVALID_ARGUMENT, "messages"
    )
    await expect_status(
        compressor.RecordBaseline(pb.RecordBaselineRequest(model="m")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "prompt_eval_count",
    )
    await expect_status(
        compressor.EstimateTokens(pb.EstimateTokensRequest(session_id=str(uuid.uuid4()))), grpc.StatusCode.NOT_FOUND
    )


# -- compression --------------------------------------------------------------------------------
async def test_a_short_context_would_not_compress_and_compress_says_so(compressor, store, profile):
    session_id = await session_with(store, profile, turns(2, 100))
    dry = await compressor.WouldCompress(pb.WouldCompressRequest(session_id=session_id, model=MODEL, window=WINDOW))
    assert not dry.would_compress
    await expect_status(compress(compressor, session_id), grpc.StatusCode.FAILED_PRECONDITION, "nothing to compress")


async def test_compress_summarizes_old_turns_and_leaves_the_display_alone(compressor, store, profile, ollama_sim):
    session_id = await session_with(store, profile, turns(12))
    before = await full(store, session_id)
    dry = await compressor.WouldCompress(
        pb.WouldCompressRequest(session_id=session_id, model=MODEL, window=WINDOW, settings=SUMMARY_ONLY)
    )
    assert dry.would_compress and dry.messages_after < dry.messages_before
    events = await compress(compressor, session_id, settings=SUMMARY_ONLY)
    assert [e.WhichOneof("event") for e in events] == ["started", "compressed"]
    done = events[1].compressed
    assert done.method == pb.COMPRESSION_METHOD_SUMMARY and "blue-green" in done.summary
    assert "kubectl" in done.breadcrumbs and done.messages_after == dry.messages_after
    assert done.context_tokens <= 0.65 * WINDOW
    after = await full(store, session_id)
    summaries = [m for m in after.context if m.is_summary]
    assert len(summaries) == 1 and after.context[0].is_summary and "KEYS" not in summaries[0].content
    assert summaries[0].replaces.first == 1
    assert [shown(m) for m in after.messages[:-1]] == [shown(m) for m in before.messages]
    assert after.messages[-1].is_compression
    assert after.context_token_count == done.context_tokens
    # The summary call asked for no thinking and carried the configured temperature and cap.
    body = [b for b in ollama_sim.bodies() if b.get("stream") is False][-1]
    assert body["think"] is False and body["options"]["temperature"] == 0.3
    # In the conversation's window, with the summary's cap lowered to what is left of it.
    assert body["options"]["num_ctx"] == WINDOW and 0 < body["options"]["num_predict"] <= 6000
    assert ollama_sim.chats[-1].prompt_tokens + body["options"]["num_predict"] <= WINDOW
    # Every dropped message can be found again in the raw-history index.
    found = await store.SearchMemory(store_pb.SearchMemoryRequest(session_id=session_id, query="service-0 question 0"))
    assert any("question 0" in c.content for c in found.chunks)


async def test_memory_search_off_compresses_without_indexing_what_it_drops(compressor, store, profile):
    from palimpsest.agent.profiles import Profile

    session_id = await session_with(store, profile, turns(12))
    off = Profile(compression_overrides=(("index_memory", False),)).compression_settings()
    assert off.HasField("index_memory") and not Profile().compression_settings().HasField("index_memory")
    events = await compress(compressor, session_id, settings=off)
    assert events[-1].compressed.messages_after < events[-1].compressed.messages_before
    found = await store.SearchMemory(store_pb.SearchMemoryRequest(session_id=session_id, query="service-0 question 0"))
    assert list(found.chunks) == []  # compressed, and nothing indexed
    # The display history still holds every message.
    assert any("question 0" in m.content for m in (await full(store, session_id)).messages)


async def test_old_summaries_over_the_threshold_are_merged_by_a_meta_call_first(compressor, store, profile, ollama_sim):
    from palimpsest.compressor.summary_format import META_SUMMARY_PROMPT, META_SUMMARY_THRESHOLD

    def old_summary(n: int) -> Message:
        text = f"[Summary {n}] OLD-SUMMARY-{n} " + f"decision {n}: keep the cache at /srv/cache{n}. " * 130
        return Message(
            role="user", content=text, is_summary=True, explicit_flags=True, is_context=True, is_display=False
        )

    olds = [old_summary(1), old_summary(2)]
    assert sum(len(m.content) for m in olds) > META_SUMMARY_THRESHOLD
    session_id = await session_with(store, profile, [*olds, *turns(12)])
    since = len(ollama_sim.bodies())
    ollama_sim.script(
        Reply(text="- MERGED-HISTORY: caches at /srv/cache1 and /srv/cache2.\nKEYS: cache"),
        Reply(text="- NEW-SUMMARY of it all.\nKEYS: cache, deploy"),
    )
    events = await compress(compressor, session_id, window=SMALL_WINDOW)
    assert events[-1].compressed.method == pb.COMPRESSION_METHOD_SUMMARY

    meta, final = summary_bodies(ollama_sim, since)  # two calls: the merge, then the summary
    meta_text = " ".join(m["content"] for m in meta["messages"])
    assert META_SUMMARY_PROMPT.split(".")[0] in meta_text and "OLD-SUMMARY-1" in meta_text
    assert "OLD-SUMMARY-2" in meta_text and "question 0" not in meta_text  # the summaries alone
    final_text = " ".join(m["content"] for m in final["messages"])
    # The summary is written from the merged text, not the old summaries, beside the new history.
    assert "MERGED-HISTORY" in final_text and "OLD-SUMMARY" not in final_text and "question 0" in final_text
    stored = [m for m in (await full(store, session_id)).context if m.is_summary]
    assert len(stored) == 1 and stored[0].content.endswith("\n- NEW-SUMMARY of it all.")


async def test_summarizer_failing_twice_hard_truncates_and_the_session_survives(compressor, store, profile, ollama_sim):
    session_id = await session_with(store, profile, turns(12))
    ollama_sim.script(Reply(http_status=500, error="boom"), Reply(http_status=500, error="boom again"))
    events = await compress(compressor, session_id, reason=pb.COMPRESSION_REASON_MIDTURN, settings=SUMMARY_ONLY)
    done = events[-1].compressed
    assert done.method == pb.COMPRESSION_METHOD_HARD_TRUNCATE and done.summary == ""
    assert done.context_tokens < 0.5 * WINDOW
    after = await full(store, session_id)
    assert not any(m.is_summary for m in after.context)
    assert after.context[-1].content == after.messages[-2].content  # the newest turn is kept
    assert len(after.messages) == 25


async def test_a_summarizer_retry_keeps_more_verbatim_and_summarizes_less(compressor, store, profile, ollama_sim):
    """The retry after a failed summary call does not ask the same again: the newer half of what was
    to be summarized stays verbatim, so the second call is smaller and the summary replaces less."""
    session_id = await session_with(store, profile, turns(12))
    ollama_sim.script(Reply(http_status=500, error="boom"))
    done = (await compress(compressor, session_id, reason=pb.COMPRESSION_REASON_MIDTURN, settings=SUMMARY_ONLY))[
        -1
    ].compressed
    first, retry = [json.dumps(b["messages"]) for b in ollama_sim.bodies() if b.get("stream") is False][-2:]
    asked = [len(re.findall(r"question \d+:", body)) for body in (first, retry)]
    assert asked[0] >= 4 and asked[1] == (asked[0] + 1) // 2, asked  # the older half of the turns
    assert done.method == pb.COMPRESSION_METHOD_SUMMARY
    after = await full(store, session_id)
    summary = next(m for m in after.context if m.is_summary)
    kept_turns = [m for m in after.context if m.role == "user" and not m.is_summary]
    assert summary.replaces.first == 1 and summary.replaces.last == kept_turns[0].seq - 1
    assert len(kept_turns) == 12 - asked[1]


async def test_fifty_compressions_leave_at_most_one_live_summary(compressor, store, profile):
    session_id = await session_with(store, profile, turns(6))
    for round_ in range(50):
        await store.AppendMessages(store_pb.AppendMessagesRequest(session_id=session_id, messages=turns(3)))
        await compress(compressor, session_id)
        context = (
            await store.GetSession(
                store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_CONTEXT)
            )
        ).session.context
        assert sum(1 for m in context if m.is_summary) <= 1, f"round {round_}"
    display = await full(store, session_id)
    assert len([m for m in display.messages if not m.is_compression]) == 12 + 50 * 6


async def test_post_turn_under_threshold_does_nothing_unless_the_prompt_was_truncated(compressor, store, profile):
    session_id = await session_with(store, profile, turns(6))
    quiet = await compress(
        compressor, session_id, reason=pb.COMPRESSION_REASON_POSTTURN, only_if_over_threshold=True, current_tokens=100
    )
    assert quiet == []
    await compressor.RecordBaseline(
        pb.RecordBaselineRequest(
            session_id=session_id,
            model=MODEL,
            prompt_eval_count=2050,
            sent_tokens=6000,
            through_seq=12,
            window=8192,
            method=pb.ESTIMATE_METHOD_EXACT,
            shape=exact_shape(5800, 13),
        )
    )
    forced = await compress(
        compressor,
        session_id,
        reason=pb.COMPRESSION_REASON_POSTTURN,
        only_if_over_threshold=True,
        current_tokens=2050,
        settings=SUMMARY_ONLY,
    )
    assert forced and forced[-1].compressed.messages_after < 12


async def test_tool_groups_stay_whole_across_compression(compressor, store, profile):
    messages = []
    for i in range(8):
        messages += [
            Message(role="user", content=f"task {i} " + filler(i, 200)),
            Message(
                role="assistant",
                tool_calls=[
                    common_pb2.ToolCall(
                        id=f"c{i}", name="read_file", arguments_json=json.dumps({"path": f"/srv/app{i}.py"})
                    )
                ],
            ),
            Message(role="tool", name="read_file", tool_call_id=f"c{i}", content=filler(i, 900)),
            Message(role="assistant", content=f"done {i}"),
        ]
    session_id = await session_with(store, profile, messages)
    await compress(compressor, session_id)
    context = (
        await store.GetSession(store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_CONTEXT))
    ).session.context
    calls = {c.id for m in context for c in m.tool_calls}
    assert all(m.tool_call_id in calls for m in context if m.role == "tool")


async def test_compress_checks_its_input(compressor, store, profile):
    session_id = await session_with(store, profile, turns(1))
    await expect_status(
        compress(compressor, session_id, reason=pb.COMPRESSION_REASON_UNSPECIFIED),
        grpc.StatusCode.INVALID_ARGUMENT,
        "reason",
    )
    await expect_status(
        compress(compressor, "", reason=pb.COMPRESSION_REASON_FORCED), grpc.StatusCode.INVALID_ARGUMENT, "session_id"
    )
    await expect_status(compress(compressor, str(uuid.uuid4())), grpc.StatusCode.NOT_FOUND)
    for reason, tokens in [(pb.COMPRESSION_REASON_TURN_END, -1), (pb.COMPRESSION_REASON_MIDTURN, 5_000)]:
        await expect_status(
            compress(compressor, session_id, reason=reason, next_prompt_tokens=tokens),
            grpc.StatusCode.INVALID_ARGUMENT,
            "next_prompt_tokens",
        )


# -- replicas -----------------------------------------------------------------------------------
async def test_an_observation_through_one_replica_prices_the_next_estimate_on_another(
    base_settings, store_server, ollama_sim
):
    from palimpsest.compressor.app import start_compressor
    from palimpsest.shared.channels import open_channel

    settings = replace(base_settings, ollama_host=ollama_sim.url, store_addr=store_server.address)
    replicas = [await start_compressor(settings, port=0) for _ in range(2)]
    try:
        channel = open_channel(",".join(r.address for r in replicas), settings)
        stub = compressor_pb2_grpc.CompressorStub(channel)
        model = f"replica-{uuid.uuid4().hex[:6]}"
        await stub.RecordBaseline(
            pb.RecordBaselineRequest(model=model, prompt_eval_count=1100, sent_tokens=1100, sent_chars=4000)
        )
        await stub.RecordBaseline(
            pb.RecordBaselineRequest(model=model, prompt_eval_count=2100, sent_tokens=2100, sent_chars=8000)
        )
        # Directly: recorded through the first replica, priced by the second at its very next estimate.
        async with (
            grpc.aio.insecure_channel(replicas[0].address) as a,
            grpc.aio.insecure_channel(replicas[1].address) as b,
        ):
            other = f"{model}-direct"
            for chars, tokens in [(4000, 1100), (8000, 2100)]:
                await compressor_pb2_grpc.CompressorStub(a).RecordBaseline(
                    pb.RecordBaselineRequest(
                        model=other, prompt_eval_count=tokens, sent_tokens=tokens, sent_chars=chars
                    )
                )
            reply = await compressor_pb2_grpc.CompressorStub(b).EstimateTokens(
                pb.EstimateTokensRequest(
                    model=other, messages=[Message(role="user", content="q" * 5991)], window=100_000
                )
            )
            assert reply.method == pb.ESTIMATE_METHOD_CALIBRATED and abs(reply.tokens - 1600) <= 5
        # Round-robin: consecutive calls land on both replicas; each must see the same line.
        for _ in range(4):
            reply = await stub.EstimateTokens(
                pb.EstimateTokensRequest(
                    model=model, messages=[Message(role="user", content="q" * 5991)], window=100_000
                )
            )
            assert reply.method == pb.ESTIMATE_METHOD_CALIBRATED and abs(reply.tokens - 1600) <= 5
        await channel.close()
    finally:
        for r in replicas:
            await r.stop(0)


async def test_a_report_of_half_the_window_is_never_learned(compressor, store, profile):
    session_id = await session_with(store, profile, turns(1))
    model = f"half-{uuid.uuid4().hex[:6]}"
    await compressor.RecordBaseline(
        pb.RecordBaselineRequest(
            session_id=session_id, model=model, prompt_eval_count=900, sent_tokens=900, through_seq=2, window=8192
        )
    )
    # 4,098 of an 8,192 window, though our estimate (4,000) was too low to prove a cut.
    reply = await compressor.RecordBaseline(
        pb.RecordBaselineRequest(
            session_id=session_id,
            model=model,
            prompt_eval_count=4098,
            sent_tokens=4000,
            sent_chars=16000,
            through_seq=2,
            window=8192,
        )
    )
    assert not reply.recorded
    assert (await store.GetBaseline(store_pb.GetBaselineRequest(session_id=session_id))).baseline.tokens == 900
    assert not (await store.ListObservations(store_pb.ListObservationsRequest(model=model))).observations


# -- the summary's num_ctx ----------------------------------------------------------------------
SMALL_WINDOW = 8192


async def test_every_summary_of_a_session_goes_out_with_the_conversations_num_ctx(
    compressor, store, profile, ollama_sim
):
    """Another num_ctx than the chat calls' makes Ollama reload the model before every summary."""
    session_id = await session_with(store, profile, turns(6))
    since = len(ollama_sim.bodies())
    # Sizes vary from round to round, so the summary inputs do too (the old code sized num_ctx
    # to each input and sent a different value almost every time).
    for size in (300, 2400, 900, 4000, 1500, 3200, 600, 5000, 1200, 2800, 4500, 2000):
        await store.AppendMessages(store_pb.AppendMessagesRequest(session_id=session_id, messages=turns(4, size)))
        events = await compress(compressor, session_id, window=SMALL_WINDOW, settings=SUMMARY_ONLY)
        assert events[-1].compressed.method == pb.COMPRESSION_METHOD_SUMMARY
    sent = [b["options"]["num_ctx"] for b in summary_bodies(ollama_sim, since)]
    assert len(sent) >= 12
    assert set(sent) == {SMALL_WINDOW}, f"{len(set(sent))} distinct num_ctx values: {sorted(set(sent))}"
    sent_fits = [
        (c.prompt_tokens, b["options"]["num_predict"])
        for c, b in zip(ollama_sim.chats[-len(sent) :], summary_bodies(ollama_sim, since))
    ]
    assert all(prompt + predict <= SMALL_WINDOW for prompt, predict in sent_fits), sent_fits


@pytest.mark.parametrize("configured, sent", [(16_384, 16_384), (65_536, 32_768)])
async def test_a_summarizer_model_uses_its_own_window_capped_at_its_context_length(
    compressor, store, profile, ollama_sim, configured, sent
):
    # The simulator's "summarizer" model is trained on 32,768 tokens.
    session_id = await session_with(store, profile, turns(12, 1500))
    since = len(ollama_sim.bodies())
    settings = pb.CompressionSettings(summarizer_model="summarizer", summarizer_window=configured)
    events = await compress(compressor, session_id, window=SMALL_WINDOW, settings=settings)
    assert events[-1].compressed.method == pb.COMPRESSION_METHOD_SUMMARY
    [body] = summary_bodies(ollama_sim, since)
    assert body["model"] == "summarizer" and body["options"]["num_ctx"] == sent
    assert ollama_sim.chats[-1].prompt_tokens + body["options"]["num_predict"] <= sent


async def test_a_summarizer_model_without_a_window_of_its_own_uses_the_service_setting(
    base_settings, store_server, ollama_sim, store, profile
):
    from palimpsest.compressor.app import start_compressor

    settings = replace(
        base_settings, ollama_host=ollama_sim.url, store_addr=store_server.address, compression_summarizer_window=12_288
    )
    running = await start_compressor(settings, port=0)
    try:
        async with grpc.aio.insecure_channel(running.address) as channel:
            stub = compressor_pb2_grpc.CompressorStub(channel)
            session_id = await session_with(store, profile, turns(12, 1500))
            since = len(ollama_sim.bodies())
            await compress(
                stub, session_id, window=SMALL_WINDOW, settings=pb.CompressionSettings(summarizer_model="summarizer")
            )
            # The session's own model is unaffected: its summaries keep the conversation's window.
            await store.AppendMessages(store_pb.AppendMessagesRequest(session_id=session_id, messages=turns(8, 1500)))
            await compress(stub, session_id, window=SMALL_WINDOW)
    finally:
        await running.stop(0)
    assert [(b["model"], b["options"]["num_ctx"]) for b in summary_bodies(ollama_sim, since)] == [
        ("summarizer", 12_288),
        (MODEL, SMALL_WINDOW),
    ]


async def test_a_negative_summarizer_window_is_invalid(compressor, store, profile):
    session_id = await session_with(store, profile, turns(12))
    await expect_status(
        compress(compressor, session_id, settings=pb.CompressionSettings(summarizer_window=-1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "summarizer_window",
    )


async def calibrate_on_real_counts(compressor, model: str) -> None:
    """Eight observations of the simulator's real counts, so the model's line prices this text closely
    (the newest eight make the whole line: earlier runs' observations no longer count)."""
    from ollama_sim.prompt import count_prompt_tokens
    from palimpsest.shared.context_view import to_ollama_messages, view_chars

    for n in range(1, 9):
        sent = turns(n, 1500)
        await compressor.RecordBaseline(
            pb.RecordBaselineRequest(
                model=model,
                prompt_eval_count=count_prompt_tokens(to_ollama_messages(sent)),
                sent_tokens=0,
                sent_chars=view_chars(sent),
            )
        )


# "qwen3.6:latest" is the simulator's qwen3.6 under a name of its own: its calibration is this test's.
@pytest.mark.parametrize("model, calibrated", [(MODEL, False), ("qwen3.6:latest", True)])
async def test_an_input_far_larger_than_the_window_is_cut_to_fit_it_with_the_prompt_whole(
    compressor, store, profile, ollama_sim, model, calibrated
):
    """Past num_ctx Ollama drops the head of the prompt, the summary instructions first, and says nothing.
    Calibrated, the estimate is close to the real count and the fit is tight; else it is chars / 1.8."""
    if calibrated:
        await calibrate_on_real_counts(compressor, model)
    messages = []
    for i in range(30):
        messages += [
            Message(role="user", content=f"question {i}: " + filler(i, 3000)),
            Message(role="assistant", content=filler(i, 6000)),
            Message(role="tool", name="read_config", content=filler(i, 5000)),
        ]
    session_id = await session_with(store, profile, messages)
    since, chats = len(ollama_sim.bodies()), len(ollama_sim.chats)
    settings = pb.CompressionSettings(critical_tools=["read_config"])
    events = await compress(compressor, session_id, window=SMALL_WINDOW, settings=settings, model=model)
    done = events[-1].compressed
    assert done.method == pb.COMPRESSION_METHOD_SUMMARY
    [body] = summary_bodies(ollama_sim, since)
    [record] = ollama_sim.chats[chats:]
    options = body["options"]
    assert options["num_ctx"] == record.num_ctx == SMALL_WINDOW and not record.truncated
    assert record.prompt_tokens + options["num_predict"] <= SMALL_WINDOW
    # A quarter of the window stays the summary's; it is asked for a length that follows what it
    # condenses (an eighth of it, within an eighth of the window), and num_predict follows that.
    assert record.prompt_tokens <= SMALL_WINDOW * 3 // 4
    assert SMALL_WINDOW // 32 <= options["num_predict"] <= 2 * SMALL_WINDOW // 8
    assert "at most" in body["messages"][-1]["content"]
    if calibrated:  # tight, not wasteful: the input takes most of what the summary leaves
        assert record.prompt_tokens >= 0.65 * SMALL_WINDOW
    system, user = body["messages"]
    assert system["content"].startswith("You condense an earlier part of a conversation")
    # The cut is said where it was made; the oldest and the newest summarized work both survive.
    assert "chars omitted" in user["content"]
    [newest] = [m for m in (await full(store, session_id)).messages if m.seq == done.replaced.last]
    assert "question 0:" in user["content"] and newest.content[-200:] in user["content"]


async def test_old_tool_results_are_pruned_before_any_summary(compressor, store, profile, ollama_sim):
    messages = tool_turns(6)
    session_id = await session_with(store, profile, messages)
    asked = len(ollama_sim.bodies())
    events = await compress(
        compressor, session_id, reason=pb.COMPRESSION_REASON_PRETURN, window=8192, current_tokens=6_500
    )
    done = events[-1].compressed
    assert done.method == pb.COMPRESSION_METHOD_PRUNE and done.context_tokens < 6_144
    assert not summary_bodies(ollama_sim, asked)  # no LLM call
    context = (
        await store.GetSession(store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_CONTEXT))
    ).session.context
    results = [m for m in context if m.role == "tool"]
    # The newest turns stay verbatim; older results are previews standing where they stood.
    assert [len(m.content) < 1_000 for m in results][:2] == [True, True] and len(results[-1].content) > 2_000
    for i, message in enumerate(context):
        if message.role == "tool":
            assert context[i - 1].tool_calls[0].id == message.tool_call_id  # still right after its call
    pruned = [m for m in results if PRUNED_NOTE in m.content]
    assert pruned and all("memory_search" in m.content for m in pruned)
    # The display history keeps every byte; memory search finds a pruned result's words.
    display = await full(store, session_id)
    assert [m.content for m in display.messages if m.role == "tool" and not m.is_compression] == [
        m.content for m in messages if m.role == "tool"
    ]
    marker = [m for m in display.messages if m.is_compression][-1]
    assert marker.metadata["method"] == "prune"
    found = await store.SearchMemory(store_pb.SearchMemoryRequest(session_id=session_id, query="0x00000007"))
    assert found.chunks


async def test_a_forced_compaction_summarizes_even_when_pruning_would_do(compressor, store, profile, ollama_sim):
    session_id = await session_with(store, profile, tool_turns(6))
    events = await compress(compressor, session_id, window=8192, current_tokens=6_500)
    assert events[-1].compressed.method == pb.COMPRESSION_METHOD_SUMMARY


async def test_pruning_is_a_setting_a_profile_can_turn_off(compressor, store, profile, ollama_sim):
    session_id = await session_with(store, profile, tool_turns(6))
    events = await compress(
        compressor,
        session_id,
        reason=pb.COMPRESSION_REASON_PRETURN,
        window=8192,
        current_tokens=6_500,
        settings=pb.CompressionSettings(prune_tool_results=False),
    )
    assert events[-1].compressed.method == pb.COMPRESSION_METHOD_SUMMARY


def test_critical_results_previews_and_kept_turns_are_never_pruned():
    from palimpsest.compressor.pruning import plan_pruning, preview

    messages = tool_turns(3) + tool_turns(1, name="run_tests")
    for seq, m in enumerate(messages, start=1):
        m.seq = seq
    old_preview = preview(messages[2])
    old_preview.seq = 99
    kept = messages[-4:]
    pruning = plan_pruning([*messages, old_preview], kept, critical_tools=["run_tests"])
    assert [m.seq for m in pruning.pruned] == [3, 7, 11]  # the three read_log results before the kept turn
    pruning = plan_pruning([*messages, old_preview], messages[4:], critical_tools=["read_log"])
    assert pruning.pruned == []  # critical: whole; a preview is never pruned again


async def test_a_replacement_must_stand_for_a_demoted_row(store, profile):
    session_id = await session_with(store, profile, tool_turns(2))
    stray = Message(role="tool", content="preview", replaces=common_pb2.SeqRange(first=3, last=3))
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await store.CommitCompression(
            store_pb.CommitCompressionRequest(session_id=session_id, demote_seqs=[7], replacements=[stray])
        )
    assert (
        error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "replacements[0].replaces" in error.value.details()
    )
    assert len((await full(store, session_id)).messages) == 8  # nothing changed


# -- what a compression frees and where it ends ---------------------------------------------------
def small_then_large(n_large: int = 4) -> list[Message]:
    """Two one-line turns, then turns the plan keeps: summarizing frees a few dozen tokens."""
    return [
        Message(role="user", content="hi"),
        Message(role="assistant", content="hello"),
        Message(role="user", content="ok"),
        Message(role="assistant", content="sure"),
        *turns(n_large),
    ]


async def test_a_compression_that_would_free_less_than_the_minimum_is_not_run(compressor, store, profile, ollama_sim):
    """An LLM call that frees a few dozen tokens buys a turn at most: refused, nothing written."""
    session_id = await session_with(store, profile, small_then_large())
    before = (await store.GetSession(store_pb.GetSessionRequest(session_id=session_id))).session.revision
    asked = len(ollama_sim.bodies())
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await compress(compressor, session_id, reason=pb.COMPRESSION_REASON_PRETURN, settings=SUMMARY_ONLY)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "less than the minimum" in refused.value.details() and "min_freed" in refused.value.details()
    assert (await store.GetSession(store_pb.GetSessionRequest(session_id=session_id))).session.revision == before
    assert not summary_bodies(ollama_sim, asked)
    dry = await compressor.WouldCompress(
        pb.WouldCompressRequest(session_id=session_id, model=MODEL, window=WINDOW, settings=SUMMARY_ONLY)
    )
    assert not dry.would_compress  # the dry run says what the compression would do
    # The minimum is a setting (0: off); a forced compaction only needs to free something.
    off = await compress(
        compressor,
        session_id,
        reason=pb.COMPRESSION_REASON_PRETURN,
        settings=pb.CompressionSettings(min_freed=0, prune_tool_results=False),
    )
    assert off[-1].compressed.messages_after < off[-1].compressed.messages_before
    session_id = await session_with(store, profile, small_then_large())
    forced = await compress(compressor, session_id)
    assert forced[-1].compressed.method == pb.COMPRESSION_METHOD_SUMMARY


async def test_min_freed_is_a_share_of_the_window(compressor, store, profile):
    session_id = await session_with(store, profile, turns(6))
    for bad in (-0.1, 1.0, float("nan")):
        await expect_status(
            compress(compressor, session_id, settings=pb.CompressionSettings(min_freed=bad)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "settings.min_freed",
        )


async def test_a_compression_says_what_it_freed_against_its_target(compressor, store, profile, ollama_sim):
    session_id = await session_with(store, profile, turns(12))
    done = (await compress(compressor, session_id, current_tokens=3_500))[-1].compressed
    assert done.tokens_before == 3_500 and done.tokens_after < done.tokens_before
    assert 0 < done.tokens_after <= done.target_tokens and not done.shortfall
    # What the prompt carries besides the stored context is counted on both sides.
    assert done.tokens_after > done.context_tokens
    marker = [m for m in (await full(store, session_id)).messages if m.is_compression][-1]
    assert marker.metadata["tokens_before"] == 3_500 and marker.metadata["tokens_after"] == done.tokens_after
    assert marker.metadata["target_tokens"] == done.target_tokens and "shortfall" not in marker.metadata


async def test_a_compression_that_cannot_reach_its_target_says_why(compressor, store, profile, ollama_sim):
    """The newest turn alone is above the target: what could go went, and the event says what is left."""
    huge = Message(role="user", content="please review: " + filler(99, 9_000))  # a user's words are never cut
    session_id = await session_with(store, profile, [*turns(4), huge])
    done = (await compress(compressor, session_id, current_tokens=3_000))[-1].compressed
    assert done.tokens_after > done.target_tokens
    assert "above the target" in done.shortfall and "kept verbatim" in done.shortfall
    marker = [m for m in (await full(store, session_id)).messages if m.is_compression][-1]
    assert marker.metadata["shortfall"] == done.shortfall


async def test_a_compress_after_the_size_checks_dry_run_reads_and_plans_the_context_once(
    compressor, store, profile, ollama_sim, monkeypatch
):
    """The size check's dry run reads the whole context and plans; the Compress the Agent sends
    next, naming that same revision, uses the same read and the same plan instead of making them again."""
    from palimpsest.compressor import pipeline
    from palimpsest.shared import server as shared_server

    # A model of this test alone: a report another test's turn records for the shared one between the
    # check and the Compress refits its pricing, and the plan is then rightly made again.
    model = f"dry-run-{uuid.uuid4().hex[:8]}"
    ollama_sim.models[model] = ollama_sim.models[MODEL]

    plans: list[int] = []
    make_plan = pipeline.make_plan

    def counted(messages, *args):
        plans.append(len(messages))
        return make_plan(messages, *args)

    monkeypatch.setattr(pipeline, "make_plan", counted)

    session_id = await session_with(store, profile, turns(20))
    session = (
        await store.GetSession(store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_CONTEXT))
    ).session
    reads: list[str] = []
    intercept = shared_server.ErrorInterceptor.intercept_service

    async def recording(self, continuation, details):
        reads.append(details.method.rsplit("/", 1)[-1])
        return await intercept(self, continuation, details)

    async def size_check(session: common_pb2.Session) -> pb.CheckContextSizeResponse:
        """The Agent's size check before a call, with its dry run."""
        return await compressor.CheckContextSize(
            pb.CheckContextSizeRequest(
                model=model,
                messages=list(session.context),
                window=WINDOW,
                session_id=session.id,
                decide_compression=True,
                settings=SUMMARY_ONLY,
            )
        )

    monkeypatch.setattr(shared_server.ErrorInterceptor, "intercept_service", recording)
    check = await size_check(session)
    assert check.decision == pb.SIZE_DECISION_COMPRESS_FIRST
    done = await compress(
        compressor,
        session_id,
        reason=pb.COMPRESSION_REASON_PRETURN,
        expected_revision=session.revision,
        current_tokens=check.tokens,
        model=model,
        settings=SUMMARY_ONLY,
    )
    assert done[-1].compressed.messages_after < done[-1].compressed.messages_before
    assert reads.count("GetSession") == 1, reads  # the dry run's, used again by the Compress
    assert len(plans) == 1, plans  # and its plan
    # A Compress naming another revision (or none) reads the context itself: the copy is not trusted.
    session_id = await session_with(store, profile, turns(20))
    session = (
        await store.GetSession(store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_CONTEXT))
    ).session
    reads.clear()
    await size_check(session)
    await compress(compressor, session_id, reason=pb.COMPRESSION_REASON_PRETURN, model=model, settings=SUMMARY_ONLY)
    assert reads.count("GetSession") == 2, reads
    assert len(plans) == 3, plans  # the first Compress's one, then this check's and this Compress's


def test_memory_chunks_past_the_message_budget_go_apart_in_batches_within_it():
    from palimpsest.compressor.pipeline import chunks_past

    chunks = [common_pb2.RawChunk(content=f"{i}:" + "x" * 4_000, content_hash=f"h{i}") for i in range(300)]
    commit = store_pb.CommitCompressionRequest(session_id="s", marker=common_pb2.Message(content="m"), chunks=chunks)
    assert chunks_past(store_pb.CommitCompressionRequest(session_id="s", chunks=chunks[:3]), 100_000) == []
    batches = chunks_past(commit, 300_000)
    assert commit.ByteSize() <= 300_000 and commit.marker.content == "m"
    assert all(sum(c.ByteSize() + 8 for c in batch) <= 300_000 for batch in batches)
    # Every chunk once, in order: the commit's first, then the batches'.
    assert [c.content_hash for c in commit.chunks] + [c.content_hash for b in batches for c in b] == [
        f"h{i}" for i in range(300)
    ]

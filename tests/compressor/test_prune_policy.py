"""The stages that keep summaries rare: old long requests and answers condensed to their head and
tail before a summary, a turn's tool results pruned as it ends (COMPRESSION_REASON_TURN_END), and
the headroom that counts such a result as one turn's spike rather than every turn's growth."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from palimpsest.compressor.calibration import Line
from palimpsest.compressor.pricing import Knobs, Pricing
from palimpsest.compressor.pruning import (
    PRUNED_AT_TURN_END,
    PRUNED_FROM,
    plan_pruning,
    preview,
    protected,
    recent_turns,
)
from palimpsest.compressor.stages import stage, turn_end_pruning, turn_growth, turn_spike
from palimpsest.shared.ollama import OllamaClient
from palimpsest.shared.prose_weight import PROSE_HEAD_CHARS, PROSE_TAIL_CHARS, PRUNED_NOTE, PruneSizes, prune_sizes
from palimpsest.shared.settings import Settings
from palimpsest.v1 import common_pb2
from palimpsest.v1 import compressor_pb2 as pb
from palimpsest.v1 import session_store_pb2 as store_pb
from tests.helpers.compressor_calls import compress, session_with, summary_bodies

Message = common_pb2.Message


def numbered(messages: list[Message]) -> list[Message]:
    for seq, m in enumerate(messages, start=1):
        m.seq = seq
    return messages


def prose(i: int, chars: int) -> str:
    words = f"answer {i} walks through the migration of shard {i} and what it cost. "
    return (words * (chars // len(words) + 1))[:chars]


def log_result(i: int, chars: int = 6_000) -> Message:
    body = "\n".join(f"10:{j % 60:02d} ERROR worker-{i} reset id=0x{i * 7919 + j:08x}" for j in range(chars // 45))
    return Message(role="tool", name="read_log", tool_call_id=f"c{i}", content=body)


def chat(n: int, chars: int = 2_000) -> list[Message]:
    out: list[Message] = []
    for i in range(n):
        out += [
            Message(role="user", content=f"turn {i}: " + prose(i, chars)),
            Message(role="assistant", content=prose(i, chars)),
        ]
    return numbered(out)


def knobs(**overrides) -> Knobs:
    return Knobs.resolve(Settings(), pb.CompressionSettings(**overrides))


def pricing(window: int = 8_192) -> Pricing:
    """Chars / 1.8: no vocabulary, no observations."""
    return Pricing.build([], window, knobs())


def test_old_long_requests_and_answers_are_condensed_to_head_and_tail():
    messages = chat(5)
    messages[2].content = "turn 1: remember this: " + prose(1, 2_000)  # the user marked it: kept whole
    messages[4].content = "turn 2: short"
    pruning = plan_pruning(messages, protected(messages), (), recent_turns(messages, 2))
    # Turns 0, 1 and 2 are old (the newest two keep their words); turn 1's request is marked, turn 2's short.
    assert [m.seq for m in pruning.pruned] == [1, 2, 4, 6]
    request = pruning.previews[0]
    original = messages[0].content
    assert request.role == "user" and request.content.startswith(original[:PROSE_HEAD_CHARS])
    assert request.content.endswith(original[-PROSE_TAIL_CHARS:]) and "memory_search" in request.content
    assert len(request.content) < 700 and request.metadata[PRUNED_FROM] == 1
    # Without prose_kept (the old rule): tool results only, no prose.
    assert plan_pruning(messages, protected(messages), ()).pruned == []


def test_pruning_sizes_follow_a_window_under_16384_down_to_a_quarter():
    assert prune_sizes(16_384) == prune_sizes(65_536) == prune_sizes(0) == PruneSizes()
    half = prune_sizes(8_192)
    assert (half.preview_chars, half.prune_min_chars, half.prose_min_chars) == (150, 600, 500)
    assert (half.prose_head_chars, half.prose_tail_chars) == (150, 75)
    assert prune_sizes(2_048) == prune_sizes(4_096) and prune_sizes(4_096).preview_chars == 75


def test_a_small_window_condenses_shorter_prose_and_keeps_less_of_it():
    """An 800-character answer stays whole at 16,384 (under 1,000); at 8,192 it is condensed to a
    head and tail half as long, and a 700-character tool result gets a preview of 150."""
    messages = chat(3)
    messages[0].content = "turn 0: go"
    messages[1].content = prose(1, 800)
    messages[2] = Message(
        role="assistant", content="", tool_calls=[common_pb2.ToolCall(name="ls", arguments_json="{}")]
    )
    messages[3] = Message(role="tool", name="ls", content=prose(2, 700))
    messages = numbered(messages)
    kept = protected(messages)
    recent = recent_turns(messages, 1)
    assert plan_pruning(messages, kept, (), recent, prune_sizes(16_384)).pruned == []
    small = plan_pruning(messages, kept, (), recent, prune_sizes(8_192))
    assert [m.seq for m in small.pruned] == [2, 4]
    answer, result = small.previews
    assert answer.content.startswith(messages[1].content[:150]) and not answer.content.startswith(
        messages[1].content[:151]
    )
    assert result.content.startswith(messages[3].content[:150]) and len(result.content) < 700


def test_a_dense_script_result_keeps_a_third_of_the_preview_characters():
    """A CJK table is about a token a character: its preview keeps what a Latin one's costs."""
    table = "\n".join(f"| {i:04d} | 计费服务迁移到新集群后，错误预算恢复前保留旧路径 |" for i in range(80))
    latin = "\n".join(f"| {i:04d} | the billing service keeps its old path warm |" for i in range(80))
    results = [Message(role="tool", name="t", seq=seq, content=text) for seq, text in ((1, table), (2, latin))]
    sizes = prune_sizes(4_096)
    cjk, plain = (preview(m, sizes=sizes).content for m in results)
    assert cjk.startswith(table[: sizes.preview_chars // 3]) and not cjk.startswith(
        table[: sizes.preview_chars // 3 + 1]
    )
    assert plain.startswith(latin[: sizes.preview_chars]) and not plain.startswith(latin[: sizes.preview_chars + 1])


def test_turn_end_pruning_takes_the_finished_turns_results_and_keeps_its_words():
    messages = numbered(
        [
            Message(role="user", content="turn 0: read the logs"),
            Message(role="assistant", tool_calls=[common_pb2.ToolCall(id="c0", name="read_log")]),
            log_result(0),
            Message(role="assistant", tool_calls=[common_pb2.ToolCall(id="c1", name="read_log")]),
            log_result(1),
            Message(role="assistant", content=prose(0, 2_000)),
        ]
    )
    pruning = turn_end_pruning(messages, pricing(), knobs(), 8_192)
    assert pruning is not None
    assert [m.seq for m in pruning.pruned] == [3, 5]  # both results, even the newest call's
    assert all(p.metadata[PRUNED_AT_TURN_END] for p in pruning.previews)
    # Too little to free (a fifth of a 200k window), or pruning off: nothing.
    assert turn_end_pruning(messages, pricing(200_000), knobs(min_freed=0.2), 200_000) is None
    assert turn_end_pruning(messages, pricing(), knobs(prune_tool_results=False), 8_192) is None


def test_inside_a_loop_the_newest_calls_results_and_the_answer_replied_to_stay_whole():
    """Between a loop's calls only its older iterations go: not the results the next call reads,
    even with the plan a call of the batch made stored after them, and not the last turn's answer
    the user is replying to (long as it is)."""
    messages = numbered(
        [
            Message(role="user", content="turn 0: plan the migration"),
            Message(role="assistant", content=prose(0, 2_000)),
            Message(role="user", content="turn 1: do step 3 of the plan above"),
            Message(role="assistant", tool_calls=[common_pb2.ToolCall(id="c0", name="read_log")]),
            log_result(0),
            Message(
                role="assistant",
                tool_calls=[
                    common_pb2.ToolCall(id="p1", name="plan"),
                    common_pb2.ToolCall(id="c1", name="read_log"),
                ],
            ),
            Message(role="tool", name="plan", tool_call_id="p1", content="planned"),
            log_result(1),
            Message(role="assistant", content="1. read the log\n2. fix the worker", is_plan=True),
        ]
    )
    pruning = turn_end_pruning(messages, pricing(), knobs(), 8_192)
    assert pruning is not None and [m.seq for m in pruning.pruned] == [5]  # the older iteration's result
    from palimpsest.agent.stages.upkeep import worth_pruning_after

    sizes = prune_sizes(8_192)
    assert worth_pruning_after(messages, 400, sizes, in_loop=True)  # the older result
    without_older = [m for m in messages if m.seq != 5]
    assert not worth_pruning_after(without_older, 400, sizes, in_loop=True)  # nothing but what stays
    assert turn_end_pruning(without_older, pricing(), knobs(), 8_192) is None


def test_a_result_pruned_at_its_turns_end_is_a_spike_not_growth():
    """Growth used to count every pruned result at its first size for every turn, which made a
    summary evict far deeper than the turns after it needed."""
    messages = chat(4, 200)
    messages.insert(2, Message(role="assistant", tool_calls=[common_pb2.ToolCall(id="c0", name="read_log")]))
    messages.insert(3, log_result(0))
    numbered(messages)
    priced = pricing()
    pruning = turn_end_pruning(messages, priced, knobs(), 8_192)
    assert pruning is not None
    settled = pruning.apply(messages)
    at_end, spike = turn_growth(settled, priced), turn_spike(settled, priced)
    for stand_in in pruning.previews:  # the same previews, pruned by a full window instead
        del stand_in.metadata[PRUNED_AT_TURN_END]
    late = turn_growth(pruning.apply(messages), priced)
    # Three complete turns before the newest: the spike was spread over them as growth.
    assert spike > 1_000 and late - at_end == pytest.approx(spike / 3, abs=1)


async def test_turn_end_compression_prunes_without_a_summary(compressor, store, profile, ollama_sim):
    messages = [
        Message(role="user", content="turn 0: read the logs"),
        Message(role="assistant", tool_calls=[common_pb2.ToolCall(id="c0", name="read_log")]),
        log_result(0),
        Message(role="assistant", content="The resets follow the deploys."),
    ]
    session_id = await session_with(store, profile, messages)
    asked = len(ollama_sim.bodies())
    events = await compress(compressor, session_id, reason=pb.COMPRESSION_REASON_TURN_END, window=8_192)
    assert events[-1].compressed.method == pb.COMPRESSION_METHOD_PRUNE
    assert events[-1].compressed.shortfall == ""  # it aims at no target
    assert summary_bodies(ollama_sim, asked) == []
    session = (
        await store.GetSession(store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_CONTEXT))
    ).session
    [result] = [m for m in session.context if m.role == "tool"]
    assert PRUNED_NOTE in result.content and session.context[-1].content == "The resets follow the deploys."
    # Nothing left to prune: no events at all (the Agent asks after every turn that called tools).
    assert await compress(compressor, session_id, reason=pb.COMPRESSION_REASON_TURN_END, window=8_192) == []


async def pruned_at_turn_end(compressor, store, profile, messages: list[Message]) -> list[Message]:
    """The context a session of ``messages`` holds after a turn-end prune (which must prune)."""
    session_id = await session_with(store, profile, messages)
    events = await compress(compressor, session_id, reason=pb.COMPRESSION_REASON_TURN_END, window=8_192)
    assert events[-1].compressed.method == pb.COMPRESSION_METHOD_PRUNE
    request = store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_CONTEXT)
    return list((await store.GetSession(request)).session.context)


async def test_a_turn_end_prune_leaves_out_the_task_notes_past_its_first_preview(compressor, store, profile):
    """A note spoke to one call: once the prompt changes before it anyway, it goes (it is never
    shown, and nothing is indexed of it); one before the first preview stays, where the prompt
    Ollama evaluated still matches."""
    from palimpsest.agent.context_builder import note_messages

    [early, *late] = note_messages(["[Iteration 2 of 6]", "[Iteration 2 of 6]", "[Iteration 3 of 6]"])
    messages = [
        Message(role="user", content="turn 0: is the job up?"),
        Message(role="assistant", tool_calls=[common_pb2.ToolCall(id="s0", name="status")]),
        Message(role="tool", name="status", tool_call_id="s0", content="up"),
        early,
        Message(role="assistant", content="It is up."),
        Message(role="user", content="turn 1: read the logs"),
    ]
    for i, note in enumerate(late):
        messages += [Message(role="assistant", tool_calls=[common_pb2.ToolCall(id=f"c{i}", name="read_log")])]
        messages += [log_result(i), note]
    messages.append(Message(role="assistant", content="The resets follow the deploys."))
    context = await pruned_at_turn_end(compressor, store, profile, messages)
    assert [m.content for m in context if m.role == "system" and "source" in m.metadata] == ["[Iteration 2 of 6]"]
    assert context[3].content == "[Iteration 2 of 6]"  # the early one, where it was
    assert [m.role for m in context[6:]] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert all(PRUNED_NOTE in m.content for m in context[6:] if m.role == "tool")


async def test_a_turn_end_prune_leaves_out_the_excerpts_recalled_for_ended_turns_past_its_first_preview(
    compressor, store, profile
):
    """Excerpts recalled for a request that has been answered go once the prompt changes before
    them anyway, and their room is free for the next turn's; one before the first preview stays."""
    from palimpsest.agent.context_builder import recall_message

    def recalled(what: str) -> Message:
        return recall_message([common_pb2.RawChunk(content=f"{what}: " + prose(3, 600))], what, 600)

    messages = [
        recalled("the deploy window"),
        Message(role="user", content="turn 0: read the logs"),
        Message(role="assistant", tool_calls=[common_pb2.ToolCall(id="c0", name="read_log")]),
        log_result(0),
        Message(role="assistant", content="The resets follow the deploys."),
        recalled("the rollback plan"),
        Message(role="user", content="turn 1: and the rollback?"),
        Message(role="assistant", content="Roll back shard 3 first."),
    ]
    context = await pruned_at_turn_end(compressor, store, profile, messages)
    assert [m.content.split("\n")[3][:18] for m in context if m.is_recall] == ["the deploy window:"]
    assert [m.role for m in context[1:]] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert PRUNED_NOTE in context[3].content


def _loop_with_recalls(stored: bool = True) -> list[Message]:
    """An answered turn with its own recall, then a loop whose request recalled two excerpts: its
    older call's result short (nothing to prune), its newest call's whole; numbered 1–10 as the
    store numbers them (``stored``), or to be appended."""
    from palimpsest.agent.context_builder import recall_message

    def recalled(what: str) -> Message:
        return recall_message([common_pb2.RawChunk(content=f"{what}: " + prose(3, 600))], what, 600)

    messages = [
        recalled("the deploy window"),
        Message(role="user", content="turn 0: when is the deploy window?"),
        Message(role="assistant", content="Tuesdays at six."),
        recalled("the rollback plan"),
        recalled("the shard map"),
        Message(role="user", content="turn 1: roll back shard 3"),
        Message(role="assistant", tool_calls=[common_pb2.ToolCall(id="c0", name="status")]),
        Message(role="tool", name="status", tool_call_id="c0", content="shard 3: degraded"),
        Message(role="assistant", tool_calls=[common_pb2.ToolCall(id="c1", name="read_log")]),
        log_result(1),
    ]
    return numbered(messages) if stored else messages


@pytest.mark.parametrize("over", [1, 50])
def test_a_loop_just_over_the_trigger_sheds_its_requests_recall_rather_than_the_history(over):
    """Inside a loop whose next prompt reaches the trigger by less than its request's recalled
    excerpts, a turn-end prune leaves them out (they served its first call; memory_search keeps
    them) instead of a summary of everything; not an ended turn's excerpts, and not the results."""
    context = _loop_with_recalls()
    trigger = 6_144  # 8,192 less the output reserve: under 90% of the window
    shed = pricing().added([context[3], context[4]])
    pruning = turn_end_pruning(context, pricing(), knobs(), 8_192, trigger + min(over, shed - 1))
    assert pruning is not None and not pruning.pruned
    assert [m.seq for m in pruning.dropped] == [4, 5]
    assert [m.seq for m in pruning.apply(context)] == [1, 2, 3, 6, 7, 8, 9, 10]


@pytest.mark.parametrize(
    "prompt",
    [
        0,  # not counted: a loop's prune before its next call
        6_143,  # under the trigger: nothing to shed
        "over by the recall",  # without them still at the trigger: a compression is due anyway
    ],
)
def test_the_recall_stays_when_shedding_it_would_not_keep_the_prompt_under_the_trigger(prompt):
    context = _loop_with_recalls()
    if prompt == "over by the recall":
        prompt = 6_144 + pricing().added([context[3], context[4]])
    assert turn_end_pruning(context, pricing(), knobs(), 8_192, prompt) is None
    answered = [*context, Message(role="assistant", content="Rolled back.", seq=11)]
    ended = turn_end_pruning(answered, pricing(), knobs(), 8_192, 7_000)  # the turn is over: its result goes
    assert ended is not None and [m.seq for m in ended.pruned] == [10] and not ended.dropped


async def test_a_loop_sheds_its_recall_through_the_store(compressor, store, profile, ollama_sim):
    """The shed excerpts leave the stored context in one commit, a prune with no LLM call, and
    nothing of them is indexed as memory (they are memory already)."""
    since = len(ollama_sim.bodies())
    session_id = await session_with(store, profile, _loop_with_recalls(stored=False))
    request = store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_CONTEXT)
    before = (await store.GetSession(request)).session
    events = await compress(
        compressor,
        session_id,
        reason=pb.COMPRESSION_REASON_TURN_END,
        window=8_192,
        next_prompt_tokens=6_150,
        expected_revision=before.revision,
    )
    assert events[-1].compressed.method == pb.COMPRESSION_METHOD_PRUNE
    after = (await store.GetSession(request)).session.context
    assert [m.is_recall for m in after] == [True, False, False, False, False, False, False, False]
    assert [m.content for m in after[1:]] == [m.content for m in before.context if not m.is_recall]
    assert not summary_bodies(ollama_sim, since)


def test_results_pruned_within_their_own_turn_are_its_spike():
    """A compression inside a tool loop prunes the loop's older results: they were sent whole
    within that turn only, so they count as its spike, not as growth of every turn."""
    loop: list[Message] = [*chat(2, 200), Message(role="user", content="turn 2: fix the build")]
    for i in range(3):
        loop += [
            Message(role="assistant", tool_calls=[common_pb2.ToolCall(id=f"c{i}", name="read_log")]),
            log_result(i),
        ]
    context = numbered(loop)
    staged = stage(context, pricing(), knobs(), 8_192, 12, 6_000, True)
    marked = [p for p in staged.pruning.previews if p.role == "tool"]
    assert len(marked) == 2 and all(p.metadata[PRUNED_AT_TURN_END] for p in marked)


def _pruned_tool_turns() -> list[Message]:
    turns: list[Message] = []
    for i in range(4):
        turns += [
            Message(role="user", content=f"turn {i}: " + prose(i, 700)),
            Message(role="assistant", tool_calls=[common_pb2.ToolCall(id=f"c{i}", name="read_log")]),
            log_result(i, 3_000),
            Message(role="assistant", content=prose(i, 900)),
        ]
    return numbered([*turns, Message(role="user", content="turn 4: and now?")])


def _exact_pricing() -> Pricing:
    from ollama_sim.vocabulary import QWEN3_6, tokenizer_metadata
    from palimpsest.compressor.model_tokenizers import TokenCounter
    from palimpsest.compressor.vocabulary import build_tokenizer

    counter = TokenCounter(build_tokenizer(tokenizer_metadata(QWEN3_6)), "exact")
    return Pricing.build([], 4_096, knobs(), counter=counter)


@pytest.mark.parametrize("exact, overhead", [(False, 0), (False, 500), (False, -40), (True, 0)])
def test_what_pruning_frees_is_what_the_prompt_loses_whatever_its_fixed_cost(exact, overhead):
    """A prompt's fixed cost (a calibrated line's intercept: the system prompt and tools, ~500
    tokens; the template's constant and safety margin) is paid once a prompt. Four pruned messages
    each priced alone paid it four times, and seemed to free 2,200 tokens for 750: pruning claimed
    the target, left the prompt over its trigger, and the next compression followed within three
    turns (bench compaction, calibrated path, 4,096). What pruning frees, and a turn's growth, are
    what the prompt loses and gains, whatever that cost."""
    rate = 0.3
    priced = _exact_pricing() if exact else replace(pricing(4_096), line=Line(overhead, rate))
    context = _pruned_tool_turns()
    staged = stage(context, priced, knobs(), 4_096, 12, priced.estimate(context), True)
    assert len(staged.pruning.pruned) >= 4
    lost = priced.estimate(context) - priced.estimate(staged.context)
    assert abs(staged.freed - lost) <= 2 * len(staged.pruning.pruned)  # each count rounds up
    at_end = turn_end_pruning(context[:-1], priced, knobs(), 4_096)
    assert at_end is not None and len(at_end.pruned) >= 4
    after = at_end.apply(context[:-1])
    if not exact:  # a turn's growth does not carry the fixed cost
        plain = replace(pricing(4_096), line=Line(0, rate))
        assert abs(turn_growth(after, priced) - turn_growth(after, plain)) <= 2 * len(after)


def test_a_shortfall_puts_the_prompts_fixed_cost_outside_the_kept_messages():
    """The words say what stands above the target: the kept messages as they add to the prompt,
    the summary, and the rest (system prompt, tools, template). A whole estimate of the new context
    put the line's intercept with the kept messages: "kept 2,408 ... system prompt, tool schemas
    and template 57" for a prompt whose system prompt and tools were ~500 (bench compaction)."""
    import re

    from palimpsest.compressor import pipeline

    priced = replace(pricing(4_096), line=Line(500, 0.3))
    kept = [Message(role="user", content="turn 9: " + prose(9, 6_000))]
    summary = Message(role="user", content="[Summary of the earlier conversation]\n" + prose(1, 400))
    outcome = pipeline.Outcome(pb.COMPRESSION_METHOD_SUMMARY, [], [summary, *kept], summary, [])
    current = priced.estimate([*chat(4), *kept]) + 120  # the prompt carried 120 tokens past its estimate
    done = pipeline.account(outcome, [*chat(4), *kept], priced, knobs(), 4_096, current)
    said = [
        int(n.replace(",", ""))
        for n in re.findall(
            r"take ([\d,]+), the summary ([\d,]+), the system prompt, "
            r"tool schemas and template ([\d,]+)",
            done.shortfall,
        )[0]
    ]
    assert abs(said[0] - priced.added(kept)) <= 2 and said[1] == priced.added([summary])  # counts round up
    assert said[2] >= 500 + 120 - 2 and sum(said) == done.tokens_after


async def test_a_prefix_summary_gives_up_its_slack_before_its_prefix(ollama_sim):
    """A prefix just under a small window's trigger leaves room for the length asked for, not for
    twice it: num_predict shrinks to the room instead of the summary going standalone."""
    from palimpsest.compressor.summarizer import Prefix, Summarizer
    from palimpsest.compressor.summary_window import summary_length

    client = OllamaClient(ollama_sim.url)
    summarizer = Summarizer(client, knobs(), "qwen3.6", 4_096)
    length = summary_length(2_400, summarizer.budget)
    messages = [{"role": "user", "content": "turn 0: the deploys"}]
    try:
        for tokens in range(3_900, 2_000, -25):  # the largest prefix that is sent at all
            try:
                await summarizer.summarize_prefix(Prefix(messages, None, tokens, 2_400, "all"), pricing(4_096))
                break
            except ValueError:
                continue
    finally:
        await client.aclose()
    predict = ollama_sim.bodies()[-1]["options"]["num_predict"]
    assert length + length // 4 <= predict < 2 * length  # before: twice the length, or standalone


# -- turn-end pruning over any conversation ------------------------------------------------------

_turn_shapes = st.lists(
    st.tuples(
        st.integers(0, 3),  # tool calls in the turn
        st.sampled_from([20, 400, 3_000]),  # the request's size
        st.sampled_from([20, 700, 2_500]),  # the answer's size
        st.sampled_from([50, 900, 6_000]),  # each result's size
        st.booleans(),  # whether the turn ended (an answer) or its loop still runs
        st.booleans(),  # whether excerpts were recalled for its request
    ),
    min_size=1,
    max_size=6,
)


def _conversation(shapes) -> list[Message]:
    from palimpsest.agent.context_builder import note_messages, recall_message

    out: list[Message] = []
    for t, (calls, asked, answered, result, ended, recalled) in enumerate(shapes):
        if recalled:  # stored just before the request it was recalled for
            out.append(recall_message([common_pb2.RawChunk(content=prose(t + 7, 900))], "deploys", 600))
        out.append(Message(role="user", content=f"turn {t}: " + prose(t, asked)))
        for c in range(calls):
            if c:  # the note the next call was given
                out += note_messages([f"[Iteration {c + 1} of 6]"])
            call_id = f"t{t}c{c}"
            out.append(Message(role="assistant", tool_calls=[common_pb2.ToolCall(id=call_id, name="read_log")]))
            out.append(Message(role="tool", name="read_log", tool_call_id=call_id, content=prose(c, result)))
        if ended or not calls or t < len(shapes) - 1:
            out.append(Message(role="assistant", content=prose(t, answered)))
    return numbered(out)


@settings(max_examples=150, deadline=None)
@given(_turn_shapes, st.sampled_from([4_096, 8_192, 32_768]))
def test_a_turn_end_prune_keeps_every_call_with_its_result_and_takes_only_spent_notes(shapes, window):
    """Whatever the conversation: each result still follows its call, nothing but task notes and
    ended turns' recalled excerpts past the first preview leaves (the running turn's recall stays),
    and the newest call's results (a loop under way) stay whole."""
    from palimpsest.shared.context_view import is_task_note

    context = _conversation(shapes)
    pruning = turn_end_pruning(context, pricing(window), knobs(), window)
    if pruning is None:
        return
    after = pruning.apply(context)
    first = min(m.seq for m in pruning.pruned)
    assert all((is_task_note(m) or m.is_recall) and m.seq > first for m in pruning.dropped)
    running = context[-1].role != "assistant" or bool(context[-1].tool_calls)
    requests = [i for i, m in enumerate(context) if m.role == "user"]
    if running and shapes[-1][5]:  # the loop under way still reads what was recalled for it
        assert context[requests[-1] - 1] in after
    if not running:  # every ended turn's recall past the first preview is gone
        assert all(m in pruning.dropped for m in context if m.is_recall and m.seq > first)
    assert len(after) == len(context) - len(pruning.dropped)
    assert [m.replaces.first or m.seq for m in after] == [m.seq for m in context if m not in pruning.dropped]
    calls = {}
    for i, m in enumerate(after):
        for call in m.tool_calls:
            calls[call.id] = i
        if m.role == "tool":
            assert m.tool_call_id in calls and calls[m.tool_call_id] < i, m.tool_call_id
            between = after[calls[m.tool_call_id] + 1 : i]
            assert all(b.role == "tool" for b in between)  # the batch's results, nothing else
    if context[-1].role == "tool":  # a loop under way: the result the next call reads stays whole
        assert after[-1].content == context[-1].content

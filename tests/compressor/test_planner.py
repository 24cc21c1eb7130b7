"""The compression plan: turns, tool groups, importance, intra-turn mode, and what it never does."""

from __future__ import annotations

import itertools

import pytest

from palimpsest.compressor.planner import (
    FILLER_AT_MOST,
    IMPORTANT_AT_LEAST,
    Plan,
    apply_plan,
    plan_compression,
    split_turns,
    tool_groups,
    turn_importance,
    widen_kept,
    would_compress,
)
from palimpsest.compressor.token_estimate import estimate_tokens
from palimpsest.shared.context_view import message_budget, message_chars
from palimpsest.v1.common_pb2 import Message, ToolCall


class History:
    """Builds a context with strictly increasing seqs."""

    def __init__(self, start: int = 1) -> None:
        self.seq = itertools.count(start)
        self.messages: list[Message] = []

    def add(self, role: str, content: str = "", **kw: object) -> Message:
        m = Message(role=role, content=content, seq=next(self.seq), is_context=True, **kw)  # type: ignore[arg-type]
        self.messages.append(m)
        return m

    def user(self, text: str = "please do the next thing", **kw: object) -> Message:
        return self.add("user", text, **kw)

    def assistant(self, text: str = "done", **kw: object) -> Message:
        return self.add("assistant", text, **kw)

    def call(
        self, name: str = "run", args: str = '{"cmd": "ls"}', n_results: int = 1, result: str = "output"
    ) -> list[Message]:
        calls = [ToolCall(id=f"c{i}", name=name, arguments_json=args) for i in range(n_results)]
        group = [self.add("assistant", "", tool_calls=calls)]
        for i in range(n_results):
            group.append(self.add("tool", result, name=name, tool_call_id=f"c{i}"))
        return group

    def turn(self, text: str = "please do the next thing", reply: str = "done", size: int = 0) -> list[Message]:
        return [self.user(text), self.assistant(reply + "." * size)]

    def summary(self, text: str = "- earlier work") -> Message:
        return self.add("user", text, is_summary=True, is_display=False)


def chars(messages: list[Message]) -> int:
    """One token per char: budgets in tests read as character counts."""
    return sum(message_chars(m) for m in messages)


def plan(context: list[Message], **kw: object) -> Plan:
    args: dict[str, object] = {"keep_recent": 4, "window": 100_000, "target": 0.65, "estimate": chars}
    args.update(kw)
    return plan_compression(context, **args)  # type: ignore[arg-type]


def seqs(messages: list[Message]) -> list[int]:
    return [m.seq for m in messages]


# -- turns and groups ---------------------------------------------------------------------


def test_a_turn_is_a_user_message_and_everything_up_to_the_next() -> None:
    h = History()
    h.user("a")
    h.call()
    h.assistant()
    h.user("b")
    h.assistant()
    assert [len(t) for t in split_turns(h.messages)] == [4, 2]


def test_messages_before_the_first_user_message_form_the_oldest_turn() -> None:
    h = History()
    h.assistant("left over")
    h.user("a")
    assert [seqs(t) for t in split_turns(h.messages)] == [[1], [2]]


def test_a_summary_does_not_open_a_turn() -> None:
    h = History()
    h.user("a")
    h.summary()
    assert len(split_turns(h.messages)) == 1


def test_a_tool_group_is_the_call_and_its_results() -> None:
    h = History()
    h.user()
    h.call(n_results=3)
    h.assistant()
    assert [len(u) for u in tool_groups(h.messages)] == [1, 4, 1]


# -- turn mode ----------------------------------------------------------------------------


def test_the_newest_keep_recent_turns_are_kept_and_older_ones_summarized() -> None:
    h = History()
    turns = [h.turn(f"task {i}") for i in range(6)]
    p = plan(h.messages)
    assert p.mode == "turns" and p.kept_turns == 4
    assert seqs(p.to_summarize) == seqs(turns[0] + turns[1])
    assert seqs(p.to_keep) == seqs([m for t in turns[2:] for m in t])


def test_fewer_turns_than_keep_recent_that_fit_give_an_empty_plan() -> None:
    h = History()
    for i in range(3):
        h.turn(f"task {i}")
    assert plan(h.messages).is_empty


def test_keep_recent_shrinks_until_the_kept_region_fits_the_target() -> None:
    h = History()
    for i in range(6):
        h.turn(size=900)  # ~930 chars each
    # target 0.65 x 3,000 = 1,950 chars: two turns fit, three do not.
    p = plan(h.messages, window=3_000)
    assert p.kept_turns == 2
    assert chars(p.to_keep) <= 1_950


def test_keep_recent_never_shrinks_below_the_newest_turn() -> None:
    h = History()
    h.turn()
    h.turn()
    newest = h.turn(size=10_000)
    p = plan(h.messages, window=3_000)
    assert p.kept_turns == 1
    assert seqs(p.to_keep) == seqs(newest)


def test_system_messages_are_kept_whatever_their_position() -> None:
    h = History()
    first = h.add("system", "task note")
    for i in range(6):
        h.turn()
    mid = h.add("system", "event record")
    h.turn()
    p = plan(h.messages)
    assert seqs(p.system) == [first.seq, mid.seq]
    assert all(m.role != "system" for m in p.to_summarize + p.to_keep)
    assert apply_plan(p, Message(role="user", is_summary=True))[:2] == p.system


def test_task_notes_and_recalled_excerpts_go_with_their_turn() -> None:
    """Stored where they were given so prompts only grow at the end, they must not pile up in
    the kept region the way service records do: they are compressed with their turn."""
    from palimpsest.agent.context_builder import note_messages, recall_message
    from palimpsest.v1.common_pb2 import RawChunk

    h = History()
    record = h.add("system", "event record")
    for i in range(6):
        h.user(f"step {i}")
        note = note_messages([f"[Iteration {i + 2} of 40]"])[0]
        note.seq = next(h.seq)
        h.messages.append(note)
        h.assistant("done")
    recall = recall_message([RawChunk(content="user: the code is 7741")])
    recall.seq = next(h.seq)
    h.messages.append(recall)
    h.turn()
    p = plan(h.messages, keep_recent=2)
    assert seqs(p.system) == [record.seq]
    summarized = [m.content for m in p.to_summarize]
    assert "[Iteration 2 of 40]" in summarized and "[Iteration 7 of 40]" not in summarized


def test_existing_summaries_are_always_part_of_what_is_summarized() -> None:
    h = History()
    old = h.summary()
    for i in range(6):
        h.turn()
    p = plan(h.messages)
    assert old in p.to_summarize and old not in p.to_keep


def test_the_summarized_range_spans_first_to_last_seq() -> None:
    h = History()
    h.summary()
    for _ in range(6):
        h.turn()
    assert plan(h.messages).replaced_range == (1, 5)


# -- importance ---------------------------------------------------------------------------


def test_a_bare_acknowledgement_is_filler() -> None:
    h = History()
    assert turn_importance(h.turn("ok thanks", "You're welcome.")) <= FILLER_AT_MOST


def test_a_plain_turn_is_neither_filler_nor_important() -> None:
    h = History()
    score = turn_importance(h.turn("summarize the meeting", "Here it is."))
    assert FILLER_AT_MOST < score < IMPORTANT_AT_LEAST


@pytest.mark.parametrize(
    "build",
    [
        lambda h: [h.user("remember: the deploy key is in vault"), h.assistant("Noted.")],
        lambda h: [h.user("run it"), *h.call(name="deploy_prod", result="ok")],
        lambda h: [h.user("run it"), *h.call(result="Traceback: ValueError"), h.assistant("It failed.")],
        lambda h: [h.user("go"), h.add("tool", "42", name="calc", is_compression_critical=True)],
    ],
    ids=["user-marked", "critical-tool-name", "error-and-failure", "critical-flag"],
)
def test_important_turns_score_at_least_the_swap_threshold(build) -> None:  # type: ignore[no-untyped-def]
    assert turn_importance(build(History()), critical_tools=("deploy_prod",)) >= IMPORTANT_AT_LEAST


def test_an_important_old_turn_is_swapped_in_for_a_filler_recent_one() -> None:
    h = History()
    important = [h.user("remember: prod DB is db-7, never restart it"), h.assistant("Noted.")]
    h.turn("write the report")
    filler = h.turn("ok", "Glad to help.")
    h.turn("next task")
    newest = h.turn("last task")
    p = plan(h.messages, keep_recent=3)
    assert seqs(important)[0] in seqs(p.to_keep)
    assert all(m.seq not in seqs(p.to_keep) for m in filler)
    assert seqs(newest)[0] in seqs(p.to_keep)
    assert seqs(p.to_keep) == sorted(seqs(p.to_keep))


def test_the_newest_turn_is_never_swapped_out_even_when_filler() -> None:
    h = History()
    h.turn("remember: use port 50052")
    h.turn("write it")
    h.turn("write more")
    newest = h.turn("thanks", "Any time.")
    p = plan(h.messages, keep_recent=2)
    assert all(m in p.to_keep for m in newest)


def test_an_important_turn_that_would_not_fit_is_not_swapped_in() -> None:
    h = History()
    important = h.turn("remember: keep this", "x" * 5_000)
    h.turn("a")
    h.turn("ok", "Sure.")
    h.turn("b")
    p = plan(h.messages, keep_recent=3, window=4_000)  # 2,600 chars of room
    assert all(m in p.to_summarize for m in important)


def test_a_plain_old_turn_never_displaces_a_kept_one() -> None:
    h = History()
    h.turn("write a poem")
    h.turn("a")
    filler = h.turn("ok", "Sure.")
    h.turn("b")
    p = plan(h.messages, keep_recent=3)
    assert all(m in p.to_keep for m in filler)


# -- intra-turn mode ----------------------------------------------------------------------


def long_turn(h: History, groups: int, result: str = "output") -> Message:
    request = h.user("refactor the whole package")
    for _ in range(groups):
        h.call(result=result)
    return request


def test_a_single_long_turn_keeps_its_request_and_newest_messages() -> None:
    h = History()
    request = long_turn(h, groups=20, result="r" * 500)  # 41 messages
    p = plan(h.messages, keep_recent_messages=12, window=20_000)
    assert p.mode == "messages"
    assert p.to_keep[0] is request
    assert seqs(p.to_keep[1:]) == seqs(h.messages[-12:])
    assert seqs(p.to_summarize) == seqs(h.messages[1:-12])


def test_a_tool_group_straddling_the_cut_moves_the_cut_earlier() -> None:
    h = History()
    request = h.user("do it")
    early = h.call()
    straddling = h.call(n_results=3)  # call + 3 results
    final = h.assistant("all done")
    # Keeping the newest 3 would start at the second result: the whole group is kept instead.
    p = plan(h.messages, keep_recent_messages=3)
    assert seqs(p.to_keep) == seqs([request, *straddling, final])
    assert seqs(p.to_summarize) == seqs(early)
    assert p.to_keep[1].tool_calls


def test_no_kept_tool_result_ever_loses_its_call() -> None:
    h = History()
    h.user("go")
    for n in (1, 2, 3, 1, 2, 3, 1):
        h.call(n_results=n)
    for keep in range(1, 16):
        p = plan(h.messages, keep_recent_messages=keep, keep_recent=1)
        kept = p.to_keep[1:]
        assert not kept or kept[0].role != "tool", keep


def test_when_the_mid_turn_partition_finds_nothing_it_retries_with_two() -> None:
    h = History()
    request = h.user("go")
    h.call()
    h.call()
    last = h.add("assistant", "summing up")
    answer = h.assistant("final")  # 6 messages after the request, fewer than 12
    p = plan(h.messages, keep_recent_messages=12)
    assert p.mode == "messages"
    assert seqs(p.to_keep) == seqs([request, last, answer])


def test_the_retry_with_two_still_never_splits_a_group() -> None:
    h = History()
    request = h.user("go")
    h.call()
    last_group = h.call(n_results=2)
    p = plan(h.messages, keep_recent_messages=12)
    assert seqs(p.to_keep) == seqs([request, *last_group])


def test_when_turn_mode_finds_nothing_a_single_turn_is_split_anyway() -> None:
    h = History()
    request = h.user("go")
    for _ in range(5):
        h.call(result="z" * 2_000)
    p = plan(h.messages, window=10_000)  # no keep_recent_messages given
    assert p.mode == "messages" and p.to_keep[0] is request
    assert len(p.to_keep) == 3


def test_an_oversized_newest_turn_is_split_and_older_turns_go_too() -> None:
    h = History()
    older = h.turn("earlier")
    request = long_turn(h, groups=30, result="q" * 400)
    p = plan(h.messages, keep_recent_messages=12, window=20_000)
    assert p.mode == "messages"
    assert all(m in p.to_summarize for m in older)
    assert p.to_keep[0] is request


def test_intra_turn_keeps_fewer_messages_until_the_kept_part_fits() -> None:
    h = History()
    long_turn(h, groups=20, result="w" * 1_000)
    p = plan(h.messages, keep_recent_messages=12, window=10_000)  # 6,500 chars of room
    assert chars(p.to_keep) <= 6_500
    assert len(p.to_keep) >= 3


def test_a_single_message_that_cannot_be_split_gives_an_empty_plan() -> None:
    h = History()
    h.user("x" * 1_000_000)
    p = plan(h.messages, keep_recent_messages=12, window=8_192)
    assert p.is_empty
    assert not would_compress(p, chars)


def test_a_request_and_one_huge_result_give_an_empty_plan_not_an_error() -> None:
    h = History()
    h.user("cat the log")
    h.add("tool", "x" * 1_000_000, name="cat")
    p = plan(h.messages, keep_recent_messages=12, window=8_192)
    assert p.is_empty
    assert len(apply_plan(p, None)) == 2


def test_a_megabyte_tool_result_priced_as_its_view_does_not_trigger_splitting() -> None:
    window = 32_768
    budget = message_budget(window)

    def view_estimate(messages: list[Message]) -> int:
        return estimate_tokens(messages, None, budget_tokens=budget).tokens

    h = History()
    for i in range(6):
        h.turn(f"task {i}")
    newest = [h.user("cat the log"), h.add("tool", "x" * 1_000_000, name="cat"), h.assistant("It is long.")]
    p = plan(h.messages, keep_recent_messages=12, window=window, estimate=view_estimate)
    assert p.mode == "turns"
    assert all(m in p.to_keep for m in newest)
    assert would_compress(p, view_estimate)


# -- would_compress -----------------------------------------------------------------------


def test_an_empty_plan_would_not_compress() -> None:
    h = History()
    h.turn()
    assert not would_compress(plan(h.messages), chars)


def test_a_plan_that_drops_old_turns_would_compress() -> None:
    h = History()
    for _ in range(6):
        h.turn(size=100)
    assert would_compress(plan(h.messages), chars)


def test_a_summary_bigger_than_what_it_replaces_would_not_compress() -> None:
    h = History()
    for _ in range(6):
        h.turn()
    p = plan(h.messages)
    assert not would_compress(p, chars, summary_tokens=chars(p.to_summarize))
    assert would_compress(p, chars, summary_tokens=chars(p.to_summarize) - 1)


def test_re_summarizing_a_lone_summary_would_not_compress() -> None:
    h = History()
    only = h.summary("x" * 10_000)
    p = Plan(to_summarize=[only], to_keep=[], system=[])
    assert not would_compress(p, chars)


# -- one live summary ---------------------------------------------------------------------


def compress(context: list[Message], seq: itertools.count, **kw: object) -> list[Message]:  # type: ignore[type-arg]
    p = plan(context, **kw)
    if p.is_empty:
        return context
    summary = Message(role="user", content="- summary", seq=next(seq), is_summary=True)
    return apply_plan(p, summary)


def test_fifty_successive_compressions_leave_at_most_one_live_summary() -> None:
    h = History()
    context: list[Message] = []
    for round_ in range(50):
        start = len(h.messages)
        h.turn(f"task {round_}", size=200)
        h.call(result="r" * 300)
        context = context + h.messages[start:]
        context = compress(context, h.seq, window=4_000, keep_recent=2)
        assert sum(m.is_summary for m in context) <= 1


def test_fifty_successive_mid_turn_compressions_leave_at_most_one_live_summary() -> None:
    h = History()
    request = h.user("long autonomous task")
    context = [request]
    for _ in range(50):
        start = len(h.messages)
        h.call(result="s" * 400)
        context = context + h.messages[start:]
        context = compress(context, h.seq, window=6_000, keep_recent_messages=12)
        assert sum(m.is_summary for m in context) <= 1
        assert context[0] is request or context[1] is request  # the request always survives
    assert any(m.is_summary for m in context)


def test_fifteen_legacy_summaries_collapse_into_one() -> None:
    h = History()
    for _ in range(15):
        h.summary("- old")
    for _ in range(6):
        h.turn()
    after = compress(h.messages, h.seq)
    assert sum(m.is_summary for m in after) == 1


def test_several_summaries_and_nothing_else_are_merged() -> None:
    h = History()
    h.summary("a")
    h.summary("b")
    p = plan(h.messages)
    assert len(p.to_summarize) == 2 and would_compress(p, chars)


def test_a_recalled_excerpt_is_cut_around_the_first_word_of_the_query_it_contains() -> None:
    from palimpsest.agent.context_builder import excerpt, recall_message
    from palimpsest.v1.common_pb2 import RawChunk

    text = "".join(f"line {i} nothing here\n" for i in range(200)) + "the vault code is 7741\n" + "tail\n" * 100
    cut = excerpt(text, "what is the VAULT code?", 300)
    assert "vault code is 7741" in cut and cut.startswith("…") and cut.endswith("…")
    assert len(cut) == 302  # the limit and two ellipses
    assert excerpt(text, "unrelated words", 100) == text[:100] + "…"  # no match: the opening
    assert excerpt("short", "anything", 100) == "short"
    message = recall_message([RawChunk(content=text), RawChunk(content=text)], "vault", 1_000)
    assert message.content.count("7741") == 2 and len(message.content) < 1_200


# -- the summarizer's retry ----------------------------------------------------------------


def test_a_retry_summarizes_the_older_half_of_the_turns_and_keeps_the_rest_in_order() -> None:
    h = History()
    h.add("system", "you are helpful")
    h.summary()
    for i in range(7):
        h.turn(f"question {i}")
    first = plan(h.messages, keep_recent=2)
    wider = widen_kept(first)
    old_turns = split_turns(first.to_summarize)  # the old summary, then five turns
    assert len(old_turns) == 6
    assert seqs(wider.to_summarize) == seqs([m for t in old_turns[:3] for m in t])
    assert (
        seqs(wider.to_keep)
        == sorted(seqs(wider.to_keep))
        == seqs([m for t in old_turns[3:] for m in t]) + seqs(first.to_keep)
    )
    assert wider.system == first.system and wider.kept_turns == first.kept_turns + 3
    # Nothing lost, nothing twice: the same messages, partitioned anew.
    assert sorted(seqs(wider.to_summarize + wider.to_keep)) == sorted(seqs(first.to_summarize + first.to_keep))


def test_a_retry_within_one_long_turn_keeps_whole_tool_groups() -> None:
    h = History()
    h.user("investigate the outage")
    for _ in range(4):
        h.call(n_results=2, result="x" * 50)
    partial = Plan(to_summarize=h.messages[1:10], to_keep=[h.messages[0], *h.messages[10:]], system=[])
    wider = widen_kept(partial)
    assert seqs(wider.to_summarize) == seqs(h.messages[1:7])  # two of the three groups summarized
    assert seqs(wider.to_keep) == [1, *range(8, 14)]
    assert all(m.role != "tool" for m in wider.to_keep[:2])  # no result kept without its call


def test_a_retry_of_one_unit_runs_the_same_plan() -> None:
    h = History()
    h.turn("only", size=10)
    single = Plan(to_summarize=list(h.messages), to_keep=[], system=[])
    assert widen_kept(single) is single

"""The no-LLM fallback: drop the oldest whole turns until under half the window."""

from __future__ import annotations

import itertools

from palimpsest.compressor.hard_truncate import HARD_TRUNCATE_FRACTION, hard_truncate
from palimpsest.shared.context_view import message_chars
from palimpsest.v1.common_pb2 import Message, ToolCall

_seq = itertools.count(1)


def msg(role: str, content: str = "", **kw: object) -> Message:
    return Message(role=role, content=content, seq=next(_seq), **kw)  # type: ignore[arg-type]


def chars(messages: list[Message]) -> int:
    return sum(message_chars(m) for m in messages)


def turn(size: int) -> list[Message]:
    return [
        msg("user", "u" * 100),
        msg("assistant", "", tool_calls=[ToolCall(name="run", arguments_json="{}")]),
        msg("tool", "t" * (size - 100 - len("run{}") - 100), name="run"),
        msg("assistant", "a" * 100),
    ]


def test_the_fraction_is_half_the_window() -> None:
    assert HARD_TRUNCATE_FRACTION == 0.5


def test_oldest_turns_are_dropped_until_strictly_under_half_the_window() -> None:
    turns = [turn(1_000) for _ in range(10)]  # 10,000 chars
    context = [m for t in turns for m in t]
    result = hard_truncate(context, window=8_000, estimate=chars)
    # 4,000 is not under 4,000: three turns are kept, not four.
    assert result.tokens == 3_000 and result.fits
    assert result.to_keep == [m for t in turns[-3:] for m in t]
    assert result.dropped == [m for t in turns[:-3] for m in t]


def test_just_over_the_line_one_more_turn_goes() -> None:
    turns = [turn(1_000) for _ in range(4)]
    context = [m for t in turns for m in t]
    assert len(hard_truncate(context, window=8_002, estimate=chars).to_keep) == 16
    assert len(hard_truncate(context, window=8_000, estimate=chars).to_keep) == 12


def test_the_newest_turn_is_kept_even_when_it_alone_is_too_big() -> None:
    turns = [turn(1_000), turn(1_000), turn(50_000)]
    context = [m for t in turns for m in t]
    result = hard_truncate(context, window=8_000, estimate=chars)
    assert result.to_keep == turns[-1]
    assert not result.fits


def test_tool_groups_are_never_split() -> None:
    turns = [turn(1_000) for _ in range(5)]
    result = hard_truncate([m for t in turns for m in t], window=5_000, estimate=chars)
    kept = result.to_keep
    assert kept[0].role == "user"
    for i, m in enumerate(kept):
        if m.role == "tool":
            assert kept[i - 1].tool_calls


def test_system_messages_are_always_kept() -> None:
    system = msg("system", "s" * 10)
    turns = [turn(1_000) for _ in range(6)]
    result = hard_truncate([system] + [m for t in turns for m in t], window=4_000, estimate=chars)
    assert result.system == [system]
    assert result.new_context[0] is system
    assert system not in result.dropped


def test_a_live_summary_outlasts_older_turns() -> None:
    summary = msg("user", "s" * 200, is_summary=True)
    turns = [turn(1_000) for _ in range(6)]
    result = hard_truncate([summary] + [m for t in turns for m in t], window=5_000, estimate=chars)
    assert summary in result.to_keep
    assert result.tokens < 2_500


def test_the_summary_goes_when_even_the_newest_turn_needs_the_room() -> None:
    summary = msg("user", "s" * 1_000, is_summary=True)
    turns = [turn(1_000), turn(1_800)]
    result = hard_truncate([summary] + [m for t in turns for m in t], window=4_000, estimate=chars)
    assert result.to_keep == turns[-1]
    assert summary in result.dropped


def test_a_context_that_already_fits_loses_nothing() -> None:
    turns = [turn(1_000) for _ in range(2)]
    context = [m for t in turns for m in t]
    result = hard_truncate(context, window=100_000, estimate=chars)
    assert result.dropped == [] and result.to_keep == context

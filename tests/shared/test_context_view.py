"""The view the model is sent: what counts as sent, per-message truncation, Ollama's wire format."""

from __future__ import annotations

import base64
import json
import math

import ollama

from palimpsest.shared.context_view import (
    MESSAGE_OVERHEAD_CHARS,
    default_message_budget,
    message_budget,
    message_chars,
    to_ollama_messages,
    truncate_oversized,
    view_chars,
)
from palimpsest.v1.common_pb2 import Message, ToolCall


def msg(role: str, content: str = "", **kw: object) -> Message:
    return Message(role=role, content=content, **kw)  # type: ignore[arg-type]


def half(chars: int) -> int:
    """Two chars per token: easy numbers for the budget edges."""
    return math.ceil(chars / 2)


# -- what counts as sent ------------------------------------------------------------------


def test_message_chars_count_content_and_tool_calls_but_not_thinking() -> None:
    m = msg(
        "assistant",
        "abc",
        thinking="x" * 1000,
        tool_calls=[ToolCall(id="c1", name="grep", arguments_json='{"q":"a"}')],
    )
    assert message_chars(m) == 3 + len("grep") + len('{"q":"a"}')


def test_view_chars_charge_each_message_its_template_overhead() -> None:
    messages = [msg("user", "hello"), msg("assistant", "hi")]
    assert view_chars(messages) == 5 + 2 + 2 * MESSAGE_OVERHEAD_CHARS
    assert view_chars([]) == 0


# -- budgets ------------------------------------------------------------------------------


def test_default_budget_is_a_sixth_of_the_window() -> None:
    assert default_message_budget(32_768) == 5_461
    assert default_message_budget(6) == 1
    assert default_message_budget(5) == 0


def test_a_configured_budget_overrides_the_window_sixth() -> None:
    assert message_budget(32_768, configured=1_000) == 1_000
    assert message_budget(32_768, configured=0) == 5_461
    assert message_budget(32_768, configured=-5) == 5_461


# -- truncation ---------------------------------------------------------------------------


def test_a_tool_result_exactly_at_the_budget_is_sent_whole() -> None:
    result = msg("tool", "x" * 200, name="read")
    [view] = truncate_oversized([result], budget_tokens=100, estimate_chars_to_tokens=half)
    assert view is result


def test_a_tool_result_one_char_over_the_budget_is_cut() -> None:
    result = msg("tool", "x" * 201, name="read")
    [view] = truncate_oversized([result], budget_tokens=100, estimate_chars_to_tokens=half)
    assert view is not result
    assert "[…truncated ~" in view.content
    assert half(message_chars(view)) <= 100


def test_truncation_keeps_head_and_tail_around_the_marker() -> None:
    content = "HEAD" + "m" * 10_000 + "TAIL"
    [view] = truncate_oversized([msg("tool", content)], budget_tokens=500, estimate_chars_to_tokens=half)
    head, marker_and_tail = view.content.split("\n[…truncated ~", 1)
    count, tail = marker_and_tail.split(" tokens…]\n", 1)
    assert head.startswith("HEAD") and tail.endswith("TAIL")
    assert abs(len(head) - len(tail)) <= 1
    assert int(count) == half(len(content) - len(head) - len(tail))
    assert half(message_chars(view)) <= 500


def test_the_stored_message_is_never_mutated() -> None:
    content = "y" * 50_000
    stored = msg("assistant", content, seq=7, images=[b"img"])
    [view] = truncate_oversized([stored], budget_tokens=100, estimate_chars_to_tokens=half)
    assert stored.content == content
    assert view.seq == 7 and list(view.images) == [b"img"]


def test_user_messages_and_summaries_are_never_cut() -> None:
    user = msg("user", "u" * 50_000)
    summary = msg("user", "s" * 50_000, is_summary=True)
    view = truncate_oversized([user, summary], budget_tokens=100, estimate_chars_to_tokens=half)
    assert view[0] is user and view[1] is summary


def test_a_megabyte_tool_result_is_cut_to_the_budget() -> None:
    huge = msg("tool", "z" * 1_000_000, name="cat")
    [view] = truncate_oversized([huge], budget_tokens=5_461, estimate_chars_to_tokens=half)
    assert half(message_chars(view)) <= 5_461
    assert len(view.content) > 10_000  # most of the budget is still used


def test_tool_calls_stay_whole_when_an_assistant_message_is_cut() -> None:
    args = json.dumps({"path": "/a/b.py"})
    m = msg("assistant", "w" * 10_000, tool_calls=[ToolCall(name="read", arguments_json=args)])
    [view] = truncate_oversized([m], budget_tokens=200, estimate_chars_to_tokens=half)
    assert view.tool_calls[0].arguments_json == args
    assert half(message_chars(view)) <= 200


def test_a_zero_budget_disables_truncation() -> None:
    m = msg("tool", "q" * 10_000)
    assert truncate_oversized([m], budget_tokens=0, estimate_chars_to_tokens=half)[0] is m


def test_untouched_messages_keep_their_order() -> None:
    messages = [msg("user", "a"), msg("tool", "b" * 5_000), msg("assistant", "c")]
    view = truncate_oversized(messages, budget_tokens=100, estimate_chars_to_tokens=half)
    assert [v.role for v in view] == ["user", "tool", "assistant"]
    assert view[0] is messages[0] and view[2] is messages[2]


# -- Ollama's wire format -----------------------------------------------------------------


def test_ollama_messages_carry_role_content_and_base64_images() -> None:
    [out] = to_ollama_messages([msg("user", "look", images=[b"\x89PNG"])])
    assert out == {"role": "user", "content": "look", "images": [base64.b64encode(b"\x89PNG").decode()]}


def test_ollama_tool_calls_carry_parsed_arguments() -> None:
    m = msg("assistant", "", tool_calls=[ToolCall(id="c1", name="read", arguments_json='{"path": "/x"}')])
    [out] = to_ollama_messages([m])
    assert out["tool_calls"] == [{"function": {"name": "read", "arguments": {"path": "/x"}}}]


def test_arguments_that_are_not_a_json_object_are_passed_raw() -> None:
    bad = msg("assistant", "", tool_calls=[ToolCall(name="a", arguments_json="{not json")])
    listy = msg("assistant", "", tool_calls=[ToolCall(name="b", arguments_json="[1, 2]")])
    empty = msg("assistant", "", tool_calls=[ToolCall(name="c", arguments_json="")])
    outs = to_ollama_messages([bad, listy, empty])
    assert outs[0]["tool_calls"][0]["function"]["arguments"] == {"raw": "{not json"}
    assert outs[1]["tool_calls"][0]["function"]["arguments"] == {"raw": "[1, 2]"}
    assert outs[2]["tool_calls"][0]["function"]["arguments"] == {}


def test_tool_results_name_their_tool_and_thinking_is_not_sent() -> None:
    outs = to_ollama_messages([msg("tool", "42", name="calc"), msg("assistant", "ok", thinking="hmm")])
    assert outs[0] == {"role": "tool", "content": "42", "tool_name": "calc"}
    assert outs[1] == {"role": "assistant", "content": "ok"}


def test_the_wire_format_is_plain_json() -> None:
    m = msg("assistant", "x", images=[b"\x00\x01"], tool_calls=[ToolCall(name="t", arguments_json='{"a":1}')])
    json.dumps(to_ollama_messages([m]))


def test_the_official_ollama_client_accepts_the_messages() -> None:
    messages = [
        msg("user", "read it"),
        msg("assistant", "", tool_calls=[ToolCall(name="read", arguments_json='{"path": "/x"}')]),
        msg("tool", "contents", name="read"),
    ]
    for out in to_ollama_messages(messages):
        parsed = ollama.Message.model_validate(out)
        assert parsed.role == out["role"]

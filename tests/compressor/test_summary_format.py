"""The summarizer's input: previews, critical results, images within budget, the 32k cap, KEYS."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from palimpsest.compressor.summary_format import (
    ENOUGH_DIVISOR,
    MAX_SUMMARY_INPUT_CHARS,
    META_SUMMARY_PROMPT,
    META_SUMMARY_THRESHOLD,
    SUMMARY_PROMPT,
    cap_text,
    critical_result_text,
    format_for_summary,
    needs_meta_summary,
    split_keys_line,
    split_summaries,
    summary_messages,
)
from palimpsest.compressor.summary_window import input_limit
from palimpsest.v1.common_pb2 import Message, ToolCall


def msg(role: str, content: str = "", **kw: object) -> Message:
    return Message(role=role, content=content, **kw)  # type: ignore[arg-type]


def png(side: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (side, side)).save(out, format="PNG")
    return out.getvalue()


def text_of(*messages: Message, critical_tools: tuple[str, ...] = ()) -> str:
    return format_for_summary(list(messages), critical_tools=critical_tools, vision=False, window=32_768).text


def body(content: str) -> str:
    return "A" + content[1:-1] + "Z"


# -- meta-summary -------------------------------------------------------------------------


def test_several_summaries_over_10600_chars_need_a_meta_summary() -> None:
    summaries = [msg("user", "s" * 5_301, is_summary=True), msg("user", "s" * 5_300, is_summary=True)]
    assert needs_meta_summary(summaries + [msg("user", "hi")])


def test_several_summaries_of_exactly_10600_chars_do_not() -> None:
    summaries = [msg("user", "s" * 5_300, is_summary=True), msg("user", "s" * 5_300, is_summary=True)]
    assert sum(len(m.content) for m in summaries) == META_SUMMARY_THRESHOLD
    assert not needs_meta_summary(summaries)


def test_one_long_summary_needs_no_meta_summary() -> None:
    assert not needs_meta_summary([msg("user", "s" * 50_000, is_summary=True)])


def test_split_summaries_separates_them_in_order() -> None:
    a, b = msg("user", "a", is_summary=True), msg("user", "b", is_summary=True)
    u = msg("user", "u")
    assert split_summaries([a, u, b]) == ([a, b], [u])


# -- tool calls and results ---------------------------------------------------------------


def test_tool_call_arguments_of_120_chars_are_shown_whole() -> None:
    args = '"' + "a" * 118 + '"'
    text = text_of(msg("assistant", "", tool_calls=[ToolCall(name="write", arguments_json=args)]))
    assert f"write({args})" in text


def test_tool_call_arguments_of_121_chars_are_cut_to_120() -> None:
    args = '"' + "a" * 119 + '"'
    text = text_of(msg("assistant", "", tool_calls=[ToolCall(name="write", arguments_json=args)]))
    assert f"write({args[:120]}…)" in text
    assert args not in text


def test_a_critical_result_of_3999_chars_is_verbatim() -> None:
    content = body("c" * 3_999)
    assert content in text_of(msg("tool", content, name="x", is_compression_critical=True))


def test_a_critical_result_of_4000_chars_is_verbatim() -> None:
    content = body("c" * 4_000)
    assert content in text_of(msg("tool", content, name="x", is_compression_critical=True))


def test_a_critical_result_of_4001_chars_keeps_2000_head_and_2000_tail() -> None:
    content = "H" * 2_000 + "M" + "T" * 2_000
    assert len(content) == 4_001
    out = critical_result_text(content)
    assert out == "H" * 2_000 + "\n[… 1 chars omitted …]\n" + "T" * 2_000
    assert content not in text_of(msg("tool", content, name="x", is_compression_critical=True))


def test_a_tool_named_critical_by_the_profile_is_kept_verbatim() -> None:
    content = body("k" * 3_000)
    assert content in text_of(msg("tool", content, name="read_config"), critical_tools=("read_config",))


def test_an_ordinary_result_of_800_chars_is_shown_whole() -> None:
    content = body("p" * 800)
    assert content in text_of(msg("tool", content, name="ls"))


def test_an_ordinary_result_of_801_chars_is_an_800_char_preview() -> None:
    content = body("p" * 801)
    text = text_of(msg("tool", content, name="ls"))
    assert content[:800] + "… [1 more chars]" in text
    assert content not in text


def test_thinking_is_not_given_to_the_summarizer() -> None:
    assert "secret plan" not in text_of(msg("assistant", "answer", thinking="secret plan"))


def test_roles_and_summaries_are_labelled() -> None:
    text = text_of(msg("user", "q"), msg("assistant", "a"), msg("user", "old", is_summary=True))
    assert "User: q" in text and "Assistant: a" in text and "Earlier summary: old" in text


# -- images -------------------------------------------------------------------------------


def test_images_are_collected_while_their_price_fits_a_quarter_of_the_window() -> None:
    # 1024² costs 1026 tokens; a 4,104-token window gives a budget of exactly 1,026.
    messages = [msg("user", "look", images=[png(1024)]), msg("user", "and", images=[png(1024)])]
    out = format_for_summary(messages, vision=True, window=4_104)
    assert len(out.images) == 1 and out.omitted_images == 1


def test_an_image_one_token_over_the_budget_is_left_out() -> None:
    out = format_for_summary([msg("user", "look", images=[png(1024)])], vision=True, window=4_103)
    assert out.images == [] and out.omitted_images == 1


def test_left_out_images_are_still_noted_in_the_text() -> None:
    out = format_for_summary([msg("user", "look", images=[png(64), png(64)])], vision=True, window=100)
    assert "[+ 2 image(s)]" in out.text and out.omitted_images == 2


def test_a_model_without_vision_gets_no_images_but_their_count() -> None:
    out = format_for_summary([msg("user", "x", images=[png(64)])], vision=False, window=1_000_000)
    assert out.images == [] and out.omitted_images == 1
    assert "[+ 1 image(s)]" in out.text


# -- the 32,000-char cap ------------------------------------------------------------------


def test_text_of_32000_chars_is_not_cut() -> None:
    text = "x" * MAX_SUMMARY_INPUT_CHARS
    assert cap_text(text) == text


def test_text_over_32000_chars_keeps_75_percent_head_and_25_percent_tail() -> None:
    text = "H" * 30_000 + "T" * 30_000
    out = cap_text(text)
    assert len(out) == MAX_SUMMARY_INPUT_CHARS
    head, _, tail = out.partition("\n[… ")
    tail = tail.split(" …]\n", 1)[1]
    assert head == "H" * len(head) and tail == "T" * len(tail)
    assert abs(len(head) / (len(head) + len(tail)) - 0.75) < 0.001


def test_a_long_history_is_capped_but_its_newest_messages_survive() -> None:
    messages = [msg("user", f"message {i} " + "." * 1_000) for i in range(100)]
    text = text_of(*messages)
    assert len(text) <= MAX_SUMMARY_INPUT_CHARS
    assert "message 0 " in text and "message 99 " in text
    assert "message 50 " not in text


# -- the prompt and its KEYS line ---------------------------------------------------------


def test_the_prompt_asks_for_bullets_and_a_keys_line() -> None:
    assert "bullet" in SUMMARY_PROMPT and "KEYS:" in SUMMARY_PROMPT


def test_the_keys_line_is_removed_and_split() -> None:
    text, keys = split_keys_line("- did a\n- did b\nKEYS: /etc/app.conf, make deploy, JIRA-12")
    assert text == "- did a\n- did b"
    assert keys == ["/etc/app.conf", "make deploy", "JIRA-12"]


def test_only_the_last_keys_line_is_taken() -> None:
    text, keys = split_keys_line("KEYS: early\n- work\nkeys: late, later")
    assert keys == ["late", "later"]
    assert text == "KEYS: early\n- work"


def test_a_summary_without_keys_comes_back_unchanged() -> None:
    original = "- nothing to key\n\n"
    assert split_keys_line(original) == (original, [])


def test_a_comma_inside_a_number_does_not_split_a_key() -> None:
    _, keys = split_keys_line("- x\n**KEYS:** 1,000 ms, $12.50; budget")
    assert keys == ["1,000 ms", "$12.50", "budget"]


def test_keys_none_means_no_keys() -> None:
    assert split_keys_line("- x\nKEYS: none") == ("- x", [])


# -- the summary's window -----------------------------------------------------------------


def chars_over_2(messages) -> int:
    """A stand-in for the pricing: two chars per token, with images at 500 each."""
    return sum(len(m.content) for m in messages) // 2 + 500 * sum(len(m.images) for m in messages)


def test_an_input_that_fits_the_window_is_not_cut() -> None:
    messages = [msg("user", "u" * 1_000), msg("assistant", "a" * 1_000)]
    out = format_for_summary(
        messages, vision=False, window=8_192, prompt=SUMMARY_PROMPT, summary_max_tokens=2_000, estimate=chars_over_2
    )
    assert out.text == text_of(*messages) and out.omitted_chars == 0


def test_an_input_too_big_for_the_window_is_cut_until_prompt_and_summary_fit() -> None:
    messages = [msg("user", f"message {i} " + "." * 1_000) for i in range(20)]
    out = format_for_summary(
        messages, vision=False, window=4_096, prompt=SUMMARY_PROMPT, summary_max_tokens=6_000, estimate=chars_over_2
    )
    priced = chars_over_2(summary_messages(SUMMARY_PROMPT, out.text))
    limit = input_limit(4_096, 6_000)
    # No more is cut than the search's aim leaves (a sixty-fourth under the limit, so a guess that
    # lands a little high still fits with one count).
    assert limit - limit // ENOUGH_DIVISOR <= priced <= limit
    # The cut the 32,000-char cap makes: oldest and newest kept, and the text says what went.
    assert "message 0 " in out.text and "message 19 " in out.text and "message 10 " not in out.text
    assert f"[… {out.omitted_chars} chars omitted …]" in out.text


def test_the_meta_summary_input_is_cut_to_the_window_too() -> None:
    summaries = [msg("user", f"summary {i} " + "s" * 6_000, is_summary=True) for i in range(3)]
    out = format_for_summary(
        summaries,
        vision=False,
        window=4_096,
        prompt=META_SUMMARY_PROMPT,
        summary_max_tokens=1_000,
        estimate=chars_over_2,
    )
    assert chars_over_2(summary_messages(META_SUMMARY_PROMPT, out.text)) <= input_limit(4_096, 1_000)
    assert "summary 0 " in out.text and out.omitted_chars > 0


def test_images_give_way_when_prompt_and_images_leave_no_room_for_the_words() -> None:
    # Two images fit a quarter of the window, but with the prompt they leave no room for any text.
    messages = [msg("user", "look " * 100, images=[png(64), png(64)])]
    limit = input_limit(4_200, 3_000)
    prompt = "p" * (2 * (limit - 1_000) - 20)
    out = format_for_summary(
        messages, vision=True, window=4_200, prompt=prompt, summary_max_tokens=3_000, estimate=chars_over_2
    )
    assert out.images == [] and out.omitted_images == 2 and "look" in out.text


def test_a_prompt_that_alone_fills_the_window_is_an_error_not_a_silent_cut() -> None:
    with pytest.raises(ValueError, match="fills the summary's window"):
        format_for_summary(
            [msg("user", "hello")],
            vision=False,
            window=1_000,
            prompt="p" * 10_000,
            summary_max_tokens=100,
            estimate=chars_over_2,
        )

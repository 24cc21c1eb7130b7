"""Prompt-token estimates over the view the model is sent, and the window arithmetic around them."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from palimpsest.compressor.calibration import Line
from palimpsest.compressor.token_estimate import (
    Estimate,
    baseline_delta_estimate,
    estimate_tokens,
    fits,
    output_reserve,
)
from palimpsest.shared.context_view import MESSAGE_OVERHEAD_CHARS
from palimpsest.v1.common_pb2 import Message


def msg(role: str, content: str = "", seq: int = 0, **kw: object) -> Message:
    return Message(role=role, content=content, seq=seq, **kw)  # type: ignore[arg-type]


def png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height)).save(out, format="PNG")
    return out.getvalue()


# -- estimate_tokens ----------------------------------------------------------------------


def test_text_without_a_line_is_priced_at_1_8_chars_per_token() -> None:
    messages = [msg("user", "a" * (1800 - MESSAGE_OVERHEAD_CHARS))]
    est = estimate_tokens(messages, None)
    assert est == Estimate(tokens=1000, text_tokens=1000, image_tokens=0, chars=1800)


def test_text_with_a_line_includes_its_overhead() -> None:
    line = Line(overhead=500, tokens_per_char=0.5)
    messages = [msg("user", "a" * (2000 - MESSAGE_OVERHEAD_CHARS))]
    assert estimate_tokens(messages, line).tokens == 1500


def test_an_empty_context_costs_nothing() -> None:
    assert estimate_tokens([], Line(overhead=500, tokens_per_char=0.5)).tokens == 0


def test_each_image_is_priced_by_its_own_size() -> None:
    small, big = png(512, 512), png(1024, 1024)
    est = estimate_tokens([msg("user", "", images=[small, big])], None)
    assert est.image_tokens == 258 + 1026  # 16×16+2 and 32×32+2 patches
    assert est.tokens == est.text_tokens + est.image_tokens


def test_an_unreadable_image_costs_the_fallback() -> None:
    est = estimate_tokens([msg("user", "", images=[b"not an image"])], None, image_fallback=777)
    assert est.image_tokens == 777


def test_a_megabyte_tool_result_is_priced_as_the_truncated_view() -> None:
    huge = [msg("user", "cat the log"), msg("tool", "x" * 1_000_000, name="cat")]
    raw = estimate_tokens(huge, None)
    viewed = estimate_tokens(huge, None, budget_tokens=5_000)
    assert raw.tokens > 500_000
    assert viewed.tokens < 5_100
    assert huge[1].content == "x" * 1_000_000


# -- baseline + delta ---------------------------------------------------------------------


def test_baseline_plus_delta_prices_only_rows_after_the_baseline() -> None:
    context = [msg("user", "a" * 1000, seq=1), msg("assistant", "b" * 1000, seq=2), msg("user", "c" * 171, seq=3)]
    est = baseline_delta_estimate(context, baseline_tokens=4_000, through_seq=2, line=None)
    assert est.baseline_tokens == 4_000
    assert est.chars == 171 + MESSAGE_OVERHEAD_CHARS
    assert est.tokens == 4_000 + 100


def test_the_delta_does_not_pay_the_prompt_overhead_again() -> None:
    line = Line(overhead=900, tokens_per_char=0.6)  # steeper than chars / 1.8: the line's rate prices it
    context = [msg("user", "a" * (200 - MESSAGE_OVERHEAD_CHARS), seq=5)]
    assert baseline_delta_estimate(context, 3_000, through_seq=4, line=line).tokens == 3_120


def test_unmeasured_messages_are_never_priced_below_the_heuristic() -> None:
    # A prose line (0.2 tokens a char) must not price a new dense log: until a report covers it,
    # the delta costs at least chars / 1.8.
    line = Line(overhead=300, tokens_per_char=0.2)
    context = [msg("tool", "x" * (1800 - MESSAGE_OVERHEAD_CHARS), seq=5)]
    assert baseline_delta_estimate(context, 3_000, through_seq=4, line=line).tokens == 4_000


def test_the_incoming_message_is_added_to_the_delta() -> None:
    incoming = [msg("user", "", images=[png(1024, 1024)])]
    est = baseline_delta_estimate([], 2_000, through_seq=9, line=None, incoming=incoming)
    assert est.image_tokens == 1026
    assert est.tokens == 2_000 + est.text_tokens + 1026


def test_no_new_rows_means_the_baseline_itself() -> None:
    context = [msg("user", "hello", seq=1)]
    assert baseline_delta_estimate(context, 1_234, through_seq=1, line=None).tokens == 1_234


def test_the_delta_is_priced_through_the_truncated_view() -> None:
    context = [msg("tool", "x" * 1_000_000, seq=8, name="cat")]
    est = baseline_delta_estimate(context, 1_000, through_seq=7, line=None, budget_tokens=5_000)
    assert est.tokens < 1_000 + 5_100


# -- output reserve and fit ---------------------------------------------------------------


def test_the_output_reserve_is_2048_on_a_normal_window() -> None:
    assert output_reserve(32_768) == 2048


def test_the_output_reserve_is_capped_at_a_quarter_of_the_window() -> None:
    assert output_reserve(4_000) == 1_000
    assert output_reserve(8_192) == 2048
    assert output_reserve(8_188) == 2047


def test_a_prompt_exactly_at_window_minus_reserve_fits() -> None:
    assert fits(32_768 - 2048, 32_768)
    assert not fits(32_768 - 2047, 32_768)


def test_a_small_window_keeps_three_quarters_for_the_prompt() -> None:
    assert fits(3_000, 4_000)
    assert not fits(3_001, 4_000)


@pytest.mark.parametrize("window", [2_048, 8_192, 131_072])
def test_reserve_never_exceeds_a_quarter(window: int) -> None:
    assert output_reserve(window, reserve=10**9) == window // 4


def test_a_small_windows_target_keeps_the_hysteresis_gap() -> None:
    from palimpsest.compressor.pipeline import effective_target
    from palimpsest.compressor.pricing import Knobs
    from palimpsest.shared.settings import Settings

    knobs = Knobs.resolve(Settings(), None)
    assert effective_target(knobs, 100_000) == 0.65  # the reserve is 2% there: nothing moves
    # 8,192: the reserve (2,048) puts the trigger at 75%, so the target drops to 50%.
    assert abs(effective_target(knobs, 8192) - 0.50) < 1e-9


# -- proven cuts ----------------------------------------------------------------------------


def test_a_report_below_the_contents_own_count_proves_a_cut() -> None:
    from palimpsest.shared.reports import proves_cut

    assert proves_cut(4_098, 7_900)  # half a window, far under the content alone
    assert not proves_cut(7_900, 7_900) and not proves_cut(7_750, 7_900)  # a merge or two at the seams
    assert not proves_cut(3_770, 0)  # no exact count: nothing is proven


# -- Pricing.added: the measure that adds up ------------------------------------------------


def _pricings():
    """Each way a prompt is priced, with a fixed cost of its own: the chars / 1.8 fallback, a
    calibrated line (a large intercept, and a negative one), per-class rates with a margin, and
    the model's own vocabulary with the template's constants and an unobserved margin."""
    from dataclasses import replace

    from ollama_sim.vocabulary import QWEN3_6, tokenizer_metadata
    from palimpsest.compressor.calibration import Rates
    from palimpsest.compressor.model_tokenizers import TokenCounter
    from palimpsest.compressor.pricing import Knobs, Pricing
    from palimpsest.compressor.vocabulary import build_tokenizer
    from palimpsest.shared.settings import Settings
    from palimpsest.v1 import compressor_pb2

    knobs = Knobs.resolve(Settings(), compressor_pb2.CompressionSettings())
    plain = Pricing.build([], 8_192, knobs)
    counter = TokenCounter(build_tokenizer(tokenizer_metadata(QWEN3_6)), "exact")
    return {
        "fallback": plain,
        "line, intercept 500": replace(plain, line=Line(500, 0.3)),
        "line, intercept -40": replace(plain, line=Line(-40, 0.6)),
        "rates": replace(plain, rates=Rates(480.0, 6.0, (0.1, 0.5, 0.25, 1.1, 0.6, 0.7), 30, 12)),
        "exact": Pricing.build([], 8_192, knobs, counter=counter),
    }


_PRICINGS: dict = {}


def pricing_named(name: str):
    if not _PRICINGS:
        _PRICINGS.update(_pricings())
    return _PRICINGS[name]


_TEXTS = st.sampled_from(
    [
        "The rollout keeps the old billing path warm until the error budget recovers. ",
        "计费服务迁移到新集群后，错误预算恢复前保留旧路径。",
        '{"id": "7f3a", "latency_ms": 12.5, "tags": ["a", "b"]}\n',
        "10:42:07 ERROR worker-3 reset id=0x0042af17 after 3 retries\n",
        "def step(ctx):\n    return ctx.call('fetch', retries=3)\n",
        "👩‍💻🚀 ✅ ",
        "   \n\t",
    ]
)
_MESSAGES = st.lists(
    st.builds(
        lambda role, parts, times: msg(role, "".join(parts) * times),
        st.sampled_from(["user", "assistant", "tool", "system"]),
        st.lists(_TEXTS, min_size=1, max_size=4),
        st.integers(1, 60),
    ),
    max_size=5,
)


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["fallback", "line, intercept 500", "line, intercept -40", "rates", "exact"]),
    _MESSAGES,
    _MESSAGES,
)
def test_what_messages_add_adds_up_and_the_fixed_cost_is_paid_once(name, first, second):
    """Whatever the pricing and the content: what two lists add together is what each adds (each
    count rounds up once), nothing adds less than nothing, and a whole estimate is what the
    messages add plus one fixed cost, the same for every list."""
    priced = pricing_named(name)
    both = priced.added([*first, *second])
    assert priced.added([]) == 0 and both >= 0
    parts = priced.added(first) + priced.added(second)
    # Per-class rates are held to at least a token per six characters of what they price: a list
    # of whitespace alone is lifted to that floor, which the same list beside prose is not. So the
    # parts may exceed the whole by the lift, never fall under it.
    lift = sum(-(-len(m.content) // 6) for m in [*first, *second]) if name == "rates" else 0
    slack = 2 + len(first) + len(second)  # each count rounds up once
    assert -slack - lift <= both - parts <= slack
    if first and second and priced.estimate(first) > 0 and priced.estimate(second) > 0:
        fixed = priced.estimate(first) - priced.added(first)
        assert abs(priced.estimate(second) - priced.added(second) - fixed) <= 2

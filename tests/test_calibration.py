"""The chars → real tokens line: when it may be fitted, when it is refused, what it predicts."""

from __future__ import annotations

import pytest

from services.compressor.calibration import (
    FALLBACK_CHARS_PER_TOKEN,
    OBSERVATION_WINDOW,
    Line,
    Observation,
    estimate_text_tokens,
    fallback_tokens,
    fit_line,
    marginal_text_tokens,
)


def obs(chars: int, tokens: int) -> Observation:
    return Observation(chars=chars, tokens=tokens)


def on_line(chars: int, overhead: float = 300, slope: float = 0.5) -> Observation:
    return obs(chars, round(overhead + chars * slope))


def test_two_observations_on_a_line_give_that_line() -> None:
    line = fit_line([on_line(10_000), on_line(20_000)])
    assert line is not None
    assert line.tokens_per_char == pytest.approx(0.5)
    assert line.overhead == pytest.approx(300)


def test_spread_of_1_25x_is_enough_for_a_line() -> None:
    assert fit_line([on_line(10_000), on_line(12_500)]) is not None


def test_spread_of_1_24x_is_not_enough_for_a_line() -> None:
    assert fit_line([on_line(10_000), on_line(12_400)]) is None


def test_many_observations_of_the_same_size_give_no_line() -> None:
    assert fit_line([on_line(10_000)] * 8) is None


def test_a_single_observation_gives_no_line() -> None:
    assert fit_line([on_line(10_000)]) is None
    assert fit_line([]) is None


def test_spread_counts_between_any_two_observations_not_neighbours() -> None:
    # 1.1x steps, but the smallest and largest are 1.33x apart.
    line = fit_line([on_line(10_000), on_line(11_000), on_line(12_100), on_line(13_310)])
    assert line is not None


def test_slope_of_exactly_one_token_per_six_chars_is_accepted() -> None:
    line = fit_line([obs(6_000, 1_000), obs(12_000, 2_000)])
    assert line is not None and line.tokens_per_char == pytest.approx(1 / 6)


def test_slope_just_below_one_token_per_six_chars_is_rejected() -> None:
    # slope 0.166
    assert fit_line([obs(10_000, 1_660), obs(20_000, 3_320)]) is None


def test_slope_just_above_one_token_per_six_chars_is_accepted() -> None:
    assert fit_line([obs(10_000, 1_670), obs(20_000, 3_340)]) is not None


def test_english_prose_under_the_qwen_vocabulary_gives_a_usable_line() -> None:
    # Measured with the simulator: a growing English chat, tool schemas in the fixed overhead.
    assert fit_line([obs(3_788, 2_114), obs(6_347, 2_648)]) is not None


def test_slope_of_exactly_one_token_per_char_is_accepted() -> None:
    line = fit_line([obs(1_000, 1_000), obs(2_000, 2_000)])
    assert line is not None and line.tokens_per_char == pytest.approx(1.0)


def test_slope_just_below_one_token_per_char_is_accepted() -> None:
    assert fit_line([obs(10_000, 9_990), obs(20_000, 19_980)]) is not None


def test_slope_just_above_one_token_per_char_is_rejected() -> None:
    assert fit_line([obs(10_000, 10_010), obs(20_000, 20_020)]) is None


def test_a_truncated_prompt_report_bends_the_slope_out_of_range() -> None:
    # A 40k-char prompt reported at half a 8k window: tokens went down as chars went up.
    assert fit_line([obs(10_000, 5_000), obs(40_000, 4_096)]) is None


def test_only_the_last_8_observations_count() -> None:
    old = [on_line(c, slope=0.9) for c in (1_000, 50_000, 90_000)]
    recent = [on_line(10_000 + 1_000 * i, slope=0.4) for i in range(OBSERVATION_WINDOW)]
    line = fit_line(old + recent)
    assert line is not None
    assert line.tokens_per_char == pytest.approx(0.4, abs=1e-3)


def test_the_ninth_newest_observation_cannot_provide_the_spread() -> None:
    # Only the oldest of nine differs in size; the newest eight are all the same size.
    assert fit_line([on_line(5_000)] + [on_line(10_000)] * 8) is None


def test_newest_observations_are_last_in_the_input() -> None:
    # The same nine observations reversed: now the different one is among the newest eight.
    assert fit_line([on_line(10_000)] * 8 + [on_line(5_000)]) is not None


def test_zero_sized_observations_are_ignored() -> None:
    assert fit_line([obs(0, 0), on_line(10_000)]) is None


def test_least_squares_averages_noisy_observations() -> None:
    line = fit_line([obs(10_000, 5_290), obs(20_000, 10_310), obs(15_000, 7_800)])
    assert line is not None
    assert 0.45 < line.tokens_per_char < 0.55


def test_without_a_line_the_estimate_is_chars_over_1_8_rounded_up() -> None:
    assert FALLBACK_CHARS_PER_TOKEN == 1.8
    assert estimate_text_tokens(18, None) == 10
    assert estimate_text_tokens(19, None) == 11
    assert estimate_text_tokens(18_000, None) == 10_000
    assert estimate_text_tokens(0, None) == 0


def test_with_a_line_the_estimate_follows_the_line() -> None:
    line = Line(overhead=300, tokens_per_char=0.5)
    assert estimate_text_tokens(10_000, line) == 5_300


def test_an_implausible_line_is_not_used() -> None:
    assert estimate_text_tokens(18_000, Line(overhead=0, tokens_per_char=3.0)) == 10_000


def test_marginal_tokens_leave_out_the_prompt_overhead() -> None:
    line = Line(overhead=300, tokens_per_char=0.5)
    assert marginal_text_tokens(1_000, line) == 500
    assert marginal_text_tokens(0, line) == 0
    assert marginal_text_tokens(18, None) == fallback_tokens(18) == 10


def test_a_negative_fitted_overhead_never_gives_negative_tokens() -> None:
    assert estimate_text_tokens(10, Line(overhead=-500, tokens_per_char=0.5)) == 0

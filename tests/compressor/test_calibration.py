"""The chars → real tokens line: when it may be fitted, when it is refused, what it predicts."""

from __future__ import annotations

import pytest

from palimpsest.compressor.calibration import (
    FALLBACK_CHARS_PER_TOKEN,
    OBSERVATION_WINDOW,
    Line,
    Observation,
    fit_line,
    line_tokens,
)
from palimpsest.shared.context_view import heuristic_tokens


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
    assert line_tokens(18, None, whole=True) == 10
    assert line_tokens(19, None, whole=True) == 11
    assert line_tokens(18_000, None, whole=True) == 10_000
    assert line_tokens(0, None, whole=True) == 0


def test_with_a_line_the_estimate_follows_the_line() -> None:
    line = Line(overhead=300, tokens_per_char=0.5)
    assert line_tokens(10_000, line, whole=True) == 5_300


def test_an_implausible_line_is_not_used() -> None:
    assert line_tokens(18_000, Line(overhead=0, tokens_per_char=3.0), whole=True) == 10_000


def test_marginal_tokens_leave_out_the_prompt_overhead() -> None:
    line = Line(overhead=300, tokens_per_char=0.5)
    assert line_tokens(1_000, line, whole=False) == 500
    assert line_tokens(0, line, whole=False) == 0
    assert line_tokens(18, None, whole=False) == heuristic_tokens(18) == 10


def test_a_negative_fitted_overhead_never_gives_negative_tokens() -> None:
    assert line_tokens(10, Line(overhead=-500, tokens_per_char=0.5), whole=True) == 0


# -- per character class ----------------------------------------------------------------------
from hypothesis import given  # noqa: E402
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from palimpsest.compressor.calibration import (  # noqa: E402
    CHAR_CLASSES,
    MIN_RATE_OBSERVATIONS,
    RATES_PRIOR,
    char_classes,
    fit_rates,
)

SAMPLES = {
    "prose": "The deployment finished after the migration; every worker picked up its lease again. ",
    "log": "2026-11-30T10:17:03.512Z ERROR 10.0.7.19 req=9f3a01c2 GET /v2/orders/88120 503 1204ms\n",
    "cjk": "计费服务迁移到新集群后，错误预算恢复前保留旧路径。設定ファイルを読み込みます。",
    "cyrillic": "Сервис биллинга перенесён на новый кластер, старый путь сохраняется. ",
    "json": '{"rows": [{"id": 48213, "status": "failed", "path": "/srv/app/17.py"}]}',
}
# A vocabulary's hidden price per class, unlike Qwen's (an English-only one: CJK is expensive).
HIDDEN = (0.3, 2.0, 0.24, 3.4, 2.4, 0.47)


def hidden_tokens(messages: int, classes) -> int:
    return round(40 + 6 * messages + sum(r * c for r, c in zip(HIDDEN, classes)))


def mix(parts: dict[str, int]) -> tuple[int, tuple[int, ...]]:
    text = "".join(SAMPLES[name] * n for name, n in parts.items())
    return sum(parts.values()), char_classes(text)


def test_char_classes_sort_every_character_into_one_class() -> None:
    assert char_classes("Hello wörld 123 — 计费服务。日本語 привет _x") == (6, 3, 11, 8, 6, 2)
    assert char_classes("２０２４年の売上") == (0, 4, 0, 4, 0, 0)  # a fullwidth digit is a digit, once
    assert char_classes("") == (0,) * len(CHAR_CLASSES)


@hsettings(max_examples=200, derandomize=True)
@given(st.text())
def test_char_classes_count_every_character_once(text: str) -> None:
    classes = char_classes(text)
    assert sum(classes) == len(text) and min(classes) >= 0


def test_rates_learned_on_some_mixes_price_another_mix_closely() -> None:
    """What one chars rate cannot do: learn on prose-and-log prompts, price a CJK-heavy one."""
    train = [
        mix({"prose": 20, "log": 5, "cjk": 2}),
        mix({"prose": 5, "log": 30, "cjk": 1}),
        mix({"prose": 40, "cyrillic": 3, "json": 4, "cjk": 3}),
        mix({"log": 10, "json": 20, "cyrillic": 8}),
        mix({"prose": 12, "cjk": 12, "log": 2}),
        mix({"prose": 60, "json": 2, "log": 9, "cyrillic": 1}),
        mix({"cyrillic": 15, "prose": 4}),
        mix({"json": 6, "cjk": 5, "cyrillic": 2}),
        mix({"log": 3, "cyrillic": 6, "prose": 30}),
        mix({"json": 12, "prose": 8, "log": 1}),
    ]
    rates = fit_rates([(m, c, hidden_tokens(m, c)) for m, c in train])
    assert rates is not None and rates.observed == len(train)
    for parts in ({"cjk": 40, "prose": 2}, {"log": 80}, {"cyrillic": 30, "json": 10}):
        messages, classes = mix(parts)
        real = hidden_tokens(messages, classes)
        assert abs(rates.whole(messages, classes) - real) / real < 0.02, parts
    # A single rate for every character, fitted on the same reports, misses the CJK prompt badly.
    line = fit_line([Observation(sum(c), hidden_tokens(m, c)) for m, c in train])
    messages, classes = mix({"cjk": 40, "prose": 2})
    assert abs(line.predict(sum(classes)) - hidden_tokens(messages, classes)) / hidden_tokens(messages, classes) > 0.2


def test_a_class_no_report_contained_keeps_its_cautious_prior() -> None:
    train = [mix({"prose": n, "log": 30 - n}) for n in (3, 10, 17, 25)]
    rates = fit_rates([(m, c, hidden_tokens(m, c)) for m, c in train])
    assert rates is not None
    assert rates.rates[CHAR_CLASSES.index("cjk")] == pytest.approx(RATES_PRIOR[2 + CHAR_CLASSES.index("cjk")])


def test_rates_never_count_low_on_the_reports_they_learned_from() -> None:
    noisy = [mix({"prose": n, "log": n % 7, "cjk": n % 3}) for n in range(2, 14)]
    reports = [(m, c, hidden_tokens(m, c) + (25 if i % 4 == 0 else -10)) for i, (m, c) in enumerate(noisy)]
    rates = fit_rates(reports)
    assert rates is not None and rates.margin > 0
    assert all(rates.whole(m, c) >= t for m, c, t in reports)


def test_too_few_reports_give_no_rates() -> None:
    reports = [(m, c, hidden_tokens(m, c)) for m, c in (mix({"prose": 3}), mix({"log": 4}))]
    assert MIN_RATE_OBSERVATIONS > len(reports) and fit_rates(reports) is None

"""A per-model line from prompt characters to real prompt tokens.

Ollama reports the true ``prompt_eval_count`` after every call. Fitting
``tokens ≈ overhead + chars × tokens_per_char`` to the newest of those reports lets every window
decision be made in real tokens instead of a character rule of thumb. Observations are plain data
(the Compressor keeps them in the database, so any replica fits the same line).
"""

from __future__ import annotations

import functools
import math
import re
import statistics
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

from palimpsest.compressor.exact_count import solve_linear
from palimpsest.shared.context_view import HEURISTIC_CHARS_PER_TOKEN, heuristic_tokens

# Only the newest reports count: the chat template, system prompt and tool schemas drift with
# profile edits, and an old report describes a prompt that no longer exists.
OBSERVATION_WINDOW = 8

# Two sizes closer than this give a slope dominated by noise (a 5% size change moves the fitted
# slope by the whole measurement error), so no line is fitted from them.
MIN_SIZE_SPREAD = Fraction(125, 100)

# One token per six chars … one token per char (CJK, base64, dense JSON). A slope outside that range
# only comes from a prompt Ollama truncated server-side. Departure from the source's one token per
# four chars: with the Qwen3.6 vocabulary, English prose costs 0.18–0.21 tokens per char (measured
# with the simulator's tokenizer), so that bound rejected every honest line of an English
# conversation and left the estimate at chars / 1.8, about 3× too high — compression then fired at
# a third of the real window, forever.
MIN_TOKENS_PER_CHAR = 1 / 6
MAX_TOKENS_PER_CHAR = 1.0
# Least squares over integers can land a hair off an exact bound; that is not implausibility.
_SLOPE_TOLERANCE = 1e-9

FALLBACK_CHARS_PER_TOKEN = float(HEURISTIC_CHARS_PER_TOKEN)


@dataclass(frozen=True)
class Observation:
    """One real report: the prompt had ``chars`` characters and Ollama counted ``tokens``."""

    chars: int
    tokens: int


@dataclass(frozen=True)
class Line:
    """``tokens ≈ overhead + chars × tokens_per_char``; overhead is the prompt's fixed cost."""

    overhead: float
    tokens_per_char: float

    def predict(self, chars: int) -> float:
        return self.overhead + chars * self.tokens_per_char

    @property
    def is_plausible(self) -> bool:
        """True when the slope is within one token per six chars (``MIN_TOKENS_PER_CHAR``) … one per char."""
        return MIN_TOKENS_PER_CHAR - _SLOPE_TOLERANCE <= self.tokens_per_char <= MAX_TOKENS_PER_CHAR + _SLOPE_TOLERANCE


def _usable(line: Line | None) -> Line | None:
    return line if line is not None and line.is_plausible else None


def _has_spread(chars: Sequence[int]) -> bool:
    # Integer comparison: 1,000 vs 1,250 is exactly 1.25x and must count.
    low, high = min(chars), max(chars)
    return high * MIN_SIZE_SPREAD.denominator >= low * MIN_SIZE_SPREAD.numerator


def fit_line(observations: Sequence[Observation]) -> Line | None:
    return _fit_line(tuple(observations))


@functools.lru_cache(maxsize=256)  # the same newest reports are fitted on every size check
def _fit_line(observations: tuple[Observation, ...]) -> Line | None:
    """Least-squares line over the newest ``OBSERVATION_WINDOW`` observations (newest last).

    None when fewer than two of them differ in size by at least 1.25x, or when the fitted slope
    is implausible. Observations with no chars or no tokens are measurement errors and ignored.
    """
    recent = [o for o in list(observations)[-OBSERVATION_WINDOW:] if o.chars > 0 and o.tokens > 0]
    if len(recent) < 2 or not _has_spread([o.chars for o in recent]):
        return None
    n = len(recent)
    mean_x = sum(o.chars for o in recent) / n
    mean_y = sum(o.tokens for o in recent) / n
    var_x = sum((o.chars - mean_x) ** 2 for o in recent)
    cov_xy = sum((o.chars - mean_x) * (o.tokens - mean_y) for o in recent)
    slope = cov_xy / var_x  # var_x > 0: the spread check guarantees two distinct sizes
    return _usable(Line(overhead=mean_y - slope * mean_x, tokens_per_char=slope))


def line_tokens(chars: int, line: Line | None, *, whole: bool) -> int:
    """``chars`` characters priced at the line's rate, or at the fallback chars / 1.8 when no line is
    usable (``heuristic_tokens``: one definition, shared with the Agent, which cuts its view at that
    rate while the Compressor is away). ``whole``: a whole prompt, the line's fixed overhead
    included; else what the characters add to a prompt whose fixed cost is paid (a delta on top of
    a real baseline, or one message alone: the overhead there would charge the system prompt once
    per message)."""
    usable = _usable(line)
    if usable is None:
        return heuristic_tokens(chars)
    if whole:
        return max(0, math.ceil(usable.predict(chars)))
    return max(0, math.ceil(chars * usable.tokens_per_char))


def tokens_per_char(line: Line | None) -> float:
    """The marginal rate a line (or the chars / 1.8 fallback) prices text at."""
    usable = _usable(line)
    return usable.tokens_per_char if usable is not None else 1 / FALLBACK_CHARS_PER_TOKEN


# -- a price per character class ----------------------------------------------------------
# One chars-per-token rate cannot follow a change of content: the same tokenizer spends ~0.2
# tokens on a Latin letter, ~0.6 on a CJK character and 1 on a digit, so a line learned on prose
# was 9% off (median) on a conversation of logs and CJK. Pricing each class of characters apart,
# from the same reports, was 0.3–0.7% off on the same corpus, for the Qwen3.6 vocabulary and for
# an English-only one alike (bench/compressor.py).
CHAR_CLASSES = ("space", "digit", "latin", "cjk", "other_letter", "symbol")
_CJK_RANGES = "\u2e80-\u2fff\u3001-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef"
_LATIN_RANGES = "A-Za-z\u00c0-\u024f"
_CLASS_PATTERNS = (
    re.compile(r"\s"),
    re.compile(r"\d"),
    re.compile(f"[{_LATIN_RANGES}]"),
    re.compile(f"[{_CJK_RANGES}]"),
    re.compile(r"[^\W\d_]"),  # letters of every other script (what the classes before left)
)
# Before a class was seen in a report, it is priced high rather than low: an unknown vocabulary
# may spend three tokens on a CJK character it has no merge for. Order: overhead, per message,
# then CHAR_CLASSES.
RATES_PRIOR = (3.0, 5.0, 0.3, 1.0, 0.3, 1.5, 1.0, 1.0)
# How strongly the fit holds to the prior, relative to each feature's spread in the reports: weak
# enough that a few reports decide every class they contain.
RATES_RIDGE = 0.01
MIN_RATE_OBSERVATIONS = 3
MAX_RATES_MARGIN = 512


def char_classes(text: str) -> tuple[int, ...]:
    """How many characters of ``text`` fall in each of CHAR_CLASSES (symbols: all the rest). Each
    class takes its characters from what the classes before it left, so none is counted twice
    (a fullwidth digit is a digit, not CJK)."""
    if len(text) > CLASS_CACHE_MAX_CHARS:
        return _classes_of(text)
    key = (hash(text), len(text))  # long sessions price the same messages on every check
    found = _class_cache.get(key)
    if found is None:
        found = _class_cache[key] = _classes_of(text)
        if len(_class_cache) > CLASS_CACHE_ENTRIES:
            _class_cache.pop(next(iter(_class_cache)))
    return found


def _classes_of(text: str) -> tuple[int, ...]:
    counts, rest = [], text
    for pattern in _CLASS_PATTERNS:
        stripped = pattern.sub("", rest)
        counts.append(len(rest) - len(stripped))
        rest = stripped
    return (*counts, len(rest))


# Keyed by (hash, length), not by the text, so the cache never keeps a long text alive.
_class_cache: dict[tuple[int, int], tuple[int, ...]] = {}
CLASS_CACHE_ENTRIES = 20_000
CLASS_CACHE_MAX_CHARS = 200_000


def prompt_classes(texts: Sequence[str]) -> tuple[int, ...]:
    """The characters of all ``texts`` by class."""
    totals = [0] * len(CHAR_CLASSES)
    for text in texts:
        for i, count in enumerate(char_classes(text)):
            totals[i] += count
    return tuple(totals)


@dataclass(frozen=True)
class Rates:
    """``tokens ≈ overhead + per_message × messages + Σ rate × chars of the class``, fitted per
    model; ``margin`` is the worst under-count of the reports it was fitted on."""

    overhead: float
    per_message: float
    rates: tuple[float, ...]  # per CHAR_CLASSES
    margin: int
    observed: int

    def _raw(self, messages: int, classes: Sequence[int]) -> float:
        # Reports of one growing conversation are nearly collinear: single coefficients of the fit
        # may come out odd (a negative cost per message) while its predictions are right, so they
        # are not clamped one by one (measured: clamping made counts 6–10% high). Only the result
        # is kept plausible: never below one token per six characters.
        return max(
            self.per_message * messages + sum(r * c for r, c in zip(self.rates, classes)),
            sum(classes) * MIN_TOKENS_PER_CHAR,
        )

    def marginal(self, messages: int, classes: Sequence[int]) -> int:
        """What these messages add to a prompt whose fixed cost is paid."""
        return math.ceil(self._raw(messages, classes))

    def whole(self, messages: int, classes: Sequence[int]) -> int:
        """A whole prompt of these messages, its fixed cost and the safety margin included."""
        return max(0, math.ceil(self.overhead + self._raw(messages, classes))) + self.margin


def fit_rates(reports: Sequence[tuple[int, Sequence[int], int]]) -> Rates | None:
    """Rates from ``(messages, classes, tokens)`` reports (any order); None with fewer than
    MIN_RATE_OBSERVATIONS. A ridge fit toward RATES_PRIOR, each feature's penalty scaled by its
    spread, so a class no report contains keeps its prior and the rest follow the reports."""
    return _fit_rates(tuple((m, tuple(c), t) for m, c, t in reports))


@functools.lru_cache(maxsize=256)  # the same newest reports are fitted on every size check
def _fit_rates(reports: tuple[tuple[int, tuple[int, ...], int], ...]) -> Rates | None:
    usable = [r for r in reports if r[2] > 0 and sum(r[1]) > 0]
    if len(usable) < MIN_RATE_OBSERVATIONS:
        return None
    rows = [(1.0, float(m), *map(float, classes)) for m, classes, _ in usable]
    k = len(RATES_PRIOR)
    spread = [max(1.0, statistics.pstdev(row[i] for row in rows)) for i in range(k)]
    penalty = [RATES_RIDGE * s * s for s in spread]
    gram = [
        [sum(row[i] * row[j] for row in rows) + (penalty[i] if i == j else 0.0) for j in range(k)] for i in range(k)
    ]
    rhs = [sum(row[i] * t for row, (_, _, t) in zip(rows, usable)) + penalty[i] * RATES_PRIOR[i] for i in range(k)]
    w = solve_linear(gram, rhs)
    fitted = Rates(overhead=w[0], per_message=w[1], rates=tuple(w[2:]), margin=0, observed=len(usable))
    worst = max(t - fitted.whole(m, classes) for m, classes, t in usable)
    return Rates(
        fitted.overhead, fitted.per_message, fitted.rates, min(max(0, worst), MAX_RATES_MARGIN), fitted.observed
    )

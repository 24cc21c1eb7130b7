"""A per-model line from prompt characters to real prompt tokens.

Ollama reports the true ``prompt_eval_count`` after every call. Fitting
``tokens ≈ overhead + chars × tokens_per_char`` to the newest of those reports lets every window
decision be made in real tokens instead of a character rule of thumb. Observations are plain data
(the Compressor keeps them in the database, so any replica fits the same line).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

from services.shared.context_view import HEURISTIC_CHARS_PER_TOKEN, heuristic_tokens

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
        """True when the slope is within one token per four chars … one per char."""
        return (
            MIN_TOKENS_PER_CHAR - _SLOPE_TOLERANCE
            <= self.tokens_per_char
            <= MAX_TOKENS_PER_CHAR + _SLOPE_TOLERANCE
        )


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


# The estimate when no line is usable: chars / 1.8, rounded up (one definition, shared with the
# Agent, which cuts its view at this rate while the Compressor is away).
fallback_tokens = heuristic_tokens


def estimate_text_tokens(chars: int, line: Line | None) -> int:
    """Tokens of a whole prompt of ``chars`` characters (the line's overhead included)."""
    usable = _usable(line)
    if usable is None:
        return fallback_tokens(chars)
    return max(0, math.ceil(usable.predict(chars)))


def tokens_per_char(line: Line | None) -> float:
    """The marginal rate a line (or the chars / 1.8 fallback) prices text at."""
    usable = _usable(line)
    return usable.tokens_per_char if usable is not None else 1 / FALLBACK_CHARS_PER_TOKEN


def marginal_text_tokens(chars: int, line: Line | None) -> int:
    """Tokens that ``chars`` more characters add to a prompt whose fixed cost is already paid.

    Used for a delta on top of a real baseline and for sizing one message: adding the line's
    overhead there would charge the system prompt once per message.
    """
    if chars <= 0:
        return 0
    usable = _usable(line)
    if usable is None:
        return fallback_tokens(chars)
    return math.ceil(chars * usable.tokens_per_char)

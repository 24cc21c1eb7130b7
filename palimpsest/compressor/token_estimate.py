"""Real prompt tokens of a message list: the one estimator every window decision uses.

Text is priced through the model's calibrated line (chars / 1.8 without one), images one by one
from their headers, and always over the truncated view the model is sent, never the raw rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from palimpsest.compressor.calibration import (
    Line,
    Rates,
    line_tokens,
    prompt_classes,
)
from palimpsest.compressor.exact_count import Shape, message_texts
from palimpsest.shared.context_view import heuristic_tokens, heuristic_view, view_chars
from palimpsest.shared.image_tokens import DEFAULT_FALLBACK_TOKENS, image_tokens
from palimpsest.v1.common_pb2 import Message

# Headroom for the model's answer; a quarter of the window at most, so a deliberately small
# test or profile window does not fail every size check.
DEFAULT_OUTPUT_RESERVE = 2048
OUTPUT_RESERVE_WINDOW_DIVISOR = 4


@dataclass(frozen=True)
class Estimate:
    """Prompt tokens = baseline_tokens + text_tokens + image_tokens; chars are the priced text."""

    tokens: int
    text_tokens: int
    image_tokens: int
    chars: int
    baseline_tokens: int = 0
    shape: Shape | None = None  # set by an exact count


def priced_view(
    messages: Sequence[Message], budget_tokens: int | None, budgets: dict[int, int] | None = None
) -> list[Message]:
    """The view the model is sent when its tokenizer is unknown; ``budget_tokens=None`` prices the
    rows uncut. Cut at the fixed chars / 1.8 rate, never the calibrated line's: the line moves with
    every report, and a cut that moves changes old messages between two calls (measured: 7.8k more
    characters of old messages for 1.2k new ones), so the count of one call says nothing of the next."""
    if budget_tokens is None:
        return list(messages)
    return heuristic_view(messages, budget_tokens, budgets)


def _image_tokens(messages: Sequence[Message], image_fallback: int) -> int:
    return sum(image_tokens(image, image_fallback) for m in messages for image in m.images)


def _priced(
    messages: Sequence[Message],
    line: Line | None,
    image_fallback: int,
    budget_tokens: int | None,
    text_price: Callable[[Sequence[Message], int, Line | None, Rates | None], int],
    rates: Rates | None,
) -> Estimate:
    view = priced_view(messages, budget_tokens)
    chars = view_chars(view)
    text = text_price(view, chars, line, rates)
    images = _image_tokens(view, image_fallback)
    return Estimate(tokens=text + images, text_tokens=text, image_tokens=images, chars=chars)


def _classes(view: Sequence[Message]) -> tuple[int, ...]:
    return prompt_classes([text for m in view for text in message_texts(m)])


def whole_text_tokens(view: Sequence[Message], chars: int, line: Line | None, rates: Rates | None) -> int:
    """A whole prompt's text: by the per-class rates when the model has them, else by the line."""
    if rates is not None:
        return rates.whole(len(view), _classes(view))
    return line_tokens(chars, line, whole=True)


def estimate_tokens(
    messages: Sequence[Message],
    line: Line | None,
    image_fallback: int = DEFAULT_FALLBACK_TOKENS,
    budget_tokens: int | None = None,
    rates: Rates | None = None,
    *,
    whole: bool = True,
) -> Estimate:
    """Tokens of a whole prompt made of ``messages``, fixed prompt overhead included; without
    ``whole``, what they add to a prompt whose overhead is paid (the measure that adds up: a
    message alone, or the part pruning takes off).

    ``budget_tokens`` is the per-message view budget (``message_budget(window, configured)``);
    pass it whenever the messages will be sent through the Agent's view.
    """
    if not messages:
        return Estimate(tokens=0, text_tokens=0, image_tokens=0, chars=0)
    price = whole_text_tokens if whole else marginal_text_tokens
    return _priced(messages, line, image_fallback, budget_tokens, price, rates)


def marginal_text_tokens(view: Sequence[Message], chars: int, line: Line | None, rates: Rates | None) -> int:
    if rates is not None:
        return rates.marginal(len(view), _classes(view))
    return line_tokens(chars, line, whole=False)


def delta_estimate(
    messages: Sequence[Message],
    line: Line | None,
    image_fallback: int = DEFAULT_FALLBACK_TOKENS,
    budget_tokens: int | None = None,
    rates: Rates | None = None,
) -> Estimate:
    """Tokens that ``messages`` add to a prompt whose fixed overhead is already counted.

    No report has measured these messages yet, so they are priced at the calibrated rate or the
    heuristic chars / 1.8, whichever is higher: a dense log after a conversation of prose cost 3.6×
    the line's rate and, priced at it, let a prompt 7% past the size check's limit through. The
    next report makes them part of the baseline, so the caution lasts one call."""
    return _priced(messages, line, image_fallback, budget_tokens, cautious_tokens, rates)


def cautious_tokens(view: Sequence[Message], chars: int, line: Line | None, rates: Rates | None = None) -> int:
    return max(marginal_text_tokens(view, chars, line, rates), heuristic_tokens(chars))


def baseline_delta_estimate(
    context: Sequence[Message],
    baseline_tokens: int,
    through_seq: int,
    line: Line | None,
    image_fallback: int = DEFAULT_FALLBACK_TOKENS,
    budget_tokens: int | None = None,
    incoming: Sequence[Message] = (),
    rates: Rates | None = None,
) -> Estimate:
    """A real baseline plus the calibrated price of what came after it.

    ``baseline_tokens`` is the real prompt count of the call that covered the context through
    ``through_seq``; the rows with a larger seq and the ``incoming`` messages (not stored yet, so
    without a seq) are priced marginally: the baseline already paid the prompt's fixed cost.
    """
    delta = [m for m in context if m.seq > through_seq] + list(incoming)
    priced = delta_estimate(delta, line, image_fallback, budget_tokens, rates)
    baseline = max(0, baseline_tokens)
    return Estimate(
        tokens=baseline + priced.tokens,
        text_tokens=priced.text_tokens,
        image_tokens=priced.image_tokens,
        chars=priced.chars,
        baseline_tokens=baseline,
    )


def output_reserve(window: int, reserve: int = DEFAULT_OUTPUT_RESERVE) -> int:
    """Tokens kept free for the answer: ``reserve``, capped at a quarter of the window."""
    return max(0, min(reserve, window // OUTPUT_RESERVE_WINDOW_DIVISOR))


def trigger_tokens(threshold: float, window: int, reserve: int = DEFAULT_OUTPUT_RESERVE) -> float:
    """Where compression starts: the threshold share of the window, but never above the size check's
    limit. In a small window the output reserve (up to a quarter) sits below 90%, and a trigger
    above the limit would let a context fail the size check before compression ever ran."""
    return min(threshold * window, window - output_reserve(window, reserve))


def fits(tokens: int, window: int, reserve: int = DEFAULT_OUTPUT_RESERVE) -> bool:
    """True when a prompt of ``tokens`` leaves the output reserve free in ``window``."""
    return tokens <= window - output_reserve(window, reserve)

"""A guess of what a cut of the summarizer's input costs, from the counts of the messages it renders.

The input is the history rendered as text and cut (head, marker, tail) until the request fits the
summary's window. Counting a candidate exactly is one pass of the tokenizer over up to 32,000
characters (~10–20 ms), and a search that starts from one rate for the whole history needed two
to four of them. Each rendered block costs about what its message costs per character (counted
already: the store keeps it, or the size check's cache has it), so the cut that fits is guessed
closely from those rates, and counted exactly once to confirm it.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

from palimpsest.compressor.exact_count import call_text
from palimpsest.v1.common_pb2 import Message

# A character of a block whose message costs nothing measurable (an empty content): as in dense text.
DEFAULT_RATE = 0.5
SEPARATOR = "\n\n"


def block_rates(messages: Sequence[Message], costs: Sequence[int]) -> list[float]:
    """Tokens per character of each message's content and calls, from its count."""
    rates = []
    for m, cost in zip(messages, costs):
        chars = len(m.content) + sum(len(call_text(c.name, c.arguments_json)) for c in m.tool_calls)
        rates.append(cost / chars if chars and cost > 0 else DEFAULT_RATE)
    return rates


class RenderedCosts:
    """Tokens of a rendered text's first or last characters, each block at its message's rate."""

    def __init__(self, blocks: Sequence[str], rates: Sequence[float]) -> None:
        self.ends: list[int] = []  # where each block (with the separator after it) ends
        self.totals: list[float] = []  # the tokens up to there
        self.rates = list(rates)
        chars, tokens = 0, 0.0
        for i, (block, rate) in enumerate(zip(blocks, rates)):
            size = len(block) + (len(SEPARATOR) if i < len(blocks) - 1 else 0)
            chars += size
            tokens += size * rate
            self.ends.append(chars)
            self.totals.append(tokens)
        self.length = chars

    def prefix(self, chars: int) -> float:
        """Tokens of the first ``chars`` characters."""
        chars = max(0, min(chars, self.length))
        i = bisect.bisect_left(self.ends, chars)
        if i >= len(self.ends):
            return self.totals[-1] if self.totals else 0.0
        start = self.ends[i - 1] if i else 0
        before = self.totals[i - 1] if i else 0.0
        return before + (chars - start) * self.rates[i]

    def suffix(self, chars: int) -> float:
        """Tokens of the last ``chars`` characters."""
        total = self.totals[-1] if self.totals else 0.0
        return total - self.prefix(self.length - chars)


def cut_guess(
    costs: RenderedCosts, fixed: int, marker: str, head_share_percent: int, shortest: int
) -> Callable[[int], int]:
    """The guessed price of the input cut to ``shortest + n`` characters (as ``cut_text`` cuts it:
    a share of ``n`` from the head, the rest from the tail, the marker between), ``fixed`` being the
    price of the request with an empty input."""
    marker_tokens = len(marker) * DEFAULT_RATE

    def guess(n: int) -> int:
        if shortest + n >= costs.length:
            return fixed + round(costs.prefix(costs.length))
        head = n * head_share_percent // 100
        return fixed + round(costs.prefix(head) + marker_tokens + costs.suffix(n - head))

    return guess

"""The last resort when summarizing fails: drop the oldest whole turns, no LLM call.

The dropped messages are still demoted and indexed as raw history by the caller, so nothing is
lost from the session, only from the model's window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from palimpsest.compressor.planner import Estimator, kept_always, split_turns
from palimpsest.v1.common_pb2 import Message

# Half the window: far enough below the 90% trigger that the next turns do not re-fire
# compression while the summarizer is still failing.
HARD_TRUNCATE_FRACTION = 0.5


@dataclass(frozen=True)
class Truncation:
    """Which messages leave the context; the new context is system + to_keep."""

    dropped: list[Message]
    to_keep: list[Message]
    system: list[Message]
    tokens: int  # estimate of the new context
    fits: bool  # False when even the newest turn alone is over the budget

    @property
    def new_context(self) -> list[Message]:
        return list(self.system) + list(self.to_keep)


def hard_truncate(
    context: Sequence[Message],
    *,
    window: int,
    estimate: Estimator,
    frac: float = HARD_TRUNCATE_FRACTION,
) -> Truncation:
    """Drop the oldest whole turns until the estimate is under ``frac × window``.

    System messages and the newest turn are always kept. Live summaries are dropped only after
    every older turn: a summary is the densest record of the history, so it goes last.
    """
    system = [m for m in context if kept_always(m)]
    summaries = [m for m in context if not kept_always(m) and m.is_summary]
    turns = split_turns([m for m in context if not kept_always(m) and not m.is_summary])
    budget = frac * window

    def kept(first_turn: int, with_summaries: bool) -> list[Message]:
        ids = {id(m) for turn in turns[first_turn:] for m in turn}
        if with_summaries:
            ids |= {id(m) for m in summaries}
        return [m for m in context if id(m) in ids]  # context order

    # Candidates from least to most dropped; the first under budget wins. Dropping more never costs
    # more, so a binary search finds it with O(log turns) estimates instead of one per turn.
    last = max(0, len(turns) - 1)
    candidates = [(first, True) for first in range(last + 1)]
    if summaries:
        candidates.append((last, False))
    lo, hi = 0, len(candidates) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if estimate(system + kept(*candidates[mid])) < budget:
            hi = mid
        else:
            lo = mid + 1
    keep = kept(*candidates[lo])
    tokens = estimate(system + keep)
    ids = {id(m) for m in keep}
    dropped = [m for m in context if m.role != "system" and id(m) not in ids]
    return Truncation(dropped=dropped, to_keep=keep, system=system, tokens=tokens, fits=tokens < budget)

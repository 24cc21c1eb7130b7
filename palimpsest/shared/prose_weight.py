"""How long a request or answer counts for condensing, and the sizes pruning works with: its characters, a script of about a token a
character (CJK) counted DENSE_WEIGHT times. Shared by the Compressor, which condenses old long
prose, and the Agent, which asks for it after a turn only when some qualifies."""

from __future__ import annotations

# A request or answer at least this long (weighted), older than the newest PROSE_KEEP_TURNS turns,
# is condensed to its head and tail. One turn, not two: the exchange the user answers stays whole,
# and the next call evaluates one turn again, not two (bench compaction: re-fires at 4,096 28% ->
# 21%, model time on summaries 10.9% -> 8.1%, total model time 1-2% lower, 8,192 no worse).
PROSE_PRUNE_MIN_CHARS = 1_000
# What a tool result's preview keeps, and the least a result must have for a preview to be worth it.
PREVIEW_CHARS = 300
PRUNE_MIN_CHARS = 1_200
PROSE_KEEP_TURNS = 1
DENSE_WEIGHT = 3
_SAMPLE = 2_000


def density(text: str) -> int:
    """DENSE_WEIGHT for a text mostly (a third or more) in CJK, kana, hangul or beyond, else 1."""
    sample = text[:_SAMPLE]
    wide = sum(1 for c in sample if ord(c) >= 0x2E80)
    return DENSE_WEIGHT if sample and wide * 3 >= len(sample) else 1


def weighted_chars(text: str) -> int:
    return len(text) * density(text)

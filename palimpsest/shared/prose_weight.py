"""How long a request or answer counts for condensing, and the sizes pruning works with: its characters, a script of about a token a
character (CJK) counted DENSE_WEIGHT times. Shared by the Compressor, which condenses old long
prose, and the Agent, which asks for a prune at a turn's end (or before a loop's next call) only
when some qualifies."""

from __future__ import annotations

from dataclasses import dataclass

# A request or answer at least this long (weighted), older than the newest PROSE_KEEP_TURNS turns,
# is condensed to its head and tail. One turn, not two: the exchange the user answers stays whole,
# and the next call evaluates one turn again, not two (bench compaction: re-fires at 4,096 28% ->
# 21%, model time on summaries 10.9% -> 8.1%, total model time 1-2% lower, 8,192 no worse).
PROSE_PRUNE_MIN_CHARS = 1_000
# What a tool result's preview keeps, and the least a result must have for a preview to be worth it.
PREVIEW_CHARS = 300
PRUNE_MIN_CHARS = 1_200
PROSE_KEEP_TURNS = 1
# What a condensed request or answer keeps of its head and tail (a third of it in a dense script).
PROSE_HEAD_CHARS = 300
PROSE_TAIL_CHARS = 150
DENSE_WEIGHT = 3
_SAMPLE = 2_000


def density(text: str) -> int:
    """DENSE_WEIGHT for a text mostly (a third or more) in CJK, kana, hangul or beyond, else 1."""
    sample = text[:_SAMPLE]
    wide = sum(1 for c in sample if ord(c) >= 0x2E80)
    return DENSE_WEIGHT if sample and wide * 3 >= len(sample) else 1


def weighted_chars(text: str) -> int:
    return len(text) * density(text)


# The sizes above are for this window and larger; a smaller one keeps the same share of itself (a
# quarter of them at most). The words a turn leaves behind are what fills a small window between
# summaries: at the full sizes, 8,192 took 9–11 LLM summaries per 100 turns and 4,096 took 19–23
# with 14–41% re-fires; at this share, about 7–8 and 13–16, re-fires 0% at 8,192, and less model
# time in all (bench compaction: docs/benchmarks.md has the current figures).
REFERENCE_WINDOW = 16_384
MIN_SCALE = 0.25

# What a result's preview says of the rest, kept short: at 4,096 tokens the longer note (40 tokens)
# was a fifth of what a tool turn left in the context once pruned.
PRUNED_NOTE = "pruned from the context"
_TYPICAL_REST = 10_000  # the size the notes are priced at: their count of characters varies little


def result_note(rest: int) -> str:
    """What follows a pruned result's head: how much was pruned, and where it is."""
    return f"\n[… {rest:,} more characters {PRUNED_NOTE}; memory_search finds them …]"


def condensed_note(rest: int) -> str:
    """What stands between a condensed request's or answer's head and tail."""
    return f"\n[… {rest:,} characters condensed; memory_search finds them …]\n"


@dataclass(frozen=True)
class PruneSizes:
    """What pruning keeps of a message and what it must have for pruning to be worth it, in chars."""

    preview_chars: int = PREVIEW_CHARS  # a tool result's preview
    prune_min_chars: int = PRUNE_MIN_CHARS  # a tool result worth a preview
    prose_min_chars: int = PROSE_PRUNE_MIN_CHARS  # a request or answer worth condensing (weighted)
    prose_head_chars: int = PROSE_HEAD_CHARS
    prose_tail_chars: int = PROSE_TAIL_CHARS

    @property
    def condensed_chars(self) -> int:
        """About what a condensed request or answer keeps: its head, its tail and the note."""
        return self.prose_head_chars + self.prose_tail_chars + len(condensed_note(_TYPICAL_REST))

    @property
    def preview_kept_chars(self) -> int:
        """About what a tool result's preview keeps (weighted): its head and the note."""
        return self.preview_chars + len(result_note(_TYPICAL_REST))


def prune_sizes(window: int) -> PruneSizes:
    """The sizes for a conversation's window (0: unknown, the full sizes)."""
    if window <= 0 or window >= REFERENCE_WINDOW:
        return PruneSizes()
    scale = max(MIN_SCALE, window / REFERENCE_WINDOW)
    return PruneSizes(
        preview_chars=round(PREVIEW_CHARS * scale),
        prune_min_chars=round(PRUNE_MIN_CHARS * scale),
        prose_min_chars=round(PROSE_PRUNE_MIN_CHARS * scale),
        prose_head_chars=round(PROSE_HEAD_CHARS * scale),
        prose_tail_chars=round(PROSE_TAIL_CHARS * scale),
    )

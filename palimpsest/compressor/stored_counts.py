"""Counts the store keeps, so a compression does not count again what a size check counted.

Every message is counted once, at the first size check after it was written, and the count is
stored with the md5 of its content. A Compress on a replica that has not counted the session (another
replica answered the size check, or this one restarted) used to encode all of it again: about 80 ms
of CPU for 120 varied messages. With the stored counts it encodes only what is new to it: the
summary input, and the cut of a message over the view's budget.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from palimpsest.compressor.exact_count import Counter, content_md5
from palimpsest.v1 import common_pb2

Message = common_pb2.Message


def known_counts(context: Iterable[Message], counts: Iterable[common_pb2.TokenCount]) -> dict[tuple[int, int], int]:
    """Content counts by text key (hash, length), for the rows whose stored count is of their
    content alone (no tool calls, no images, not scaled from a slice) and of this very content."""
    by_seq = {c.seq: c for c in counts}
    known: dict[tuple[int, int], int] = {}
    for m in context:
        count = by_seq.get(m.seq)
        if count is None or m.tool_calls or m.images or m.sliced_from_chars or not m.content:
            continue
        if count.content_md5 == content_md5(m):
            known[(hash(m.content), len(m.content))] = count.tokens
    return known


class PrimedCounter:
    """A counter that answers from stored counts what they cover and counts the rest with the
    model's own (whose cache then keeps it)."""

    def __init__(self, counter: Counter, known: dict[tuple[int, int], int]) -> None:
        self.counter = counter
        self.known = known

    def __getattr__(self, name: str) -> Any:
        return getattr(self.counter, name)  # digest, tokenizer

    def counts(self, texts: Sequence[str]) -> list[int]:
        found = [self.known.get((hash(t), len(t))) for t in texts]
        missing = [i for i, n in enumerate(found) if n is None]
        if missing:
            for i, n in zip(missing, self.counter.counts([texts[i] for i in missing])):
                found[i] = n
        return [n or 0 for n in found]

    def head_and_tail(self, text: str, head_tokens: int, tail_tokens: int) -> tuple[str, str]:
        return self.counter.head_and_tail(text, head_tokens, tail_tokens)

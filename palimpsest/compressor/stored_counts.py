"""Counts the store keeps, so a compression does not count again what a size check counted.

Every message is counted once, at the first size check after it was written, and the count is
stored with the md5 of its content. A Compress on a replica that has not counted the session (another
replica answered the size check, or this one restarted) used to encode all of it again: about 80 ms
of CPU for 120 varied messages. With the stored counts it encodes only what is new to it.

A message over the view's message budget is also cut for the view, and the cut was the rest of
that cost (~40 ms: the whole result encoded again to find the token boundaries, then the cut
counted): the size check that cuts a stored row writes where it cut and what the cut costs beside
its count (``cut_counts``), and a replica primed with it cuts and counts that row without its tokenizer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from palimpsest.compressor.exact_count import Counter, CutPlan, content_md5, cut_plan, joined_cut, message_tokens
from palimpsest.shared.context_view import TRUNCATABLE_ROLES
from palimpsest.v1 import common_pb2

Message = common_pb2.Message
TextKey = tuple[int, int]  # (hash, length): how the counters name a text
CutKey = tuple[int, int, int, int]  # the text's key, then the head's and the tail's tokens


@dataclass
class Known:
    """What the store's counts answer: content counts by text key, and cuts (the kept head and
    tail, in characters) by text key and the tokens asked of each end."""

    counts: dict[TextKey, int] = field(default_factory=dict)
    cuts: dict[CutKey, tuple[int, int]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.counts)


def text_key(text: str) -> TextKey:
    return (hash(text), len(text))


def _plain(m: Message) -> bool:
    """A row whose stored count is of its content alone (no tool calls, no images, not scaled from
    a slice): the only rows a stored count or cut stands for."""
    return bool(m.content) and not m.tool_calls and not m.images and not m.sliced_from_chars


def known_counts(context: Iterable[Message], counts: Iterable[common_pb2.TokenCount]) -> Known:
    """Content counts (and cuts) of the rows whose stored count is of their content alone and of
    this very content; a cut only when it is of this content too (its md5: a cut written by a
    version that marks cuts otherwise is counted again, never trusted)."""
    by_seq = {c.seq: c for c in counts}
    known = Known()
    for m in context:
        count = by_seq.get(m.seq)
        if count is None or not _plain(m) or count.content_md5 != content_md5(m):
            continue
        known.counts[text_key(m.content)] = count.tokens
        if count.HasField("cut"):
            _add_cut(known, m.content, count.tokens, count.cut)
    return known


def _add_cut(known: Known, content: str, tokens: int, cut: common_pb2.CutCount) -> None:
    if cut.head_chars + cut.tail_chars > len(content):
        return
    plan = CutPlan(cut.head_tokens, cut.tail_tokens, tokens - cut.head_tokens - cut.tail_tokens)
    head, tail = content[: cut.head_chars], content[len(content) - cut.tail_chars :]
    text = joined_cut(plan, head, tail)
    if content_md5(Message(content=text)) != cut.content_md5:
        return
    known.cuts[(*text_key(content), cut.head_tokens, cut.tail_tokens)] = (cut.head_chars, cut.tail_chars)
    known.counts[text_key(text)] = cut.tokens


def cut_counts(
    messages: Sequence[Message], tokens: Sequence[int], budget: int, counter: Counter
) -> dict[int, common_pb2.CutCount]:
    """The cut of each stored row over ``budget`` (the view's, as the size check made it), by seq,
    for the store: where the content was cut and what the cut costs. The counter has just made the
    view, so its caches answer."""
    out: dict[int, common_pb2.CutCount] = {}
    for m, count in zip(messages, tokens):
        if m.seq <= 0 or m.role not in TRUNCATABLE_ROLES or not _plain(m) or budget <= 0:
            continue
        plan = cut_plan(m, count, budget, counter)
        if plan is None:
            continue
        head, tail = counter.head_and_tail(m.content, plan.head_tokens, plan.tail_tokens)
        text = joined_cut(plan, head, tail)
        out[m.seq] = common_pb2.CutCount(
            head_tokens=plan.head_tokens,
            tail_tokens=plan.tail_tokens,
            head_chars=len(head),
            tail_chars=len(tail),
            tokens=counter.counts([text])[0],
            content_md5=content_md5(Message(content=text)),
        )
    return out


def fresh_counts(
    messages: Sequence[Message], counter: Counter, budget: int
) -> tuple[list[common_pb2.TokenCount], list[common_pb2.TokenCount]]:
    """What a size check stores of the rows it counts first: (their counts, for its caller to store
    with the call's report; the counts of those cut over ``budget`` with their cuts, which go to
    the store apart so the report stays small). The check has just made the view: the counter's
    caches answer."""
    tokens = message_tokens(messages, counter)
    counts = [common_pb2.TokenCount(seq=m.seq, tokens=n, content_md5=content_md5(m)) for m, n in zip(messages, tokens)]
    cuts = cut_counts(messages, tokens, budget, counter)
    with_cuts = [
        common_pb2.TokenCount(seq=c.seq, tokens=c.tokens, content_md5=c.content_md5, cut=cuts[c.seq])
        for c in counts
        if c.seq in cuts
    ]
    return counts, with_cuts


class PrimedCounter:
    """A counter that answers from stored counts and cuts what they cover and counts the rest with
    the model's own (whose cache then keeps it)."""

    def __init__(self, counter: Counter, known: Known) -> None:
        self.counter = counter
        self.known = known

    def __getattr__(self, name: str) -> Any:
        return getattr(self.counter, name)  # digest, tokenizer

    def counts(self, texts: Sequence[str], *, for_cut: bool = False) -> list[int]:
        known = self.known.counts
        found = [known.get((hash(t), len(t))) for t in texts]  # text_key, inlined: this runs per message
        missing = [i for i, n in enumerate(found) if n is None]
        if missing:
            for i, n in zip(missing, self.counter.counts([texts[i] for i in missing], for_cut=for_cut)):
                found[i] = n
        return [n or 0 for n in found]

    def head_and_tail(self, text: str, head_tokens: int, tail_tokens: int) -> tuple[str, str]:
        cut = self.known.cuts.get((*text_key(text), head_tokens, tail_tokens))
        if cut is None:
            return self.counter.head_and_tail(text, head_tokens, tail_tokens)
        head_chars, tail_chars = cut
        return text[:head_chars], text[len(text) - tail_chars :]


def primed(counter: Counter, context: Sequence[Message], counts: Iterable[common_pb2.TokenCount]) -> Counter:
    """``counter`` answering from the store's counts of ``context`` (itself when there are none)."""
    known = known_counts(context, counts)
    return PrimedCounter(counter, known) if known else counter

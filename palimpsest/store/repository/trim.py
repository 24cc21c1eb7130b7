"""What TrimSession keeps: the newest N messages the user sees (pure; the repository applies it).

Counted in displayed messages, as `pal sessions trim --keep N` reads: an Agent turn also stores
rows nobody sees (task notes such as "[Iteration 2 of 40 …]", context-only rows), and counting
those kept fewer visible messages than asked. A system prompt a client stored as the session's
first, displayed row is kept and counts as one (004: "always preserving the system prompt"); the
Agent stores none (its prompt comes from the profile on every call), and an engine's own system
rows (task notes, compression markers) are never taken for one: a kept stale note would lead the
next context.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TrimRow:
    seq: int
    role: str
    is_display: bool
    is_compression: bool = False


def system_prompt(rows: Sequence[TrimRow]) -> int | None:
    """The seq of the session's stored system prompt: its first row, when that is a displayed
    system message and not a compression's marker."""
    first = rows[0] if rows else None
    if first is None or first.role != "system" or not first.is_display or first.is_compression:
        return None
    return first.seq


def kept_seqs(rows: Sequence[TrimRow], keep: int) -> set[int]:
    """The seqs kept (rows in seq order): the system prompt, then everything from the oldest of
    the newest displayed messages that fill `keep`. The kept part never begins with a tool result
    whose call was cut (no chat template accepts one) or a hidden row: those go, and fewer than
    `keep` stay."""
    prompt = system_prompt(rows)
    kept = {prompt} if prompt is not None else set()
    wanted = keep - len(kept)
    cut: int | None = None
    for row in reversed(rows):
        if wanted <= 0 or row.seq == prompt:
            break
        if row.is_display:
            wanted -= 1
            cut = row.seq
    if cut is None:
        return kept
    tail = [r for r in rows if r.seq >= cut and r.seq != prompt]
    start = 0
    while start < len(tail) and (tail[start].role == "tool" or not tail[start].is_display):
        start += 1
    return kept | {r.seq for r in tail[start:]}


def displayed(rows: Sequence[TrimRow], seqs: set[int] | None = None) -> int:
    """How many of the rows (of `seqs` only, when given) the user sees."""
    return sum(1 for r in rows if r.is_display and (seqs is None or r.seq in seqs))

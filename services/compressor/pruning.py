"""The cheap stage before a summary: old tool results replaced in the context by a preview.

A tool result older than the turns a compression keeps verbatim is the bulk of most agent
contexts and rarely read again word for word. Replacing it by its first lines and a pointer frees
most of its tokens without asking the model for anything; the display history keeps every byte,
and the result is indexed for memory_search like summarized history. Results of the profile's
critical tools stay whole. Pure: the servicer decides whether the freed room is enough.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from palimpsest.v1.common_pb2 import Message, SeqRange
from services.shared.context_view import is_transient

# What a preview keeps of a result, and the least a result must have for a preview to be worth it.
PREVIEW_CHARS = 300
PRUNE_MIN_CHARS = 1_200
# Marks a preview (metadata), so a preview is never pruned again.
PRUNED_FROM = "pruned_from_seq"


@dataclass(frozen=True)
class Pruning:
    """Which stored results go, and what stands in for each."""

    pruned: list[Message]
    previews: list[Message]

    def apply(self, context: Sequence[Message]) -> list[Message]:
        """The context with each pruned result's preview in its place."""
        by_seq = {m.replaces.first: m for m in self.previews}
        return [by_seq.get(m.seq, m) for m in context]


def prunable(message: Message, kept_seqs: set[int], critical_tools: Iterable[str]) -> bool:
    return (message.role == "tool" and message.seq > 0 and message.seq not in kept_seqs
            and message.name not in set(critical_tools) and not is_transient(message)
            and PRUNED_FROM not in message.metadata and len(message.content) >= PRUNE_MIN_CHARS)


def plan_pruning(context: Sequence[Message], kept: Sequence[Message], critical_tools: Iterable[str]) -> Pruning:
    """Previews for the tool results outside the kept-verbatim region."""
    kept_seqs = {m.seq for m in kept}
    critical = tuple(critical_tools)
    pruned = [m for m in context if prunable(m, kept_seqs, critical)]
    return Pruning(pruned=pruned, previews=[preview(m) for m in pruned])


def preview(message: Message) -> Message:
    """A result's first PREVIEW_CHARS and where the rest is, standing at the result's place."""
    head = message.content[:PREVIEW_CHARS]
    rest = len(message.content) - len(head)
    note = (f"\n[… {rest:,} more characters of this {message.name or 'tool'} result were pruned from the "
            "context to make room; the full output stays in the session's history, and memory_search "
            "finds it by its words …]")
    out = Message(role="tool", name=message.name, tool_call_id=message.tool_call_id, content=head + note,
                  replaces=SeqRange(first=message.seq, last=message.seq))
    out.metadata[PRUNED_FROM] = message.seq
    return out

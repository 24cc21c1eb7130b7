"""The cheap stage before a summary: old tool results, and old tool-call arguments, replaced in the
context by a preview.

A tool result older than the newest tool call is the bulk of most agent contexts and rarely read
again word for word; so are the long arguments of an old call (a file written, a patch applied).
Replacing them by their start and a pointer frees most of their tokens without asking the model
for anything; the display history keeps every byte, and what was replaced is indexed for
memory_search like summarized history. A critical result (of the profile's critical tools, or
marked critical by the tool itself) keeps the summarizer's verbatim budget: 4,000 characters, or
its first and last 2,000. Pure: the pipeline decides whether what it frees is enough, and
summarizes what remains over the target.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from palimpsest.compressor.planner import is_turn_start, kept_always, marked_important, split_turns, tool_groups
from palimpsest.compressor.summary_format import CRITICAL_RESULT_MAX_CHARS, critical_result_text
from palimpsest.shared.context_view import is_transient
from palimpsest.shared.prose_weight import PruneSizes, condensed_note, density, result_note, weighted_chars
from palimpsest.v1.common_pb2 import Message, SeqRange

FULL_SIZES = PruneSizes()  # a window of REFERENCE_WINDOW or more: see prune_sizes

# A call's arguments are pruned past this many characters; each long string keeps its start.
ARGUMENTS_PRUNE_MIN_CHARS = 1_200
ARGUMENT_PREVIEW_CHARS = 200
# Marks a preview (metadata), so a preview is never pruned again.
PRUNED_FROM = "pruned_from_seq"
# What the pruned message added to the prompt (metadata, set by the pipeline): how fast a
# conversation grows is measured on what its turns added, not on what is left of them. Named anew
# when the measure lost the prompt's fixed cost ("pruned_tokens" carried it, ~500 tokens a preview
# at calibrated prices): a preview stored before then says nothing, rather than the wrong thing.
PRUNED_TOKENS = "pruned_added_tokens"
# Marks a result pruned when its turn ended rather than when the window filled: it was sent whole
# for one turn only, so it is a spike in that turn, not growth of every later one.
PRUNED_AT_TURN_END = "pruned_at_turn_end"


@dataclass(frozen=True)
class Pruning:
    """Which stored messages go, and what stands in for each."""

    pruned: list[Message]
    previews: list[Message]
    dropped: list[Message] = field(default_factory=list)  # spent task notes and recalls: nothing in their place

    def apply(self, context: Sequence[Message]) -> list[Message]:
        """The context with each pruned message's preview in its place, and the dropped left out."""
        by_seq = {m.replaces.first: m for m in self.previews}
        gone = {m.seq for m in self.dropped}
        return [by_seq.get(m.seq, m) for m in context if m.seq not in gone]


def is_critical(message: Message, critical_tools: Iterable[str]) -> bool:
    """Marked critical by its tool, or of a tool the profile names critical."""
    return message.is_compression_critical or (bool(message.name) and message.name in set(critical_tools))


def prunable(
    message: Message, kept_seqs: set[int], critical_tools: Iterable[str], sizes: PruneSizes = FULL_SIZES
) -> bool:
    """A stored tool result outside ``kept_seqs`` worth a preview: long enough, never a preview,
    and a critical one only past its verbatim budget."""
    if message.role != "tool" or message.seq <= 0 or message.seq in kept_seqs or is_transient(message):
        return False
    if PRUNED_FROM in message.metadata:
        return False
    floor = CRITICAL_RESULT_MAX_CHARS + 1 if is_critical(message, critical_tools) else sizes.prune_min_chars
    return len(message.content) >= floor


def arguments_prunable(message: Message, kept_seqs: set[int]) -> bool:
    """An older assistant message whose tool calls carry long arguments."""
    return (
        message.role == "assistant"
        and message.seq > 0
        and message.seq not in kept_seqs
        and PRUNED_FROM not in message.metadata
        and sum(len(c.arguments_json) for c in message.tool_calls) >= ARGUMENTS_PRUNE_MIN_CHARS
    )


def prose_prunable(message: Message, kept_seqs: set[int], sizes: PruneSizes = FULL_SIZES) -> bool:
    """A stored request or answer (no tool calls, no images) outside ``kept_seqs``, long enough
    for a head-and-tail preview to free most of it, and not one the user marked important."""
    if message.role not in ("user", "assistant") or message.is_summary or message.seq <= 0:
        return False
    if message.seq in kept_seqs or is_transient(message) or PRUNED_FROM in message.metadata:
        return False
    if message.tool_calls or message.images or marked_important(message):
        return False
    return weighted_chars(message.content) >= sizes.prose_min_chars


def recent_turns(context: Sequence[Message], turns: int) -> list[Message]:
    """The messages of the newest ``turns`` turns: prose the conversation is still about."""
    split = split_turns([m for m in context if not kept_always(m)])
    return [m for turn in split[-turns:] for m in turn] if turns > 0 else []


def protected(context: Sequence[Message]) -> list[Message]:
    """What pruning never touches: the newest turn's request and its newest tool call with
    everything after it (the results the model is about to read). Older iterations of a long
    turn are pruned like older turns: a tool loop would otherwise always end in a summary."""
    turns = split_turns([m for m in context if not kept_always(m)])
    if not turns:
        return []
    newest = turns[-1]
    request = newest[:1] if is_turn_start(newest[0]) else []
    groups = tool_groups(newest[len(request) :])
    last_call = next((i for i in range(len(groups) - 1, -1, -1) if groups[i][0].tool_calls), 0)
    return [*request, *(m for group in groups[last_call:] for m in group)]


def plan_pruning(
    context: Sequence[Message],
    kept: Sequence[Message],
    critical_tools: Iterable[str],
    prose_kept: Sequence[Message] | None = None,
    sizes: PruneSizes = FULL_SIZES,
) -> Pruning:
    """Previews for the tool results and long call arguments outside ``kept``, and (given
    ``prose_kept``) for the long requests and answers outside it."""
    kept_seqs = {m.seq for m in kept}
    prose_seqs = None if prose_kept is None else kept_seqs | {m.seq for m in prose_kept}
    critical = tuple(critical_tools)
    pruned = [
        m
        for m in context
        if prunable(m, kept_seqs, critical, sizes)
        or arguments_prunable(m, kept_seqs)
        or (prose_seqs is not None and prose_prunable(m, prose_seqs, sizes))
    ]
    return Pruning(pruned=pruned, previews=[preview(m, critical, sizes) for m in pruned])


def condensed_prose(message: Message, sizes: PruneSizes = FULL_SIZES) -> Message:
    """A request or answer cut to its head and tail with a note between: what it was about and
    where it ended stay in view, the whole text stays in the history and in memory_search."""
    out = Message()
    out.CopyFrom(message)
    out.ClearField("seq")
    weight = density(message.content)
    head, tail = sizes.prose_head_chars // weight, sizes.prose_tail_chars // weight
    rest = len(message.content) - head - tail
    out.content = message.content[:head] + condensed_note(rest) + message.content[-tail:]
    return out


def preview(message: Message, critical_tools: Iterable[str] = (), sizes: PruneSizes = FULL_SIZES) -> Message:
    """What stands at a pruned message's place: a result's start (a critical one's head and tail)
    and where the rest is, or a call with its long arguments cut."""
    if message.role in ("user", "assistant") and not message.tool_calls:
        out = condensed_prose(message, sizes)
    elif message.role == "assistant":
        out = Message()
        out.CopyFrom(message)
        out.ClearField("seq")
        for call in out.tool_calls:
            call.arguments_json = shortened_arguments(call.arguments_json)
    else:
        if is_critical(message, critical_tools):
            head = critical_result_text(message.content)
        else:
            head = message.content[: sizes.preview_chars // density(message.content)]
        rest = len(message.content) - len(head)
        note = result_note(rest)
        out = Message(
            role="tool",
            name=message.name,
            tool_call_id=message.tool_call_id,
            content=head + note,
            is_compression_critical=message.is_compression_critical,
        )
    out.replaces.CopyFrom(SeqRange(first=message.seq, last=message.seq))
    out.metadata[PRUNED_FROM] = message.seq
    return out


def shortened_arguments(arguments_json: str) -> str:
    """Arguments with every long string cut to its start and a note (still valid JSON, so the
    call renders as it did); unparsable arguments cut as text."""
    try:
        parsed = json.loads(arguments_json)
    except ValueError:
        return arguments_json[:ARGUMENT_PREVIEW_CHARS] + "… [pruned]"

    def cut(value: Any) -> Any:
        if isinstance(value, str) and len(value) > ARGUMENT_PREVIEW_CHARS:
            return f"{value[:ARGUMENT_PREVIEW_CHARS]}… [{len(value) - ARGUMENT_PREVIEW_CHARS:,} characters pruned]"
        if isinstance(value, dict):
            return {k: cut(v) for k, v in value.items()}
        if isinstance(value, list):
            return [cut(v) for v in value]
        return value

    return json.dumps(cut(parsed), ensure_ascii=False)

"""One compression, end to end: plan, summarize (retry, then hard-truncate), commit to the store.

The plan, the summary input and the truncation are pure functions elsewhere; this module only
orders the I/O around them. A summarizer failure never escapes: the fallback needs no LLM.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

from palimpsest.compressor.breadcrumbs import chunk_messages, entity_source, extract_entities, merge_breadcrumbs
from palimpsest.compressor.hard_truncate import hard_truncate
from palimpsest.compressor.planner import (
    Plan,
    freed_tokens,
    plan_compression,
)
from palimpsest.compressor.pricing import Knobs, Pricing
from palimpsest.compressor.pruning import Pruning
from palimpsest.compressor.token_estimate import trigger_tokens
from palimpsest.shared.context_view import is_transient
from palimpsest.v1 import common_pb2
from palimpsest.v1 import compressor_pb2 as pb
from palimpsest.v1 import session_store_pb2 as store_pb

log = logging.getLogger("palimpsest.compressor")

Message = common_pb2.Message

SUMMARY_ATTEMPTS = 2  # one retry, then the hard-truncate fallback
# A summary aims at this share of the target: the room an LLM call makes lasts longer than the
# room pruning makes (measured on bench compaction: 0.4–1.0 moved summaries by a few per 100 turns).
SUMMARY_DEPTH = 0.6
_REASON_NAMES: dict[int, str] = {
    pb.COMPRESSION_REASON_PRETURN: "preturn",
    pb.COMPRESSION_REASON_MIDTURN: "midturn",
    pb.COMPRESSION_REASON_POSTTURN: "postturn",
    pb.COMPRESSION_REASON_FORCED: "forced",
    pb.COMPRESSION_REASON_TURN_END: "turnend",
}


def reason_name(reason: int) -> str:
    return _REASON_NAMES.get(reason, "unspecified")


_METHOD_NAMES: dict[int, str] = {
    pb.COMPRESSION_METHOD_SUMMARY: "summary",
    pb.COMPRESSION_METHOD_HARD_TRUNCATE: "hard_truncate",
    pb.COMPRESSION_METHOD_PRUNE: "prune",
}


def method_name(method: int) -> str:
    return _METHOD_NAMES.get(method, "unspecified")


def effective_target(knobs: Knobs, window: int) -> float:
    """The target, lowered as far as the trigger was: when a small window's output reserve pulls the
    trigger below the threshold, the gap between trigger and target (the hysteresis that stops
    compression re-firing a few messages later) stays what the settings meant it to be."""
    trigger = trigger_tokens(knobs.threshold, window, knobs.output_reserve) / window
    return max(0.05, min(knobs.target, trigger - (knobs.threshold - knobs.target)))


def summary_target(knobs: Knobs, window: int) -> float:
    """Where a summary takes the prompt: below the target pruning must reach, so the room an LLM
    call buys lasts several turns of pruning-only compressions rather than one."""
    return max(0.05, effective_target(knobs, window) * SUMMARY_DEPTH)


def make_plan(
    context: list[Message],
    pricing: Pricing,
    knobs: Knobs,
    window: int,
    keep_recent_messages: int,
    prompt_tokens: int = 0,
    target: float | None = None,
) -> Plan:
    """The one plan WouldCompress, Compress and the size check's dry run share. ``prompt_tokens``:
    the whole prompt's count when known (the rest of it shares the target with the kept region);
    ``target``: the share of the window to reach (``summary_target`` unless given)."""
    return plan_compression(
        context,
        keep_recent=knobs.keep_recent,
        window=window,
        target=summary_target(knobs, window) if target is None else target,
        estimate=pricing.estimate,
        keep_recent_messages=keep_recent_messages or None,
        critical_tools=knobs.critical_tools,
        reserve=plan_reserve(context, pricing, knobs, window, prompt_tokens),
    )


def plan_reserve(context: list[Message], pricing: Pricing, knobs: Knobs, window: int, prompt_tokens: int) -> int:
    """What the prompt will carry besides the kept region after a compression: its part outside
    the stored context (system prompt, tool schemas, the template's fixed cost) and the new summary."""
    return outside_context(context, pricing, prompt_tokens) + expected_summary_tokens(context, pricing, knobs, window)


def outside_context(context: list[Message], pricing: Pricing, prompt_tokens: int) -> int:
    """What a prompt of ``prompt_tokens`` carries besides the stored context (0 when unknown)."""
    return max(0, prompt_tokens - pricing.estimate(context)) if prompt_tokens else 0


def expected_summary_tokens(context: list[Message], pricing: Pricing, knobs: Knobs, window: int) -> int:
    """A new summary is expected as large as the live one it replaces or, without one, a
    sixteenth of the window; never above its cap or an eighth of the window."""
    live = [m for m in context if m.is_summary]
    summary = pricing.added(live[-1:]) if live else window // 16
    return min(summary, knobs.summary_max_tokens, window // 8)


def worth_running(
    plan: Plan, context: list[Message], pricing: Pricing, knobs: Knobs, window: int, any_gain: bool = False
) -> tuple[bool, int]:
    """(whether the summary ``plan`` describes should run, what it is expected to free). It must
    shrink the context, and free ``min_freed`` of the window unless ``any_gain`` will do (a forced
    compaction; a prompt over the limit, whose alternative is cutting it): an LLM call that frees a
    few hundred tokens buys a turn at most, and the next compression follows."""
    summarized = freed_tokens(plan, pricing.estimate)
    if summarized <= 0:
        return False, 0
    # The summary takes back some of it: as large as expected, at most half of what it summarizes.
    frees = summarized - min(expected_summary_tokens(context, pricing, knobs, window), summarized // 2)
    return (frees > 0 if any_gain else frees >= max(1, knobs.min_freed * window)), frees


def shortfall(tokens_after: int, target: int, kept: int, summary: int, outside: int) -> str:
    """Why a compression ended above its target, in words; empty when it did not."""
    if tokens_after <= target:
        return ""
    return (
        f"ended at ~{tokens_after:,} tokens, above the target of {target:,}: the messages kept verbatim "
        f"(at least the newest turn's) take {kept:,}, the summary {summary:,}, the system prompt, tool "
        f"schemas and template {outside:,}"
    )


@dataclass
class Outcome:
    """What a compression did, before it is committed."""

    method: pb.CompressionMethod
    demoted: list[Message]
    new_context: list[Message]
    summary: Message | None
    breadcrumbs: list[str]
    replacements: list[Message] = field(default_factory=list)  # previews standing for pruned results

    @property
    def summary_text(self) -> str:
        return self.summary.content if self.summary is not None else ""


@dataclass(frozen=True)
class Accounting:
    """What a compression's outcome does to the prompt, for the store's record, the log and the event."""

    context_tokens: int  # the stored context after it
    tokens_before: int  # the whole prompt before and (expected) after it
    tokens_after: int
    target_tokens: int
    shortfall: str  # empty at or below the target


def account(
    outcome: Outcome, context: list[Message], pricing: Pricing, knobs: Knobs, window: int, current: int
) -> Accounting:
    """The prompt after ``outcome``: its new context plus what the prompt of ``current`` tokens
    carried besides the old one (system prompt, tool schemas, the template)."""
    tokens = pricing.estimate(outcome.new_context)
    outside = outside_context(context, pricing, current)
    summary = pricing.added([outcome.summary]) if outcome.summary is not None else 0
    target = int(effective_target(knobs, window) * window)
    after = tokens + outside
    # Told apart as the prompt holds them: what the kept messages and the summary add, and the rest
    # (system prompt, tool schemas, the template's fixed cost), which a whole estimate of the new
    # context would have put with the kept messages (~500 tokens on the calibrated path).
    kept = max(0, pricing.added(outcome.new_context) - summary)
    return Accounting(
        tokens,
        max(current, pricing.estimate(context)),
        after,
        target,
        shortfall(after, target, kept, summary, max(0, after - kept - summary)),
    )


def prune_outcome(context: list[Message], pruning: Pruning) -> Outcome:
    """Old tool results replaced by their previews: no LLM call, nothing summarized."""
    crumbs = merge_breadcrumbs([], extract_entities(entity_source(pruning.pruned)))
    demoted = sorted([*pruning.pruned, *pruning.dropped], key=lambda m: m.seq)
    return Outcome(pb.COMPRESSION_METHOD_PRUNE, demoted, pruning.apply(context), None, crumbs, list(pruning.previews))


def truncate_outcome(context: list[Message], pricing: Pricing, window: int, error: Exception | None) -> Outcome:
    """The last resort: drop the oldest whole turns until under half the window, no LLM call."""
    cut = hard_truncate(context, window=window, estimate=pricing.estimate)
    crumbs = merge_breadcrumbs([], extract_entities(entity_source(cut.dropped)))
    log.warning("summarizer failed (%s): hard-truncated %d messages", error, len(cut.dropped))
    return Outcome(pb.COMPRESSION_METHOD_HARD_TRUNCATE, cut.dropped, cut.new_context, None, crumbs)


def chunks_past(commit: store_pb.CommitCompressionRequest, budget: int) -> list[list[common_pb2.RawChunk]]:
    """Keep in ``commit`` the memory chunks that fit ``budget`` bytes with the rest of it; return
    the others in batches of at most ``budget`` each, for IndexChunks. One request of every chunk
    of a large eviction (four 1.5 MB logs) passed the services' message limit and failed the
    compression; indexing is idempotent (by content hash), so the batches may go first."""
    chunks = list(commit.chunks)
    size = commit.ByteSize()
    if size <= budget:
        return []
    del commit.chunks[:]
    kept_size = commit.ByteSize()
    rest: list[common_pb2.RawChunk] = []
    for chunk in chunks:
        weight = chunk.ByteSize() + 8  # the field's tag and length
        if not rest and kept_size + weight <= budget:
            commit.chunks.append(chunk)
            kept_size += weight
        else:
            rest.append(chunk)
    batches: list[list[common_pb2.RawChunk]] = []
    batch_size = 0
    for chunk in rest:
        weight = chunk.ByteSize() + 8
        if not batches or batch_size + weight > budget:
            batches.append([])
            batch_size = 0
        batches[-1].append(chunk)
        batch_size += weight
    return batches


def commit_request(
    session: common_pb2.Session,
    context: list[Message],
    outcome: Outcome,
    reason: int,
    accounting: Accounting,
    *,
    index_memory: bool = True,
) -> store_pb.CommitCompressionRequest:
    """The one-transaction store write for an outcome; with `index_memory`, the dropped messages
    travel with it as memory chunks."""
    chunks = []
    kept = [m for m in outcome.demoted if not is_transient(m)] if index_memory else []
    for data in chunk_messages(kept, outcome.breadcrumbs):
        chunk = common_pb2.RawChunk(
            content=data.content,
            content_hash=data.content_hash,
            turn_range=common_pb2.SeqRange(first=data.first_seq, last=data.last_seq),
            breadcrumbs=data.breadcrumbs,
        )
        if data.first_at is not None:
            chunk.first_at.CopyFrom(data.first_at)
        if data.last_at is not None:
            chunk.last_at.CopyFrom(data.last_at)
        chunks.append(chunk)
    marker_meta: dict[str, str | int] = {
        "messages_before": len(context),
        "messages_after": len(outcome.new_context),
        "reason": reason_name(reason),
        "method": method_name(outcome.method),
        "tokens_before": accounting.tokens_before,
        "tokens_after": accounting.tokens_after,
        "target_tokens": accounting.target_tokens,
    }
    if accounting.shortfall:
        marker_meta["shortfall"] = accounting.shortfall
    headline = f"Context compressed: {len(context)} → {len(outcome.new_context)} messages"
    marker = Message(role="system", content=f"{headline}\n{outcome.summary_text}".strip())
    marker.metadata.update(marker_meta)
    request = store_pb.CommitCompressionRequest(
        session_id=session.id,
        demote_seqs=[m.seq for m in outcome.demoted],
        marker=marker,
        context_token_count=accounting.context_tokens,
        chunks=chunks,
        expected_revision=session.revision,
        archive=True,
    )
    if outcome.summary is not None:
        request.summary.CopyFrom(outcome.summary)
    request.replacements.extend(outcome.replacements)
    return request


def log_compressed(
    session_id: str, reason: int, outcome: Outcome, before: int, after: int, accounting: Accounting, window: int
) -> None:
    """The structured `compressor.compressed` line (a warning when it stopped short of its target)."""
    (log.warning if accounting.shortfall else log.info)(
        "compressor.compressed %s",
        json.dumps(
            {
                "event": "compressor.compressed",
                "session_id": session_id,
                "reason": reason_name(reason),
                "method": method_name(outcome.method),
                "messages_before": before,
                "messages_after": after,
                "tokens_before": accounting.tokens_before,
                "tokens_after": accounting.tokens_after,
                "context_tokens": accounting.context_tokens,
                "target_tokens": accounting.target_tokens,
                "window": window,
                **({"shortfall": accounting.shortfall} if accounting.shortfall else {}),
            }
        ),
    )

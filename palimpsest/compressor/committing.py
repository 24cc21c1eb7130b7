"""A compression's last stage: its outcome committed to the store (memory chunks past the message
limit indexed apart, then one CommitCompression) and reported as ``compressed``; and the prune a turn
asks for as it ends (COMPRESSION_REASON_TURN_END), which commits the same way."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from palimpsest.compressor import pipeline
from palimpsest.compressor.pricing import Knobs, Pricing, SessionState
from palimpsest.compressor.stages import turn_end_pruning
from palimpsest.shared import metrics
from palimpsest.shared.stubs import AsyncStoreStub
from palimpsest.v1 import common_pb2
from palimpsest.v1 import compressor_pb2 as pb
from palimpsest.v1 import session_store_pb2 as store_pb

log = logging.getLogger("palimpsest.compressor")


@dataclass(frozen=True)
class Loaded:
    """What a compression works on, as the servicer read it: the session, its window and knobs, the
    pricing, the context and its size."""

    state: SessionState
    window: int
    knobs: Knobs
    pricing: Pricing
    messages: list[common_pb2.Message]
    current: int


@dataclass(frozen=True)
class Committer:
    """Where an outcome goes: the store, for a compression of this reason, within the message limit."""

    store: AsyncStoreStub
    reason: int  # a CompressionReason
    max_message_bytes: int


async def prune_turn_end(
    committer: Committer, loaded: Loaded, next_prompt_tokens: int = 0
) -> AsyncIterator[pb.CompressionEvent]:
    """A turn's results pruned at its end (COMPRESSION_REASON_TURN_END): no events when there is
    nothing worth pruning. ``next_prompt_tokens``: see stages.turn_end_pruning."""
    pruning = await asyncio.to_thread(
        turn_end_pruning, loaded.messages, loaded.pricing, loaded.knobs, loaded.window, next_prompt_tokens
    )
    if pruning is None:
        return
    yield pb.CompressionEvent(
        started=pb.CompressionStarted(context_tokens=loaded.current, max_context_tokens=loaded.window)
    )
    outcome = await asyncio.to_thread(pipeline.prune_outcome, loaded.messages, pruning)
    async for event in commit_outcome(committer, loaded, outcome):
        yield event


async def commit_outcome(
    committer: Committer, loaded: Loaded, outcome: pipeline.Outcome
) -> AsyncIterator[pb.CompressionEvent]:
    """Commit an outcome to the store and report it (``compressed``)."""
    if not outcome.demoted:  # the fallback found nothing it may drop: say so, change nothing
        log.warning("compression of %s changed nothing: the newest turn alone is the context", loaded.state.session.id)
        yield pb.CompressionEvent(
            compressed=pb.ContextCompressed(
                messages_before=len(loaded.messages),
                messages_after=len(loaded.messages),
                context_tokens=loaded.current,
                max_context_tokens=loaded.window,
                method=outcome.method,
            )
        )
        return
    accounting = await asyncio.to_thread(
        pipeline.account, outcome, loaded.messages, loaded.pricing, loaded.knobs, loaded.window, loaded.current
    )
    if committer.reason == pb.COMPRESSION_REASON_TURN_END:  # it aims at no target: it falls short of none
        accounting = replace(accounting, shortfall="")
    commit = pipeline.commit_request(
        loaded.state.session,
        loaded.messages,
        outcome,
        committer.reason,
        accounting,
        index_memory=loaded.knobs.index_memory,
    )
    # Half the services' message limit: room for whatever a store replica adds to its reply.
    indexed_apart = 0
    for batch in pipeline.chunks_past(commit, committer.max_message_bytes // 2):
        indexed_apart += (
            await committer.store.IndexChunks(store_pb.IndexChunksRequest(session_id=commit.session_id, chunks=batch))
        ).indexed
    result = await committer.store.CommitCompression(commit)
    pipeline.log_compressed(
        loaded.state.session.id,
        committer.reason,
        outcome,
        len(loaded.messages),
        len(outcome.new_context),
        accounting,
        loaded.window,
    )
    metrics.COMPRESSIONS.labels(pipeline.method_name(outcome.method), pipeline.reason_name(committer.reason)).inc()
    replaced = (
        outcome.summary.replaces
        if outcome.summary is not None
        else common_pb2.SeqRange(first=min(m.seq for m in outcome.demoted), last=max(m.seq for m in outcome.demoted))
    )
    yield pb.CompressionEvent(
        compressed=pb.ContextCompressed(
            summary=outcome.summary_text,
            messages_before=len(loaded.messages),
            messages_after=len(outcome.new_context),
            context_tokens=accounting.context_tokens,
            max_context_tokens=loaded.window,
            method=outcome.method,
            breadcrumbs=outcome.breadcrumbs,
            replaced=replaced,
            chunks_indexed=result.chunks_indexed + indexed_apart,
            revision=result.revision,
            tokens_before=accounting.tokens_before,
            tokens_after=accounting.tokens_after,
            target_tokens=accounting.target_tokens,
            shortfall=accounting.shortfall,
        )
    )

"""Compression: WouldCompress (a dry run) and Compress (plan, prune or summarize, commit)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

import grpc

from palimpsest.compressor import pipeline
from palimpsest.compressor.committing import Committer, Loaded, commit_outcome, prune_turn_end
from palimpsest.compressor.dry_run import DryRun
from palimpsest.compressor.pricing import Knobs, Pricing, SessionState
from palimpsest.compressor.rpcs.base import CompressorBase, CompressorRequest
from palimpsest.compressor.stages import PrefixSource, summarize_or_truncate
from palimpsest.compressor.stored_counts import primed
from palimpsest.compressor.summarizer import Prefix, Summarizer
from palimpsest.compressor.summary_prefix import build_prefix
from palimpsest.compressor.token_estimate import trigger_tokens
from palimpsest.shared.auth import as_service
from palimpsest.shared.errors import Aborted, FailedPrecondition, InvalidArgument
from palimpsest.v1 import common_pb2
from palimpsest.v1 import compressor_pb2 as pb
from palimpsest.v1 import session_store_pb2 as store_pb


class CompressRpcs(CompressorBase):
    def _read_by_dry_run(self, request: CompressorRequest) -> DryRun | None:
        """The dry run, when the Compress names the very revision it read (taken: used once)."""
        dry = self._dry_runs.pop(request.session_id, None)
        if dry is None or not isinstance(request, pb.CompressRequest) or not request.HasField("expected_revision"):
            return None
        return dry if dry.session.revision == request.expected_revision else None

    async def _prepare(
        self, request: CompressorRequest
    ) -> tuple[int, Knobs, SessionState, str, Pricing, list[common_pb2.Message], int, DryRun | None]:
        if not request.session_id:
            raise InvalidArgument("session_id", "required")
        if request.keep_recent_messages < 0:
            raise InvalidArgument("keep_recent_messages", "must not be negative")
        if request.current_tokens < 0:
            raise InvalidArgument("current_tokens", "must not be negative")
        window = self._window(request.window)
        knobs = Knobs.resolve(self.settings, request.settings)
        dry = self._read_by_dry_run(request)
        # Without the dry run's read, this replica may never have counted the session: the store's
        # counts of it spare encoding it all again.
        counter = await self.tokenizers.counter(request.model) if request.model and dry is None else None
        state = await self._load(
            request.session_id,
            request.model,
            with_context=dry is None,
            token_digest=counter.digest if counter is not None else "",
            with_counts=counter is not None,
        )
        if dry is not None:
            state.session = dry.session
        model = request.model or state.session.model
        pricing = await self._pricing(model, window, knobs, state.observations, self._usable_baseline(state, model))
        if pricing.counter is counter and counter is not None and state.context_tokens is not None:
            pricing = replace(pricing, counter=primed(counter, state.context, state.context_tokens.counts))
        context_messages = state.context
        current = request.current_tokens or (await asyncio.to_thread(pricing.with_baseline, context_messages))[0].tokens
        return window, knobs, state, model, pricing, context_messages, current, dry

    async def _prefix_source(
        self,
        request: pb.CompressRequest,
        summarizer: Summarizer,
        messages: Sequence[common_pb2.Message],
        pricing: Pricing,
    ) -> PrefixSource | None:
        """How a summary's prefix form is built for this request: only when the session's own model
        writes it and the caller said what its prompts begin with."""
        head, schemas = list(request.prompt_head), list(request.tool_schemas)
        if not summarizer.same_model or not head:
            return None
        vision = (await self.ollama.model_facts(summarizer.model)).vision

        def prefix_for(summarized: list[common_pb2.Message], scope: str) -> Prefix | None:
            return build_prefix(head, schemas, messages, summarized, pricing, vision, scope)

        return prefix_for

    @staticmethod
    def _check_prompt_head(request: pb.CompressRequest) -> None:
        for i, message in enumerate(request.prompt_head):
            if message.role != "system":
                raise InvalidArgument(f"prompt_head[{i}].role", f"must be system, got {message.role!r}")
        for i, schema in enumerate(request.tool_schemas):
            try:
                parsed = json.loads(schema)
            except ValueError as exc:
                raise InvalidArgument(f"tool_schemas[{i}]", f"is not JSON: {exc}") from None
            if not isinstance(parsed, dict):
                raise InvalidArgument(f"tool_schemas[{i}]", "must be a JSON object")

    async def WouldCompress(
        self,
        request: pb.WouldCompressRequest,
        context: grpc.aio.ServicerContext[pb.WouldCompressRequest, pb.WouldCompressResponse],
    ) -> pb.WouldCompressResponse:
        window, knobs, state, model, pricing, messages, current, _ = await self._prepare(request)
        staged = await self._plan(
            messages,
            pricing,
            knobs,
            window,
            request.keep_recent_messages,
            current,
            self._prunes(knobs, pb.COMPRESSION_REASON_PRETURN),
        )
        plan = staged.plan
        kept = pricing.estimate(plan.system + plan.to_keep)
        mode, _ = await self._decide(staged, pricing, knobs, window, current > self._limit(window, knobs))
        return pb.WouldCompressResponse(
            would_compress=mode != "none",
            messages_before=len(messages),
            messages_after=len(plan.system) + len(plan.to_keep) + (0 if plan.is_empty else 1),
            tokens_before=current,
            kept_tokens=kept,
        )

    async def Compress(
        self, request: pb.CompressRequest, context: grpc.aio.ServicerContext[pb.CompressRequest, pb.CompressionEvent]
    ) -> AsyncIterator[pb.CompressionEvent]:
        """Shrink a session's context and commit it: ``started``, then ``compressed``.

        Loads the session's context and pricing, refuses a stale ``expected_revision`` (ABORTED),
        and with ``only_if_over_threshold`` returns without events under the trigger. Otherwise it
        plans what to keep; FAILED_PRECONDITION when nothing can shrink. Old tool results and call
        arguments are pruned first (not for FORCED); what remains over the target is summarized
        (hard truncation when the summarizer fails), and one CommitCompression writes the result.
        When even that drops nothing, ``compressed`` reports the context unchanged and nothing is committed.
        """
        if request.reason not in pipeline._REASON_NAMES:
            raise InvalidArgument("reason", "one of PRETURN, MIDTURN, POSTTURN, FORCED, TURN_END is required")
        if request.next_prompt_tokens < 0:
            raise InvalidArgument("next_prompt_tokens", "must not be negative")
        if request.next_prompt_tokens and request.reason != pb.COMPRESSION_REASON_TURN_END:
            raise InvalidArgument("next_prompt_tokens", "only a TURN_END compression (inside a tool loop) takes it")
        self._check_prompt_head(request)
        window, knobs, state, model, pricing, messages, current, dry = await self._prepare(request)
        loaded = Loaded(state, window, knobs, pricing, messages, current)
        if request.HasField("expected_revision") and state.session.revision != request.expected_revision:
            raise Aborted(
                f"session {state.session.id} is at revision {state.session.revision}, not the expected "
                f"{request.expected_revision}: another writer changed it"
            )
        if request.reason == pb.COMPRESSION_REASON_TURN_END:
            async for event in prune_turn_end(self._committer(request), loaded, request.next_prompt_tokens):
                yield event
            return
        truncated_flag = state.baseline is not None and state.baseline.context_truncated
        if request.only_if_over_threshold and request.reason != pb.COMPRESSION_REASON_FORCED:
            if current < trigger_tokens(knobs.threshold, window, knobs.output_reserve) and not truncated_flag:
                return  # under the threshold: nothing to do, no events
        keep = request.keep_recent_messages
        prune = self._prunes(knobs, request.reason)
        staged = dry.plan_for(keep, pricing, knobs, window, current, prune) if dry is not None else None
        if staged is None:
            staged = await self._plan(messages, pricing, knobs, window, keep, current, prune)
        # Any gain will do when it was asked for, or when the prompt did not fit (the alternative is a cut).
        any_gain = (
            request.reason == pb.COMPRESSION_REASON_FORCED or truncated_flag or current > self._limit(window, knobs)
        )
        mode, frees = await self._decide(staged, pricing, knobs, window, any_gain)
        if mode == "none":
            if truncated_flag:  # consumed: there is nothing this session can shed
                with as_service():
                    await self.store.SetBaseline(
                        store_pb.SetBaselineRequest(
                            session_id=state.session.id,
                            only_truncated_flag=True,
                            baseline=store_pb.Baseline(context_truncated=False),
                        )
                    )
            if frees > 0:
                raise FailedPrecondition(
                    f"compression of session {state.session.id} not run: it would free ~{frees} tokens, less than "
                    f"the minimum of {knobs.min_freed:.0%} of the {window}-token window (min_freed)"
                )
            raise FailedPrecondition(
                f"nothing to compress in session {state.session.id}: the context cannot shrink "
                f"({len(messages)} messages, ~{current} tokens)"
            )
        yield pb.CompressionEvent(started=pb.CompressionStarted(context_tokens=current, max_context_tokens=window))
        if mode == "prune":
            outcome = await asyncio.to_thread(pipeline.prune_outcome, messages, staged.pruning)
        else:
            summarizer = Summarizer(self.ollama, knobs, model, window)
            outcome = await summarize_or_truncate(
                messages,
                staged,
                pricing,
                knobs,
                summarizer,
                window,
                await self._prefix_source(request, summarizer, messages, pricing),
            )
        async for event in commit_outcome(self._committer(request), loaded, outcome):
            yield event

    def _committer(self, request: pb.CompressRequest) -> Committer:
        return Committer(self.store, request.reason, self.settings.max_message_bytes)

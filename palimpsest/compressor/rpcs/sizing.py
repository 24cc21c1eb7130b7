"""The size checks: EstimateTokens, CheckContextSize (with its dry run of the compression it
would ask for) and RecordBaseline (a model's report of a prompt it evaluated)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import replace

import grpc

from palimpsest.compressor.calibration import tokens_per_char
from palimpsest.compressor.dry_run import DryRun
from palimpsest.compressor.model_reports import record_report
from palimpsest.compressor.model_tokenizers import TokenCounter
from palimpsest.compressor.planner import intra_turn_keep
from palimpsest.compressor.priced import counted_parts, priced, pricing_work, reportable
from palimpsest.compressor.pricing import Knobs, Pricing, shape_to_proto
from palimpsest.compressor.rpcs.base import CompressorBase
from palimpsest.compressor.size_check import deepen_cuts
from palimpsest.compressor.stored_counts import fresh_counts
from palimpsest.compressor.token_estimate import Estimate, fits, trigger_tokens
from palimpsest.shared.auth import as_service, caller
from palimpsest.shared.context_view import message_budget
from palimpsest.shared.errors import InvalidArgument, PalimpsestError, Unavailable
from palimpsest.shared.session_reads import whole_context
from palimpsest.v1 import common_pb2
from palimpsest.v1 import compressor_pb2 as pb
from palimpsest.v1 import session_store_pb2 as store_pb

log = logging.getLogger("palimpsest.compressor")

# Sessions whose stored rows this replica has written counts for, newest first out.
COUNTED_SESSIONS = 10_000


class SizeRpcs(CompressorBase):
    # -- estimates ---------------------------------------------------------------------------
    async def EstimateTokens(
        self,
        request: pb.EstimateTokensRequest,
        context: grpc.aio.ServicerContext[pb.EstimateTokensRequest, pb.EstimateTokensResponse],
    ) -> pb.EstimateTokensResponse:
        """The prompt the model would get next, counted: the stored context (or ``messages``) and
        ``incoming``, with the preamble and tool schemas the request gives (the baseline method:
        those of the last real prompt). The reply's ``counted`` names what is in."""
        window = self._window(request.window)
        knobs = Knobs.resolve(self.settings, request.settings)
        incoming, schemas, preamble = list(request.incoming), list(request.tool_schemas), list(request.preamble)
        if preamble and request.messages:
            raise InvalidArgument(
                "preamble",
                "only with a session's stored context (no messages): the built "
                "context in messages already begins with it",
            )
        counter = await self.tokenizers.counter(request.model)
        if request.session_id and not request.messages and counter is not None:
            # The stored context as a sum of per-message counts: only rows never counted are read
            # and counted (then written back), so the cost follows new messages, not the history.
            state, observations = await asyncio.gather(
                self._load(
                    request.session_id,
                    "",
                    with_context=False,
                    token_digest=counter.digest,
                    view_budget=message_budget(window, knobs.message_token_budget),
                ),
                self._recent_observations(request.model),
            )
            pricing = Pricing.build(observations, window, knobs, None, counter)
            # The store answers a token_digest with the context's counts (GetBaseline).
            assert state.context_tokens is not None
            unstored = [*preamble, *incoming]
            estimate, fresh = await priced(
                pricing.stored_estimate,
                state.context_tokens,
                unstored,
                schemas,
                chars=pricing_work(state.context_tokens.uncounted) + pricing_work(unstored),
            )
            self._remember_counts(
                request.session_id,
                counter.digest,
                [common_pb2.TokenCount(seq=seq, tokens=n, content_md5=md5) for seq, n, md5 in fresh],
            )
            method = pb.ESTIMATE_METHOD_EXACT
        else:
            if request.session_id:
                state = await self._load(request.session_id, request.model, with_context=not request.messages)
                pricing = await self._pricing(
                    request.model, window, knobs, state.observations, self._usable_baseline(state, request.model)
                )
                messages = [*preamble, *(list(request.messages) or state.context)]
            else:
                pricing = await self._pricing(request.model, window, knobs, await self._observations(request.model))
                messages = [*preamble, *request.messages]
            if not pricing.exact and not pricing.has_baseline and schemas:
                # The calibrated line prices text, not schemas: they are priced as the text the model gets.
                incoming.append(common_pb2.Message(role="system", content="\n".join(schemas)))
            estimate, method = await priced(
                pricing.with_baseline,
                messages,
                incoming,
                schemas,
                chars=pricing_work(messages) + pricing_work(incoming),
            )
        return pb.EstimateTokensResponse(
            tokens=estimate.tokens,
            text_tokens=estimate.text_tokens,
            image_tokens=estimate.image_tokens,
            chars=estimate.chars,
            method=method,
            baseline_tokens=estimate.baseline_tokens,
            delta_tokens=estimate.tokens - estimate.baseline_tokens,
            shape=shape_to_proto(estimate.shape) if estimate.shape else None,
            counted=counted_parts(
                method, preamble=bool(preamble), incoming=bool(request.incoming), schemas=bool(schemas)
            ),
        )

    def _new_counts(
        self, session_id: str, counter: TokenCounter, messages: Sequence[common_pb2.Message], budget: int
    ) -> list[common_pb2.TokenCount]:
        """The counts of rows a size check sees for the first time, for its caller to store with the
        call's report: a message is counted once, at the first check after it was written, and
        every later sum (EstimateTokens, the context meter, another replica) reads it from the store."""
        key = (session_id, counter.digest)
        through = self._counted_through.get(key, 0)
        # A sliced message's count is scaled from its head and tail: not a count to keep.
        new = [m for m in messages if m.seq > through and not m.images and not m.sliced_from_chars]
        newest = max((m.seq for m in messages), default=0)
        if newest > through:
            self._counted_through[key] = newest
            self._counted_through.move_to_end(key)
            while len(self._counted_through) > COUNTED_SESSIONS:
                self._counted_through.popitem(last=False)
        counts, with_cuts = fresh_counts(new, counter, budget)
        self._remember_counts(session_id, counter.digest, with_cuts)
        return counts

    def _remember_counts(self, session_id: str, digest: str, counts: list[common_pb2.TokenCount]) -> None:
        """Write fresh per-message counts back, off the request's path; a lost write only means the
        rows are counted again next time."""
        if not counts:
            return
        request = store_pb.SetTokenCountsRequest(session_id=session_id, token_digest=digest, counts=counts)

        async def write() -> None:
            try:
                with as_service():
                    await self.store.SetTokenCounts(request)
            except PalimpsestError as exc:
                log.warning("could not store token counts of %s: %s", session_id, exc)

        task = asyncio.get_running_loop().create_task(write())
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def CheckContextSize(
        self,
        request: pb.CheckContextSizeRequest,
        context: grpc.aio.ServicerContext[pb.CheckContextSizeRequest, pb.CheckContextSizeResponse],
    ) -> pb.CheckContextSizeResponse:
        """The one question before every model call: the view to send, its size, and whether it
        fits, must be compressed first, or cannot be sent at all."""
        window = self._window(request.window)
        if not request.messages:
            raise InvalidArgument("messages", "the built context to check is required")
        if request.keep_recent_messages < 0:
            raise InvalidArgument("keep_recent_messages", "must not be negative")
        if request.decide_compression and not request.session_id:
            raise InvalidArgument("session_id", "required to decide on compression")
        knobs = Knobs.resolve(self.settings, request.settings)
        counter = await self.tokenizers.counter(request.model)
        if counter is not None:
            # Exact: nothing of the session is needed, only the model's template reports (no store
            # round trip on the way to the first token while they are fresh).
            pricing = Pricing.build(await self._recent_observations(request.model), window, knobs, None, counter)
        elif request.session_id:
            state = await self._load(request.session_id, request.model, with_context=False)
            pricing = await self._pricing(
                request.model, window, knobs, state.observations, self._usable_baseline(state, request.model)
            )
        else:
            pricing = await self._pricing(request.model, window, knobs, await self._observations(request.model))
        messages, schemas = list(request.messages), list(request.tool_schemas)
        view, cuts, estimate, method = await priced(
            self._price_view, pricing, messages, schemas, chars=pricing_work(messages)
        )
        new_counts = (
            self._new_counts(request.session_id, counter, messages, pricing.budget)
            if counter is not None and request.session_id
            else []
        )
        limit = self._limit(window, knobs)
        trigger = int(trigger_tokens(knobs.threshold, window, knobs.output_reserve))
        decision = (
            pb.SIZE_DECISION_FITS if fits(estimate.tokens, window, knobs.output_reserve) else pb.SIZE_DECISION_TOO_LARGE
        )
        keep = await self._shrinking_keep(request, estimate.tokens, trigger, limit, window, knobs, pricing)
        if keep is not None:
            decision = pb.SIZE_DECISION_COMPRESS_FIRST
        elif decision == pb.SIZE_DECISION_TOO_LARGE:
            # Nothing left to compress: cut the largest tool results further rather than lose the
            # turn (the full text stays in the display history).
            deeper = await asyncio.to_thread(deepen_cuts, pricing, messages, schemas, limit)
            if deeper is not None:
                view, cuts, estimate = deeper
                estimate = reportable(pricing, view, estimate)
                decision = pb.SIZE_DECISION_FITS
        return pb.CheckContextSizeResponse(
            fits=decision == pb.SIZE_DECISION_FITS,
            tokens=estimate.tokens,
            limit=limit,
            method=method,
            tokens_per_char=tokens_per_char(pricing.line),
            decision=decision,
            cuts=[pb.ViewCut(index=i, content=c) for i, c in sorted(cuts.items())],
            shape=shape_to_proto(estimate.shape) if estimate.shape else None,
            trigger=trigger,
            compress_keep_recent_messages=keep or 0,
            token_digest=counter.digest if counter is not None and new_counts else "",
            new_counts=new_counts,
        )

    @staticmethod
    def _price_view(
        pricing: Pricing, messages: Sequence[common_pb2.Message], schemas: Sequence[str]
    ) -> tuple[list[common_pb2.Message], dict[int, str], Estimate, pb.EstimateMethod]:
        view, cuts = pricing.view(messages)
        return view, cuts, reportable(pricing, view, pricing.count_view(view, schemas)), pricing.method

    async def _shrinking_keep(
        self,
        request: pb.CheckContextSizeRequest,
        tokens: int,
        trigger: int,
        limit: int,
        window: int,
        knobs: Knobs,
        pricing: Pricing,
    ) -> int | None:
        """The keep_recent_messages of a compression that would shrink the stored context, when one
        is due: over the trigger, the request's own plan (whole turns before the first call, the
        long turn's newest messages later); over the limit, also the intra-turn plan, which can
        shed the older part of one long turn."""
        if not request.decide_compression or tokens < trigger:
            return None
        try:
            session = await whole_context(self.store.GetSession, request.session_id)
        except Unavailable as exc:  # the dry run is advice: without it the prompt is still sized
            log.warning("compression dry run for %s failed: %s", request.session_id, exc)
            return None
        stored = list(session.context)
        # Kept for the next Compress without this request's memory of its messages (the request
        # itself would stay alive with them).
        dry = DryRun(session, replace(pricing), knobs, window, tokens)
        self._kept_for_compress(dry)
        candidates = [request.keep_recent_messages]
        if tokens > limit:
            candidates.append(intra_turn_keep(knobs.keep_recent))
        for keep in dict.fromkeys(candidates):
            staged = dry.plans[keep] = await self._plan(
                stored, pricing, knobs, window, keep, tokens, self._prunes(knobs, pb.COMPRESSION_REASON_PRETURN)
            )
            if (await self._decide(staged, pricing, knobs, window, tokens > limit))[0] != "none":
                return keep
        return None

    async def RecordBaseline(
        self,
        request: pb.RecordBaselineRequest,
        context: grpc.aio.ServicerContext[pb.RecordBaselineRequest, pb.RecordBaselineResponse],
    ) -> pb.RecordBaselineResponse:
        # Reports teach every session of the model: only the services may make them.
        caller().require_service("a model report")
        return await record_report(self.store, request)

"""The Compressor gRPC servicer. It keeps no session state: what it decides on is loaded from the
store per request (a model's template reports may be up to 5 s old; tokenizers are cached per model
digest), so replicas answer alike and a replica can die mid-request losing nothing."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

import grpc

from palimpsest.compressor import pipeline
from palimpsest.compressor.calibration import tokens_per_char
from palimpsest.compressor.committing import Committer, Loaded, commit_outcome, prune_turn_end
from palimpsest.compressor.dry_run import DRY_RUN_KEEP_BYTES, DRY_RUN_SESSIONS, DryRun
from palimpsest.compressor.model_reports import MAX_WINDOW, record_report
from palimpsest.compressor.model_tokenizers import ModelTokenizers, TokenCounter
from palimpsest.compressor.planner import intra_turn_keep
from palimpsest.compressor.priced import counted_parts, priced, pricing_work, reportable
from palimpsest.compressor.pricing import Knobs, Pricing, SessionState, shape_to_proto
from palimpsest.compressor.size_check import deepen_cuts
from palimpsest.compressor.stages import PrefixSource, Staged, decide, stage, summarize_or_truncate
from palimpsest.compressor.stored_counts import fresh_counts, primed
from palimpsest.compressor.summarizer import Prefix, Summarizer
from palimpsest.compressor.summary_prefix import build_prefix
from palimpsest.compressor.token_estimate import Estimate, fits, output_reserve, trigger_tokens
from palimpsest.shared.auth import as_service, caller, vouching_metadata
from palimpsest.shared.context_view import message_budget
from palimpsest.shared.errors import Aborted, FailedPrecondition, InvalidArgument, PalimpsestError, Unavailable
from palimpsest.shared.ollama import OllamaClient
from palimpsest.shared.session_reads import whole_context
from palimpsest.shared.settings import Settings
from palimpsest.shared.stubs import AsyncStoreStub
from palimpsest.v1 import common_pb2, compressor_pb2_grpc
from palimpsest.v1 import compressor_pb2 as pb
from palimpsest.v1 import session_store_pb2 as store_pb

# The calls that plan a compression: WouldCompress (a dry run) and Compress.
CompressorRequest = pb.WouldCompressRequest | pb.CompressRequest

log = logging.getLogger("palimpsest.compressor")

# Sessions whose stored rows this replica has written counts for, newest first out.
COUNTED_SESSIONS = 10_000
OBSERVATIONS_TTL_S = 5.0


class CompressorServicer(compressor_pb2_grpc.CompressorServicer):
    def __init__(self, store: AsyncStoreStub, ollama: OllamaClient, settings: Settings) -> None:
        self.store = store
        self.ollama = ollama
        self.settings = settings
        self.tokenizers = ModelTokenizers(ollama, settings.data_dir / "tokenizers")
        self._writes: set[asyncio.Task] = set()  # token counts on their way to the store
        self._observation_cache: dict[str, tuple[float, list[store_pb.Observation]]] = {}
        # What the size check's dry run read and planned, by session (see _kept_for_compress).
        self._dry_runs: OrderedDict[str, DryRun] = OrderedDict()
        # (session, tokenizer digest) → the highest seq whose count this replica has stored.
        self._counted_through: OrderedDict[tuple[str, str], int] = OrderedDict()

    # -- loading -----------------------------------------------------------------------------
    def _window(self, window: int) -> int:
        if window < 0 or window > MAX_WINDOW:
            raise InvalidArgument("window", f"must be between 1 and {MAX_WINDOW}, got {window}")
        return window or self.settings.ollama_num_ctx

    @staticmethod
    def _limit(window: int, knobs: Knobs) -> int:
        """The most a prompt may be: the window less the room kept for the answer."""
        return window - output_reserve(window, knobs.output_reserve)

    async def _recent_observations(self, model: str) -> list[store_pb.Observation]:
        """The model's observations, read at most every OBSERVATIONS_TTL_S by this replica: a
        template fitted on reports a few seconds old differs by a token or two, which its margin
        already covers, and a model's every call adds one."""
        cached = self._observation_cache.get(model)
        if cached is not None and time.monotonic() - cached[0] < OBSERVATIONS_TTL_S:
            return cached[1]
        observations = await self._observations(model)
        self._observation_cache[model] = (time.monotonic(), observations)
        return observations

    async def _observations(self, model: str) -> list[store_pb.Observation]:
        if not model:
            return []
        with as_service():  # every user's prompt sizes: the services' to read, nobody else's
            reply = await self.store.ListObservations(store_pb.ListObservationsRequest(model=model))
        return list(reply.observations)

    async def _load(
        self,
        session_id: str,
        model: str,
        *,
        with_context: bool = True,
        token_digest: str = "",
        view_budget: int = 0,
        with_counts: bool = False,
    ) -> SessionState:
        """Baseline and calibration in one read (with a digest, also the context's stored counts);
        the stored context itself only when the caller sent none and it cannot be summed."""
        # The caller's credentials read the session; the services' vouch, beside them, the model's
        # observations (every user's prompt sizes).
        baseline_call = self.store.GetBaseline(
            store_pb.GetBaselineRequest(
                session_id=session_id,
                model=model,
                token_digest=token_digest,
                view_budget=view_budget,
                with_counts=with_counts,
            ),
            metadata=vouching_metadata(self.settings.auth_enabled, self.settings.jwt_secret),
        )
        if with_context:
            pricing, session = await asyncio.gather(baseline_call, whole_context(self.store.GetSession, session_id))
        else:
            pricing, session = await baseline_call, common_pb2.Session(id=session_id)
        baseline = pricing.baseline if pricing.HasField("baseline") else None
        counted = pricing.context_tokens if pricing.HasField("context_tokens") else None
        return SessionState(session, baseline, list(pricing.observations), counted)

    async def _pricing(
        self,
        model: str,
        window: int,
        knobs: Knobs,
        observations: Sequence[store_pb.Observation],
        baseline: store_pb.Baseline | None = None,
    ) -> Pricing:
        counter = await self.tokenizers.counter(model)
        return Pricing.build(observations, window, knobs, baseline, counter)

    @staticmethod
    def _usable_baseline(state: SessionState, model: str) -> store_pb.Baseline | None:
        b = state.baseline
        if b is None or b.tokens <= 0 or (b.model and model and b.model != model):
            return None
        return b

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
                    view_budget=message_budget(window, knobs.message_budget),
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
        dry = DryRun(session, pricing, knobs, window, tokens)
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

    @staticmethod
    async def _decide(staged: Staged, pricing: Pricing, knobs: Knobs, window: int, any_gain: bool) -> tuple[str, int]:
        return await asyncio.to_thread(decide, staged, pricing, knobs, window, any_gain)

    @staticmethod
    def _prunes(knobs: Knobs, reason: int) -> bool:
        """Whether the pruning stage runs: on, and not for a forced compaction (who forces one
        wants the history summarized)."""
        return knobs.prune_tool_results and reason != pb.COMPRESSION_REASON_FORCED

    async def RecordBaseline(
        self,
        request: pb.RecordBaselineRequest,
        context: grpc.aio.ServicerContext[pb.RecordBaselineRequest, pb.RecordBaselineResponse],
    ) -> pb.RecordBaselineResponse:
        # Reports teach every session of the model: only the services may make them.
        caller().require_service("a model report")
        return await record_report(self.store, request)

    # -- compression -------------------------------------------------------------------------
    def _kept_for_compress(self, dry: DryRun) -> None:
        """What a size check's dry run read and planned, for the Compress that usually follows it
        (one whole-context read and one plan instead of two); a session too big to hold is read again."""
        if dry.session.ByteSize() > DRY_RUN_KEEP_BYTES:
            return
        self._dry_runs[dry.session.id] = dry
        self._dry_runs.move_to_end(dry.session.id)
        while len(self._dry_runs) > DRY_RUN_SESSIONS:
            self._dry_runs.popitem(last=False)

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

    @staticmethod
    async def _plan(
        messages: list[common_pb2.Message],
        pricing: Pricing,
        knobs: Knobs,
        window: int,
        keep_recent_messages: int,
        prompt_tokens: int,
        prune: bool,
    ) -> Staged:
        # Pure CPU over the whole context: off the event loop, so other sessions keep streaming.
        return await asyncio.to_thread(
            stage, messages, pricing, knobs, window, keep_recent_messages, prompt_tokens, prune
        )

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
        self._check_prompt_head(request)
        window, knobs, state, model, pricing, messages, current, dry = await self._prepare(request)
        loaded = Loaded(state, window, knobs, pricing, messages, current)
        if request.HasField("expected_revision") and state.session.revision != request.expected_revision:
            raise Aborted(
                f"session {state.session.id} is at revision {state.session.revision}, not the expected "
                f"{request.expected_revision}: another writer changed it"
            )
        if request.reason == pb.COMPRESSION_REASON_TURN_END:
            async for event in prune_turn_end(self._committer(request), loaded):
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

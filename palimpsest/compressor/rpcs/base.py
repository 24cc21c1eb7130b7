"""What every Compressor RPC stands on: the services it calls, the session and pricing it loads,
and the plan and decision shared by the size check (its dry run) and Compress."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Sequence

from palimpsest.compressor.dry_run import DRY_RUN_KEEP_BYTES, DRY_RUN_SESSIONS, DryRun
from palimpsest.compressor.model_reports import MAX_WINDOW
from palimpsest.compressor.model_tokenizers import ModelTokenizers
from palimpsest.compressor.pricing import Knobs, Pricing, SessionState
from palimpsest.compressor.stages import Staged, decide, stage
from palimpsest.compressor.token_estimate import output_reserve
from palimpsest.shared.auth import as_service, vouching_metadata
from palimpsest.shared.errors import InvalidArgument
from palimpsest.shared.ollama import OllamaClient
from palimpsest.shared.session_reads import whole_context
from palimpsest.shared.settings import Settings
from palimpsest.shared.stubs import AsyncStoreStub
from palimpsest.v1 import common_pb2
from palimpsest.v1 import compressor_pb2 as pb
from palimpsest.v1 import session_store_pb2 as store_pb

# The calls that plan a compression: WouldCompress (a dry run) and Compress.
CompressorRequest = pb.WouldCompressRequest | pb.CompressRequest
# How old the model's observations a replica prices with may be (see _recent_observations).
OBSERVATIONS_TTL_S = 5.0


class CompressorBase:
    """The state every Compressor RPC shares: clients, the tokenizers, and this replica's caches."""

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

    @staticmethod
    async def _decide(staged: Staged, pricing: Pricing, knobs: Knobs, window: int, any_gain: bool) -> tuple[str, int]:
        return await asyncio.to_thread(decide, staged, pricing, knobs, window, any_gain)

    @staticmethod
    def _prunes(knobs: Knobs, reason: int) -> bool:
        """Whether the pruning stage runs: on, and not for a forced compaction (who forces one
        wants the history summarized)."""
        return knobs.prune_tool_results and reason != pb.COMPRESSION_REASON_FORCED

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

    def _kept_for_compress(self, dry: DryRun) -> None:
        """What a size check's dry run read and planned, for the Compress that usually follows it
        (one whole-context read and one plan instead of two); a session too big to hold is read again."""
        if dry.session.ByteSize() > DRY_RUN_KEEP_BYTES:
            return
        self._dry_runs[dry.session.id] = dry
        self._dry_runs.move_to_end(dry.session.id)
        while len(self._dry_runs) > DRY_RUN_SESSIONS:
            self._dry_runs.popitem(last=False)

"""What the Compressor needs to know about a session before deciding anything, in one load:
its context, its real-token baseline and its model's calibration line."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from palimpsest.v1 import common_pb2, compressor_pb2, session_store_pb2 as store_pb
from services.compressor.calibration import Line, Observation, fit_line
from services.compressor.token_estimate import Estimate, baseline_delta_estimate, estimate_tokens
from services.shared.context_view import message_budget
from services.shared.errors import InvalidArgument
from services.shared.settings import Settings

Message = common_pb2.Message


@dataclass(frozen=True)
class Knobs:
    """Compression settings after the profile's overrides are applied to the service's."""

    threshold: float
    target: float
    keep_recent: int
    summary_max_tokens: int
    summary_temperature: float
    summarizer_model: str
    summarizer_window: int  # num_ctx of summaries written by summarizer_model
    summary_prompt: str
    critical_tools: tuple[str, ...]
    message_budget: int
    image_fallback: int
    output_reserve: int

    @classmethod
    def resolve(cls, settings: Settings, overrides: compressor_pb2.CompressionSettings | None) -> "Knobs":
        o = overrides or compressor_pb2.CompressionSettings()

        def pick(name: str, default):
            return getattr(o, name) if o.HasField(name) else default

        if o.summarizer_window < 0:
            raise InvalidArgument("settings.summarizer_window", f"must not be negative, got {o.summarizer_window}")

        return cls(
            threshold=pick("threshold", settings.compression_threshold),
            target=pick("target", settings.compression_target),
            keep_recent=pick("keep_recent", settings.keep_recent),
            summary_max_tokens=pick("summary_max_tokens", settings.summary_max_tokens),
            summary_temperature=pick("summary_temperature", settings.summary_temperature),
            summarizer_model=o.summarizer_model,
            summarizer_window=o.summarizer_window or max(0, settings.summarizer_num_ctx) or settings.ollama_num_ctx,
            summary_prompt=o.summary_prompt,
            critical_tools=tuple(o.critical_tools),
            message_budget=pick("message_token_budget", settings.message_token_budget),
            image_fallback=settings.image_tokens_fallback,
            output_reserve=settings.output_reserve_tokens,
        )


@dataclass
class Pricing:
    """Prices message lists for one model and window: calibrated line, view budget, baseline."""

    line: Line | None
    budget: int
    image_fallback: int
    baseline: store_pb.Baseline | None = None

    @classmethod
    def build(cls, observations: Sequence[store_pb.Observation], window: int, knobs: Knobs,
              baseline: store_pb.Baseline | None = None) -> "Pricing":
        # The store lists newest first; the fit wants them in the order they happened.
        line = fit_line([Observation(o.chars, o.tokens) for o in reversed(observations)])
        return cls(line, message_budget(window, knobs.message_budget), knobs.image_fallback, baseline)

    def estimate(self, messages: Sequence[Message]) -> int:
        return self.full(messages).tokens

    def full(self, messages: Sequence[Message]) -> Estimate:
        return estimate_tokens(messages, self.line, self.image_fallback, self.budget)

    @property
    def has_baseline(self) -> bool:
        return self.baseline is not None and self.baseline.tokens > 0

    def with_baseline(self, messages: Sequence[Message], incoming: Sequence[Message] = ()) -> tuple[Estimate, int]:
        """(estimate, method): the real baseline plus the calibrated delta when there is one."""
        if not self.has_baseline:
            method = compressor_pb2.ESTIMATE_METHOD_CALIBRATED if self.line else compressor_pb2.ESTIMATE_METHOD_FALLBACK
            return self.full([*messages, *incoming]), method
        # The prompt the baseline measured began with the system prompt (no seq), so it is paid
        # for; stored rows after the baseline and anything else not stored yet are the delta.
        body = list(messages)
        if body and body[0].seq == 0 and body[0].role == "system":
            body = body[1:]
        stored = [m for m in body if m.seq > 0]
        unstored = [m for m in body if m.seq == 0]
        estimate = baseline_delta_estimate(
            stored, self.baseline.tokens, self.baseline.through_seq, self.line, self.image_fallback, self.budget,
            incoming=[*unstored, *incoming],
        )
        return estimate, compressor_pb2.ESTIMATE_METHOD_BASELINE_DELTA


@dataclass
class SessionState:
    session: common_pb2.Session
    baseline: store_pb.Baseline | None
    observations: list[store_pb.Observation] = field(default_factory=list)

    @property
    def context(self) -> list[Message]:
        return list(self.session.context)

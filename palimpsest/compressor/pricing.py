"""What the Compressor needs to know about a session before deciding anything, in one load:
its context, its real-token baseline and its model's calibration line."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any

from palimpsest.compressor.calibration import (
    CHAR_CLASSES,
    Line,
    Observation,
    Rates,
    fit_line,
    fit_rates,
    prompt_classes,
)
from palimpsest.compressor.exact_count import (
    Counter,
    ExactObservation,
    Memo,
    Shape,
    Template,
    content_md5,
    counted_view,
    exact_view,
    fit_template,
    message_texts,
    message_tokens,
    shape_from,
    shape_of,
)
from palimpsest.compressor.token_estimate import (
    Estimate,
    baseline_delta_estimate,
    estimate_tokens,
    priced_view,
)
from palimpsest.shared.context_view import heuristic_tokens, message_budget, message_chars
from palimpsest.shared.errors import InvalidArgument
from palimpsest.shared.settings import Settings
from palimpsest.v1 import common_pb2, compressor_pb2
from palimpsest.v1 import session_store_pb2 as store_pb

# The empty message ``Pricing.added`` prices against with the model's vocabulary: it carries the
# template's fixed cost and safety margin alone.
_ANCHOR = common_pb2.Message(role="user")

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
    message_token_budget: int
    image_fallback: int
    output_reserve: int
    prune_tool_results: bool = True
    min_freed: float = 0.05  # share of the window
    index_memory: bool = True  # a compression's dropped messages become memory chunks

    @classmethod
    def resolve(cls, settings: Settings, overrides: compressor_pb2.CompressionSettings | None) -> "Knobs":
        o = overrides or compressor_pb2.CompressionSettings()

        def pick(name: str) -> Any:
            """The profile's override, else the service's setting of the same name (compression_<name>)."""
            return getattr(o, name) if o.HasField(name) else getattr(settings, f"compression_{name}")

        if o.summarizer_window < 0:
            raise InvalidArgument("settings.summarizer_window", f"must not be negative, got {o.summarizer_window}")
        _check_overrides(o)

        return cls(
            threshold=pick("threshold"),
            target=pick("target"),
            keep_recent=pick("keep_recent"),
            summary_max_tokens=pick("summary_max_tokens"),
            summary_temperature=pick("summary_temperature"),
            summarizer_model=o.summarizer_model,
            summarizer_window=o.summarizer_window
            or max(0, settings.compression_summarizer_window)
            or settings.ollama_num_ctx,
            summary_prompt=o.summary_prompt,
            critical_tools=tuple(o.critical_tools),
            message_token_budget=pick("message_token_budget"),
            image_fallback=settings.image_tokens_fallback,
            output_reserve=settings.output_reserve_tokens,
            prune_tool_results=pick("prune_tool_results"),
            min_freed=pick("min_freed"),
            index_memory=pick("index_memory"),
        )


# What a profile may set, and why: shares of the window, counts that fit the arithmetic they feed.
_SHARES = ("threshold", "target")
_COUNTS = {"keep_recent": 10_000, "summary_max_tokens": 10_000_000, "message_token_budget": 10_000_000}


def _check_overrides(o: compressor_pb2.CompressionSettings) -> None:
    """Refuse profile overrides no arithmetic can use (a threshold of -1e15 overflowed the trigger)."""
    for name in _SHARES:
        if o.HasField(name) and not (math.isfinite(getattr(o, name)) and 0 < getattr(o, name) <= 1):
            raise InvalidArgument(
                f"settings.{name}", f"must be a share of the window in (0, 1], got {getattr(o, name)}"
            )
    for name, most in _COUNTS.items():
        if o.HasField(name) and not 0 <= getattr(o, name) <= most:
            raise InvalidArgument(f"settings.{name}", f"must be between 0 and {most}, got {getattr(o, name)}")
    if o.HasField("min_freed") and not (math.isfinite(o.min_freed) and 0 <= o.min_freed < 1):
        raise InvalidArgument("settings.min_freed", f"must be a share of the window in [0, 1), got {o.min_freed}")
    if o.HasField("summary_temperature") and not (
        math.isfinite(o.summary_temperature) and 0 <= o.summary_temperature <= 2
    ):
        raise InvalidArgument("settings.summary_temperature", f"must be between 0 and 2, got {o.summary_temperature}")


def shape_from_proto(shape: common_pb2.PromptShape) -> Shape:
    return Shape(**{f.name: getattr(shape, f.name) for f in fields(Shape)})


def shape_to_proto(shape: Shape) -> common_pb2.PromptShape:
    return common_pb2.PromptShape(**shape.__dict__)


@dataclass
class Pricing:
    """Prices message lists for one model and window: exactly with the model's own tokenizer when
    it has one (``counter``), else by the calibrated line over a real baseline."""

    line: Line | None
    budget: int
    image_fallback: int
    baseline: store_pb.Baseline | None = None
    counter: Counter | None = None
    template: Template = field(default_factory=Template)
    rates: Rates | None = None  # per character class, for a model without a usable vocabulary
    # Each stored row's content tokens as this pricing counted them (see exact_count.Memo), for the
    # request that built it; ``replace`` (another counter, or a copy kept past the request) starts
    # an empty one.
    _memo: Memo = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def build(
        cls,
        observations: Sequence[store_pb.Observation],
        window: int,
        knobs: Knobs,
        baseline: store_pb.Baseline | None = None,
        counter: Counter | None = None,
    ) -> "Pricing":
        # The store lists newest first; the fit wants them in the order they happened.
        ordered = list(reversed(observations))
        line = fit_line([Observation(o.chars, o.tokens) for o in ordered if o.chars > 0])
        template = fit_template(
            [ExactObservation(shape_from_proto(o.exact), o.tokens) for o in ordered if o.exact.content_tokens > 0]
        )
        rates = (
            None
            if counter is not None
            else fit_rates(
                [(o.exact.messages, shape_classes(o.exact), o.tokens) for o in ordered if o.exact.content_tokens == 0]
            )
        )
        return cls(
            line,
            message_budget(window, knobs.message_token_budget),
            knobs.image_fallback,
            baseline,
            counter,
            template,
            rates,
        )

    def plans_like(self, other: "Pricing") -> bool:
        """Whether a plan made with ``other`` is the plan this pricing would make. With the model's
        tokenizer the baseline enters no count, so only the rest must agree."""
        if self.exact:
            return replace(self, baseline=None) == replace(other, baseline=None)
        return self == other

    @property
    def exact(self) -> bool:
        return self.counter is not None

    @property
    def method(self) -> compressor_pb2.EstimateMethod:
        if self.exact:
            return compressor_pb2.ESTIMATE_METHOD_EXACT
        if self.has_baseline:
            return compressor_pb2.ESTIMATE_METHOD_BASELINE_DELTA
        calibrated = self.line is not None or self.rates is not None
        return compressor_pb2.ESTIMATE_METHOD_CALIBRATED if calibrated else compressor_pb2.ESTIMATE_METHOD_FALLBACK

    def view(
        self, messages: Sequence[Message], budgets: dict[int, int] | None = None
    ) -> tuple[list[Message], dict[int, str]]:
        """The view the model is sent and the cut contents by index. The same message always gets
        the same cut: exact token boundaries, or (without a tokenizer) the fixed chars / 1.8 rate."""
        if self.counter is not None:
            return exact_view(messages, self.budget, self.counter, budgets)
        view = priced_view(messages, self.budget, budgets)
        return view, {i: v.content for i, (m, v) in enumerate(zip(messages, view)) if v is not m}

    def message_costs(self, view: Sequence[Message]) -> list[int]:
        """What each message of a view costs on its own: exact content tokens, or the fixed-rate
        price the fallback view is cut at."""
        if self.counter is not None:
            return message_tokens(view, self.counter, self._memo)
        return [heuristic_tokens(message_chars(m)) for m in view]

    def count_view(self, view: Sequence[Message], tool_schemas: Sequence[str] = ()) -> Estimate:
        """The count of a view that is already cut (cutting it again changes nothing)."""
        if self.counter is not None:
            return self.priced_view(view, tool_schemas)
        return self.with_baseline(view)[0]

    def estimate(self, messages: Sequence[Message]) -> int:
        """A whole prompt made of ``messages``: its fixed cost (the template's constant and safety
        margin, or the calibrated line's intercept, about the system prompt and tools) included."""
        return self.full(messages).tokens

    def added(self, messages: Sequence[Message]) -> int:
        """What ``messages`` add to a prompt whose fixed cost is paid: the measure to add up or take
        apart. Summed, single-message estimates charged that cost once each: at calibrated prices
        about 500 tokens a message, so four pruned messages seemed to free 2,200 tokens for 750."""
        if self.counter is None:
            return estimate_tokens(
                messages, self.line, self.image_fallback, self.budget, self.rates, whole=False
            ).tokens
        return max(0, self.estimate([_ANCHOR, *messages]) - self._anchor_tokens)

    @cached_property
    def _anchor_tokens(self) -> int:
        """The empty anchor's whole estimate: the prompt's fixed cost, taken off every ``added``."""
        return self.estimate([_ANCHOR])

    def full(self, messages: Sequence[Message], tool_schemas: Sequence[str] = ()) -> Estimate:
        if self.counter is None:
            return estimate_tokens(messages, self.line, self.image_fallback, self.budget, self.rates)
        # The view and its counts in one pass: what the view keeps whole is counted once.
        view, _, tokens = counted_view(messages, self.budget, self.counter, memo=self._memo)
        if not view and not tool_schemas:
            return Estimate(tokens=0, text_tokens=0, image_tokens=0, chars=0)
        return self._exact(shape_from(view, tokens, tool_schemas, self.counter, self.image_fallback), view)

    def priced_view(self, view: Sequence[Message], tool_schemas: Sequence[str] = ()) -> Estimate:
        """An exact count of a view that is already cut."""
        assert self.counter is not None
        if not view and not tool_schemas:
            return Estimate(tokens=0, text_tokens=0, image_tokens=0, chars=0)
        return self._exact(shape_of(view, tool_schemas, self.counter, self.image_fallback), view)

    def _exact(self, shape: Shape, view: Sequence[Message]) -> Estimate:
        images = self.template.image_tokens(shape)
        tokens = self.template.tokens(shape)
        return Estimate(
            tokens=tokens,
            text_tokens=tokens - images,
            image_tokens=images,
            chars=sum(len(m.content) for m in view),
            shape=shape,
        )

    def stored_estimate(
        self, stored: store_pb.ContextTokens, incoming: Sequence[Message] = (), tool_schemas: Sequence[str] = ()
    ) -> tuple[Estimate, list[tuple[int, int, str]]]:
        """An exact count of a stored context from the store's sum of per-message counts, plus the
        rows it had no count for and ``incoming``; returns the estimate and the fresh (seq, tokens)
        counts to store as (seq, tokens, content md5) (rows with images are counted each time: their
        images are priced apart)."""
        assert self.counter is not None
        uncounted = list(stored.uncounted)
        fresh = [
            (m.seq, tokens, content_md5(m))
            for m, tokens in zip(uncounted, message_tokens(uncounted, self.counter))
            if not m.images
        ]
        view, _ = self.view([*uncounted, *incoming])
        shape = shape_of(view, tool_schemas, self.counter, self.image_fallback)
        shape = Shape(
            content_tokens=shape.content_tokens + stored.counted_tokens,
            messages=shape.messages + stored.counted_messages,
            tool_results=shape.tool_results + stored.counted_tool_results,
            tool_calls=shape.tool_calls + stored.counted_tool_calls,
            tools=shape.tools,
            image_prior_tokens=shape.image_prior_tokens,
            images=shape.images,
        )
        return self._exact(shape, view), fresh

    @property
    def has_baseline(self) -> bool:
        return self.baseline is not None and self.baseline.tokens > 0

    def with_baseline(
        self, messages: Sequence[Message], incoming: Sequence[Message] = (), tool_schemas: Sequence[str] = ()
    ) -> tuple[Estimate, compressor_pb2.EstimateMethod]:
        """(estimate, method): exact when the model's tokenizer is known; else the real baseline plus
        the calibrated delta when there is one; else the calibrated line over everything."""
        if self.exact:
            return self.full([*messages, *incoming], tool_schemas), compressor_pb2.ESTIMATE_METHOD_EXACT
        if not self.has_baseline:
            return self.full([*messages, *incoming]), self.method
        assert self.baseline is not None  # has_baseline
        # The prompt the baseline measured began with the system prompt and the memory message (no
        # seq; both unchanged since, or a compression dropped the baseline), so they are paid for;
        # stored rows after the baseline and anything else not stored yet are the delta.
        body = list(messages)
        while body and body[0].seq == 0 and body[0].role == "system":
            body = body[1:]
        stored = [m for m in body if m.seq > 0]
        unstored = [m for m in body if m.seq == 0]
        estimate = baseline_delta_estimate(
            stored,
            self.baseline.tokens,
            self.baseline.through_seq,
            self.line,
            self.image_fallback,
            self.budget,
            incoming=[*unstored, *incoming],
            rates=self.rates,
        )
        return estimate, compressor_pb2.ESTIMATE_METHOD_BASELINE_DELTA


def shape_classes(shape: common_pb2.PromptShape | Shape) -> tuple[int, ...]:
    return tuple(getattr(shape, f"chars_{name}") for name in CHAR_CLASSES)


def calibrated_shape(view: Sequence[Message]) -> Shape:
    """What a calibrated report learns from: the prompt's messages and its characters by class."""
    classes = prompt_classes([text for m in view for text in message_texts(m)])
    return Shape(
        messages=len(view),
        tool_results=sum(1 for m in view if m.role == "tool"),
        tool_calls=sum(len(m.tool_calls) for m in view),
        images=sum(len(m.images) for m in view),
        **{f"chars_{name}": count for name, count in zip(CHAR_CLASSES, classes)},
    )


@dataclass
class SessionState:
    session: common_pb2.Session
    baseline: store_pb.Baseline | None
    observations: list[store_pb.Observation] = field(default_factory=list)
    context_tokens: store_pb.ContextTokens | None = None

    @property
    def context(self) -> list[Message]:
        return list(self.session.context)

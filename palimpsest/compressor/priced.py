"""Pricing on the request's path: what an estimate counts, where it runs (the event loop or a thread),
and the shape a calibrated estimate carries back."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from palimpsest.compressor.pricing import Pricing, calibrated_shape
from palimpsest.compressor.token_estimate import Estimate
from palimpsest.v1 import common_pb2
from palimpsest.v1 import compressor_pb2 as pb

R = TypeVar("R")

# Pricing this much text or less runs on the event loop: a thread hop costs ~1 ms on a busy
# 2-core machine (measured on the first token's path), more than counting cached messages does.
INLINE_PRICING_CHARS = 20_000


def pricing_work(messages: Iterable[common_pb2.Message]) -> int:
    """The pricing work ``messages`` make, in characters; an image counts as past the inline limit:
    Pillow parses its header (a TIFF's or an ICO's can take milliseconds), so it is priced in a thread."""
    return sum(len(m.content) + len(m.images) * (INLINE_PRICING_CHARS + 1) for m in messages)


async def priced(fn: Callable[..., R], *args: Any, chars: int) -> R:
    """``fn(*args)``, in a thread only when the text is big enough to block other sessions."""
    if chars <= INLINE_PRICING_CHARS:
        return fn(*args)
    return await asyncio.to_thread(fn, *args)


def counted_parts(method: int, *, preamble: bool, incoming: bool, schemas: bool) -> list[str]:
    """What an estimate counts, as EstimateTokensResponse.counted names it. The baseline method
    starts from the model's own count of the last prompt, which held its preamble and tool schemas."""
    from_baseline = method == pb.ESTIMATE_METHOD_BASELINE_DELTA
    parts = {
        "context": True,
        "incoming": incoming,
        "preamble": preamble or from_baseline,
        "tool_schemas": schemas or from_baseline,
    }
    return [name for name, counted in parts.items() if counted]


def reportable(pricing: Pricing, view: Sequence[common_pb2.Message], estimate: Estimate) -> Estimate:
    """A calibrated estimate carries the shape of the view it priced: the report of the call
    brings it back, and the per-class rates learn what such a prompt really cost."""
    return estimate if pricing.exact else replace(estimate, shape=calibrated_shape(view))

"""Decisions of the size check that need more than a sum: proving a cut prompt, and cutting tool
results further when nothing is left to compress."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from palimpsest.compressor.pricing import Pricing

from collections.abc import Sequence
from dataclasses import replace

from palimpsest.compressor.token_estimate import Estimate
from palimpsest.shared.context_view import TRUNCATABLE_ROLES
from palimpsest.v1.common_pb2 import Message

# What a result keeps at least when it must be cut further: head and tail the model can act on.
MIN_RESULT_TOKENS = 64


def deepen_cuts(
    pricing: Pricing, messages: Sequence[Message], tool_schemas: Sequence[str], limit: int
) -> tuple[list[Message], dict[int, str], Estimate] | None:
    """A view that fits ``limit`` by cutting assistant and tool messages further, largest first,
    each down to ``MIN_RESULT_TOKENS`` at most; None when even that cannot fit (the system prompt,
    the tool schemas, tool-call arguments and the users' own words are never cut).

    An exact count is taken again after each cut; so is a calibrated one (a real baseline plus the
    prices of newer rows), less what the cuts of rows inside the baseline saved at the view's own
    rate (a recount cannot see those: the baseline holds them whole)."""
    view, cuts = pricing.view(messages)
    estimate = pricing.count_view(view, tool_schemas)
    budgets: dict[int, int] = {}
    done: set[int] = set()  # cut as far as they go
    saved_in_baseline = 0
    while estimate.tokens > limit:
        sizes = pricing.message_costs(view)
        candidates = [
            i
            for i, m in enumerate(messages)
            if m.role in TRUNCATABLE_ROLES and i not in done and sizes[i] > MIN_RESULT_TOKENS
        ]
        if not candidates:
            return None
        index = max(candidates, key=lambda i: (sizes[i], i))  # the largest; the newest of equals
        budgets[index] = max(MIN_RESULT_TOKENS, sizes[index] - (estimate.tokens - limit))
        if budgets[index] == MIN_RESULT_TOKENS:
            done.add(index)
        trial, trial_cuts = pricing.view(messages, budgets)
        saved = sizes[index] - pricing.message_costs([trial[index]])[0]
        if saved <= 0:  # the cut bought nothing (its tool calls alone are that big)
            done.add(index)
            continue
        if pricing.exact:
            shrunk = pricing.count_view(trial, tool_schemas)
        else:
            # A newer row is re-priced at the rates that priced it: a dense script learned at three
            # tokens a character, cut by its saving at the view's fixed rate (chars / 1.8), never got
            # under the limit and the turn ended CONTEXT_TOO_LARGE.
            saved_in_baseline += saved if _in_baseline(pricing, messages[index]) else 0
            recounted = pricing.count_view(trial, tool_schemas).tokens - saved_in_baseline
            tokens = min(recounted, estimate.tokens - saved)
            shrunk = replace(estimate, tokens=tokens, text_tokens=estimate.text_tokens - (estimate.tokens - tokens))
        view, cuts, estimate = trial, trial_cuts, shrunk
    return view, cuts, estimate


def _in_baseline(pricing: Pricing, message: Message) -> bool:
    """Whether the calibrated count holds ``message`` inside its real baseline (Ollama's count of an
    earlier prompt), where cutting it now moves nothing a recount would see."""
    baseline = pricing.baseline if pricing.has_baseline else None
    return baseline is not None and 0 < message.seq <= baseline.through_seq

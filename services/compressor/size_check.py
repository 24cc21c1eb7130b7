"""Decisions of the size check that need more than a sum: proving a cut prompt, and cutting tool
results further when nothing is left to compress."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from palimpsest.v1.common_pb2 import Message
from services.compressor.token_estimate import Estimate
from services.shared.context_view import TRUNCATABLE_ROLES

# What a result keeps at least when it must be cut further: head and tail the model can act on.
MIN_RESULT_TOKENS = 64


def deepen_cuts(pricing, messages: Sequence[Message], tool_schemas: Sequence[str],
                limit: int) -> tuple[list[Message], dict[int, str], Estimate] | None:
    """A view that fits ``limit`` by cutting assistant and tool messages further, largest first,
    each down to ``MIN_RESULT_TOKENS`` at most; None when even that cannot fit (the system prompt,
    the tool schemas, tool-call arguments and the users' own words are never cut).

    An exact count is taken again after each cut; a calibrated one (a real baseline plus the line
    over newer rows, which an older message's cut would not move) goes down by what each cut saves
    at the view's own rate."""
    view, cuts = pricing.view(messages)
    estimate = pricing.count_view(view, tool_schemas)
    budgets: dict[int, int] = {}
    done: set[int] = set()  # cut as far as they go
    while estimate.tokens > limit:
        sizes = pricing.message_costs(view)
        candidates = [i for i, m in enumerate(messages)
                      if m.role in TRUNCATABLE_ROLES and i not in done and sizes[i] > MIN_RESULT_TOKENS]
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
            shrunk = replace(estimate, tokens=estimate.tokens - saved, text_tokens=estimate.text_tokens - saved)
        view, cuts, estimate = trial, trial_cuts, shrunk
    return view, cuts, estimate

"""Decisions of the size check that need more than a sum: proving a cut prompt, and cutting tool
results further when nothing is left to compress."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from palimpsest.v1.common_pb2 import Message
from services.compressor.token_estimate import Estimate
from services.shared.context_view import TRUNCATABLE_ROLES

# A report this far under the content's own exact count is a cut prompt; the slack covers tokens
# that merge across a message's seam with its template (a few per message, never 2% of them).
CUT_PROOF_RATIO = 0.98
# What a result keeps at least when it must be cut further: head and tail the model can act on.
MIN_RESULT_TOKENS = 64


def proves_cut(reported: int, content_tokens: int) -> bool:
    """True when Ollama evaluated fewer tokens than the prompt's content alone has: it dropped the
    head of the prompt. The template only ever adds tokens, so no honest report is this low."""
    return content_tokens > 0 and reported < content_tokens * CUT_PROOF_RATIO


# The most a chat template can add to a prompt's exact content: a generous cost per message and per
# tool call, a fixed part as large as a long Modelfile system prompt, and images at the highest
# scale the image fit accepts. A report above it did not come from that prompt.
MAX_TEMPLATE_PER_MESSAGE = 64
MAX_TEMPLATE_FIXED = 8192
MAX_IMAGE_SCALE = 20


def plausible_report(reported: int, shape) -> bool:
    """False when Ollama's count is more than any template could add to the exact content: such
    an observation would swell every later count of the model (the services alone may report, so
    this guards against a broken or compromised one)."""
    ceiling = (shape.content_tokens + MAX_TEMPLATE_FIXED + MAX_TEMPLATE_PER_MESSAGE * (shape.messages + shape.tool_calls)
               + MAX_IMAGE_SCALE * shape.image_prior_tokens)
    return shape.content_tokens <= 0 or reported <= ceiling


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

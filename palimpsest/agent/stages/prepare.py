"""Preparing a model call's prompt: sized by the Compressor, compressed first when it says so, cut
where it says; and the same call again after Ollama refused a prompt as over its window. Each
returns the prompt to send (``Prepared``) or the answer that ends the turn (``TooLarge``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from palimpsest.agent import context_builder as cb
from palimpsest.agent.conversation import Conversation
from palimpsest.agent.overflow import REFUSAL_RETRIES, halve_biggest_tool_result, refused_answer
from palimpsest.agent.stages.storing import StoringTask
from palimpsest.shared.ollama import ContextRefused
from palimpsest.v1 import common_pb2
from palimpsest.v1 import compressor_pb2 as cpb

log = logging.getLogger("palimpsest.agent")

Message = common_pb2.Message
TOO_LARGE_ANSWER = (
    "This conversation no longer fits the model's context window (about {tokens} tokens of a "
    "{limit}-token budget), even after compression. Start a new session, or run /compact and "
    "try again."
)


@dataclass(frozen=True)
class Prepared:
    """The prompt to send, its size check, and this turn's user message if still on its way to the
    store (see stages.model_call); `shrunk_by` says what a refused prompt was shrunk by."""

    built: list[Message]
    check: cpb.CheckContextSizeResponse
    storing: StoringTask | None = None
    shrunk_by: str = ""


@dataclass(frozen=True)
class TooLarge:
    """The prompt cannot fit: the answer that says why ends the turn."""

    answer: str


class Sizing(Protocol):
    """What preparing a prompt asks of its turn, as the turn runs now (its profile and window)."""

    def build(self, pending: Sequence[Message] = ()) -> list[Message]: ...

    async def check_size(
        self, built: list[Message], iteration: int, *, decide: bool = True
    ) -> cpb.CheckContextSizeResponse: ...

    async def compress(
        self, reason: cpb.CompressionReason, current_tokens: int, keep_recent_messages: int = 0
    ) -> bool: ...

    async def shed_recall(self, prompt_tokens: int) -> bool: ...


def _too_large(check: cpb.CheckContextSizeResponse) -> TooLarge:
    return TooLarge(TOO_LARGE_ANSWER.format(tokens=check.tokens, limit=check.limit))


def _reason(iteration: int) -> cpb.CompressionReason:
    return cpb.COMPRESSION_REASON_PRETURN if iteration == 0 else cpb.COMPRESSION_REASON_MIDTURN


async def prepare(
    sizing: Sizing, built: list[Message], storing: StoringTask | None, iteration: int
) -> Prepared | TooLarge:
    """The prompt `built` for call `iteration`, sized by the Compressor (compressed first when it
    says so, cut where it says), or the turn's end when even that cannot fit. This turn's user
    message may still be on its way to the store (`storing`) when the prompt fits."""
    try:
        check = await sizing.check_size(built, iteration)
    except BaseException:
        if storing is not None:
            await storing  # both finished; the store's failure speaks first
        raise
    if storing is not None and check.decision != cpb.SIZE_DECISION_FITS:
        await storing  # compression and the too-large answer start from what is stored
        if storing.stale:  # someone else wrote in between: build from what is stored
            built = sizing.build()
            check = await sizing.check_size(built, iteration)
        storing = None
    if check.decision == cpb.SIZE_DECISION_COMPRESS_FIRST and iteration and await sizing.shed_recall(check.tokens):
        # Inside a loop, the excerpts recalled for its request go first when that keeps the prompt
        # under the trigger (the Compressor judges): no summary of the whole history for them.
        built = sizing.build()
        check = await sizing.check_size(built, iteration)
    if check.decision == cpb.SIZE_DECISION_COMPRESS_FIRST:
        # Pre-turn (first call) or mid-turn (later calls): the Compressor decided on its own
        # count and its dry run, so compression_started never lies. Then one more check,
        # which no longer offers compression: fits, cut further, or too large.
        if await sizing.compress(_reason(iteration), check.tokens, check.compress_keep_recent_messages):
            built = sizing.build()
        check = await sizing.check_size(built, iteration, decide=False)
    if check.decision != cpb.SIZE_DECISION_FITS:
        return _too_large(check)
    return Prepared(cb.apply_cuts(built, check.cuts), check, storing)


async def after_refusal(
    sizing: Sizing,
    refusal: ContextRefused,
    sent: list[Message],
    check: cpb.CheckContextSizeResponse,
    iteration: int,
    refusals: int,
    *,
    conv: Conversation,
    window: int,
    requested_window: int,
    compression_on: bool,
    keep_recent: int,
    shrunk_before: str,
) -> Prepared | TooLarge:
    """The call again after Ollama refused its prompt as over the window: compressed first (the
    refusal proves the count low, so any gain will do), else with its largest tool result cut to
    half; refused again, or nothing to shrink, the turn ends explained (never Ollama's raw
    error)."""
    log.warning(
        "Ollama refused the prompt of %s as over its %d-token window (counted %d): %s",
        conv.session_id or "a sub-agent",
        window,
        check.tokens,
        refusal,
    )
    if refusals > REFUSAL_RETRIES:
        return TooLarge(refused_answer(window, requested_window, shrunk_before))
    view, shrunk_by = sent, []
    if compression_on:
        before = len(conv.context)
        # Over the window whatever our count said: the Compressor takes any gain.
        if (
            await sizing.compress(_reason(iteration), max(check.tokens, window + 1), keep_recent)
            and len(conv.context) < before
        ):
            shrunk_by.append("compressing the conversation")
            built = sizing.build()
            check = await sizing.check_size(built, iteration, decide=False)
            if check.decision != cpb.SIZE_DECISION_FITS:
                return _too_large(check)
            view = cb.apply_cuts(built, check.cuts)
    # Also when compressed: the refusal proves our count low by an unknown amount, and a freed
    # turn or two (priced by that same count) may not be enough for the one retry there is.
    halved = halve_biggest_tool_result(view)
    if halved is not None:
        shrunk_by.append("cutting its largest tool result to half")
        check = await sizing.check_size(halved, iteration, decide=False)
        view = cb.apply_cuts(halved, check.cuts)
    if not shrunk_by:
        return TooLarge(refused_answer(window, requested_window, ""))
    return Prepared(view, check, None, shrunk_by=" and ".join(shrunk_by))

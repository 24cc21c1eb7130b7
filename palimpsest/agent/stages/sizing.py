"""Sizing a prompt without the Compressor, and the notes a model call is reminded of."""

from __future__ import annotations

from palimpsest.agent import context_builder as cb
from palimpsest.agent.profiles import Profile
from palimpsest.shared.context_view import (
    heuristic_tokens,
    heuristic_view,
    message_budget,
    view_chars,
)
from palimpsest.v1 import common_pb2
from palimpsest.v1 import compressor_pb2 as cpb

Message = common_pb2.Message


def unchecked(built: list[Message], window: int, message_token_budget: int) -> cpb.CheckContextSizeResponse:
    """A size check without the Compressor: oversized messages cut at the heuristic rate, sent."""
    view = heuristic_view(built, message_budget(window, message_token_budget))
    return cpb.CheckContextSizeResponse(
        fits=True,
        decision=cpb.SIZE_DECISION_FITS,
        method=cpb.ESTIMATE_METHOD_FALLBACK,
        tokens=heuristic_tokens(view_chars(view)),
        limit=window,
        cuts=[cpb.ViewCut(index=i, content=v.content) for i, (m, v) in enumerate(zip(built, view)) if v is not m],
    )


def call_notes(profile: Profile, iteration: int, max_iterations: int, stalled: int, goal: str) -> list[str]:
    """What call `iteration` is reminded of. Each note is stored where it is given (see
    note_messages): the next call's prompt then begins with this one's, which Ollama reuses
    instead of evaluating it again."""
    p = profile
    notes = []
    left = max_iterations - iteration - 1
    # From the second call on (the first ends with the user's words), or when few are left.
    if p.iteration_budget_enabled and (iteration > 0 or left <= 1):
        notes.append(cb.iteration_budget_note(iteration, max_iterations))
    if p.goal_anchoring_enabled and iteration > 0 and iteration % max(1, p.goal_anchoring_interval) == 0:
        notes.append(cb.goal_anchor_note(goal))
    if p.anti_stall_enabled and stalled >= p.anti_stall_threshold:
        notes.append(cb.anti_stall_note(stalled))
    return notes

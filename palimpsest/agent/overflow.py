"""What a turn does when Ollama proves a prompt too long for the window, and how it says so.

Every chat request goes out with ``truncate: false``: Ollama's llama-server engine then refuses a
prompt over ``num_ctx`` (HTTP 400) instead of dropping its oldest messages unseen. A refusal is
proof our count was low. The turn compresses (or, with nothing to compress, halves the biggest
tool result the call carries) and sends the call once more; refused again, the turn ends with
CONTEXT_TOO_LARGE and ``refused_answer`` — never with Ollama's raw error.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from palimpsest.shared.context_view import heuristic_tokens, heuristic_view, message_chars
from palimpsest.v1 import common_pb2

log = logging.getLogger("palimpsest.agent")

Message = common_pb2.Message

# Retries after a refusal, per model call: one. A second refusal means what we can shrink on the
# turn's path does not bring the prompt under the window; more attempts would only repeat it.
REFUSAL_RETRIES = 1


def biggest_tool_result(view: Sequence[Message]) -> int | None:
    """The index of the largest tool result in the view, or None when it carries none."""
    results = [(len(m.content), i) for i, m in enumerate(view) if m.role == "tool" and m.content]
    return max(results)[1] if results else None


def halve_biggest_tool_result(view: Sequence[Message]) -> list[Message] | None:
    """The view with its largest tool result cut to half its size (head + marker + tail); None when
    there is none to cut. Half: a refusal says the prompt is over the window, not by how much, and
    half of the largest result frees the most one retry can while the model still sees both its ends."""
    index = biggest_tool_result(view)
    if index is None:
        return None
    half = heuristic_tokens(message_chars(view[index])) // 2
    shrunk = heuristic_view(view, 0, {index: max(1, half)})
    return shrunk if shrunk[index] is not view[index] else None


def refused_answer(window: int, requested: int, shrunk_by: str) -> str:
    """The turn's answer when Ollama refused its prompt and nothing on the turn's path made it fit;
    ``shrunk_by`` says what was tried ("": nothing could be compressed or cut)."""
    asked = f" (the profile asks for {requested:,}, more than the model was trained on)" if requested > window else ""
    tried = f"it was still too long after {shrunk_by}" if shrunk_by else "there was nothing left to compress or cut"
    return (
        f"This conversation no longer fits the model's context window: Ollama refused the prompt as longer "
        f"than its {window:,} tokens{asked}, and {tried}. The model was not called again and nothing is "
        "lost: run /compact and try again, start a new session, or use a profile whose model has a larger "
        "context window."
    )

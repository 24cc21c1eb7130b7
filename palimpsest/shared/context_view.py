"""The view of a context the model is actually sent, shared by the Agent and the Compressor.

The Agent sends exactly ``to_ollama_messages(truncate_oversized(...))`` and the Compressor prices
exactly ``truncate_oversized(...)``. Pricing the raw stored rows instead (a megabyte tool result
counted as ~500k tokens while the model received a few thousand) made the gates fire for work the
planner cannot do and failed size checks over prompts the model never saw. So there is one
implementation, here.

What counts as sent: a message's content and its tool calls (name + JSON arguments). Not its
``thinking``: reasoning of past calls is not sent back to the model (chat templates of reasoning
models drop it for earlier turns anyway), so counting it would overprice every assistant message.
Images are sent but priced separately, per image, from their headers.
"""

from __future__ import annotations

import base64
import json
import math
from fractions import Fraction
from typing import Any, Callable, Sequence

from palimpsest.v1.common_pb2 import Message

# About five template tokens wrap every message (``<|im_start|>role\n`` … ``<|im_end|>\n``);
# at the fallback 1.8 chars/token that is ~9 chars. Counting it keeps a context of many short
# tool results from being underpriced against one of few long messages of the same text size.
MESSAGE_OVERHEAD_CHARS = 9

# Measured on production prompts: chars / 3 undercounted by ~1.8x, so compression kept
# re-firing; 1.8 chars per token is the measured average for a chat prompt without a line.
HEURISTIC_CHARS_PER_TOKEN = Fraction(9, 5)  # exact, so 18 chars is 10 tokens, not 11


def heuristic_tokens(chars: int) -> int:
    """chars / 1.8, rounded up: a count without the model's vocabulary or a calibrated line."""
    if chars <= 0:
        return 0
    return math.ceil(Fraction(chars) / HEURISTIC_CHARS_PER_TOKEN)


# A sixth of the window: one message alone can take a large share, yet never crowd out the rest.
MESSAGE_BUDGET_WINDOW_DIVISOR = 6

# Roles whose content can be cut in the view: model output and tool output. A user's own words
# and summaries are sent whole.
TRUNCATABLE_ROLES = frozenset({"assistant", "tool"})


def message_chars(message: Message) -> int:
    """Characters of a message as sent: content plus each tool call's name and arguments."""
    return len(message.content) + sum(len(call.name) + len(call.arguments_json) for call in message.tool_calls)


def view_chars(messages: Sequence[Message]) -> int:
    """Characters of a message list as sent, each message charged its template overhead.

    This is the ``chars`` of every calibration observation and estimate, so both sides of the
    fitted line measure the same thing.
    """
    return sum(message_chars(m) + MESSAGE_OVERHEAD_CHARS for m in messages)


def default_message_budget(window: int) -> int:
    """Per-message token budget when none is configured: a sixth of the window."""
    return max(0, window) // MESSAGE_BUDGET_WINDOW_DIVISOR


def message_budget(window: int, configured: int = 0) -> int:
    """A configured budget (> 0) wins; 0 or less means "derive it from the window"."""
    return configured if configured > 0 else default_message_budget(window)


# A message longer than twice this reaches the size check as its head and tail only, each this
# long: its view is cut to a message budget (at most a sixth of the window) anyway, whole it could
# pass the RPC's size limit (a 15 MB tool output), and the tokenizer would spend seconds on it.
# The view's cut is the same as on the whole text: a budget's worth of tokens is far shorter.
SIZE_CHECK_SLICE_CHARS = 200_000
TASK_NOTE = "task_note"  # metadata["source"] of a stored note (iteration budget, goal, anti-stall)


# Stored system records that may reach the model; every other one is transcript only.
LLM_SYSTEM_SOURCES = frozenset({TASK_NOTE, "synapse_event"})


def reaches_model(message: Message) -> bool:
    """Whether a stored context row is in the prompt: every row but the system records outside
    LLM_SYSTEM_SOURCES (task notes and recalled excerpts are; a compression marker is not). The
    Agent builds its prompts by it, the Compressor the summary that reuses them."""
    if message.role != "system":
        return True
    source = message.metadata["source"] if "source" in message.metadata else ""
    return source in LLM_SYSTEM_SOURCES or message.is_recall


def is_task_note(message: Message) -> bool:
    """A note given to one model call (its iteration budget, the goal, a stall warning)."""
    return message.role == "system" and "source" in message.metadata and message.metadata["source"] == TASK_NOTE


def is_transient(message: Message) -> bool:
    """A task note given to one call, or excerpts recalled for one turn: in the context where they
    were given (so prompts only grow at their end), compressed like any message, and with
    nothing of their own to summarize or index."""
    return message.is_recall or is_task_note(message)


def recalled_before(context: Sequence[Message], at: int) -> list[Message]:
    """The excerpts recalled for the message at index ``at``: stored just before it, among the
    notes given with it."""
    out: list[Message] = []
    for message in reversed(context[:at]):
        if not is_transient(message):
            break
        if message.is_recall:
            out.append(message)
    return out[::-1]


def slice_for_size_check(text: str) -> str | None:
    """The head and tail of a text too long to be sized whole; None when it is not."""
    if len(text) <= 2 * SIZE_CHECK_SLICE_CHARS:
        return None
    return text[:SIZE_CHECK_SLICE_CHARS] + text[-SIZE_CHECK_SLICE_CHARS:]


def sliced_for_size_check(messages: Sequence[Message]) -> list[Message]:
    """The messages as the size check gets them: each too long to size whole replaced by a copy
    holding its head and tail and saying how long it really is (``sliced_from_chars``)."""
    out = []
    for message in messages:
        sliced = slice_for_size_check(message.content)
        if sliced is None:
            out.append(message)
            continue
        copy = with_content(message, sliced)
        copy.sliced_from_chars = len(message.content)
        out.append(copy)
    return out


def with_content(message: Message, content: str) -> Message:
    """A copy of ``message`` with another content (views never change a stored row)."""
    copy = Message()
    copy.CopyFrom(message)
    copy.content = content
    return copy


def truncation_marker(tokens: int) -> str:
    """The text that replaces the cut middle of an oversized message."""
    return f"\n[…truncated ~{tokens} tokens…]\n"


def largest_fitting(limit: int, fits: Callable[[int], bool]) -> int:
    """Largest n in [0, limit] with fits(n), for a monotone ``fits``; -1 when even 0 fails."""
    if not fits(0):
        return -1
    low, high = 0, limit
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def _truncated_copy(
    message: Message, budget_tokens: int, estimate_chars_to_tokens: Callable[[int], int]
) -> Message | None:
    """A copy whose content keeps head and tail within the budget; None if cutting cannot help."""
    content = message.content
    fixed = message_chars(message) - len(content)  # tool calls stay whole: their JSON must parse
    # The marker's number only shrinks as more content is kept, so this bounds its length.
    marker_room = len(truncation_marker(estimate_chars_to_tokens(len(content))))
    kept = largest_fitting(
        len(content) - 1,
        lambda n: estimate_chars_to_tokens(fixed + marker_room + n) <= budget_tokens,
    )
    kept = max(kept, 0)
    if kept >= len(content):
        return None
    head = (kept + 1) // 2
    tail = kept - head
    removed = estimate_chars_to_tokens(len(content) - kept)
    return with_content(message, content[:head] + truncation_marker(removed) + (content[-tail:] if tail else ""))


def truncate_oversized(
    messages: Sequence[Message],
    budget_tokens: int,
    estimate_chars_to_tokens: Callable[[int], int],
    budgets: dict[int, int] | None = None,
) -> list[Message]:
    """The view with every oversized assistant/tool message cut to head + marker + tail.

    A message is oversized when ``estimate_chars_to_tokens(message_chars(m))`` exceeds
    ``budget_tokens``; it is replaced by a copy (stored messages are never mutated), others are
    returned as they are. ``estimate_chars_to_tokens`` prices a piece of text, without the
    prompt's fixed overhead. A budget of 0 or less disables truncation; ``budgets`` overrides the
    budget per index (a message cut further so the prompt fits).
    """
    if budget_tokens <= 0 and not budgets:
        return list(messages)
    view: list[Message] = []
    for index, message in enumerate(messages):
        budget = (budgets or {}).get(index, budget_tokens)
        if (
            budget > 0
            and message.role in TRUNCATABLE_ROLES
            and estimate_chars_to_tokens(message_chars(message)) > budget
        ):
            view.append(_truncated_copy(message, budget, estimate_chars_to_tokens) or message)
        else:
            view.append(message)
    return view


def heuristic_view(
    messages: Sequence[Message], budget_tokens: int, budgets: dict[int, int] | None = None
) -> list[Message]:
    """The view without the model's tokenizer: oversized messages cut at the fixed chars / 1.8 rate
    (the Compressor's fallback, and the Agent's while the Compressor is away)."""
    return truncate_oversized(messages, budget_tokens, heuristic_tokens, budgets)


def tool_arguments(arguments_json: str) -> dict[str, Any]:
    """Arguments as the object Ollama expects; text that is not a JSON object is wrapped, not lost."""
    if not arguments_json.strip():
        return {}
    try:
        parsed = json.loads(arguments_json)
    except ValueError:
        return {"raw": arguments_json}
    return parsed if isinstance(parsed, dict) else {"raw": arguments_json}


def to_ollama_message(message: Message) -> dict[str, Any]:
    """One message as an Ollama /api/chat message dict."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.images:
        out["images"] = [base64.b64encode(image).decode("ascii") for image in message.images]
    if message.tool_calls:
        out["tool_calls"] = [
            {"function": {"name": call.name, "arguments": tool_arguments(call.arguments_json)}}
            for call in message.tool_calls
        ]
    if message.role == "tool" and message.name:
        out["tool_name"] = message.name
    return out


def to_ollama_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The messages as Ollama /api/chat ``messages``; thinking is not sent back (see module doc)."""
    return [to_ollama_message(m) for m in messages]

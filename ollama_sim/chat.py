"""Turning a Reply into /api/chat payloads, free of any HTTP concerns."""

from __future__ import annotations

import re
import secrets
import string
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from .models import Reply
from .prompt import count_text_tokens

JsonObject = dict[str, Any]

_WORD = re.compile(r"\s*\S+\s*")
_ID_ALPHABET = string.ascii_lowercase + string.digits

# Fixed per-token costs make durations plausible and deterministic (nanoseconds).
LOAD_DURATION_NS = 1_000_000
PROMPT_EVAL_NS_PER_TOKEN = 50_000
EVAL_NS_PER_TOKEN = 20_000


def now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def split_words(text: str) -> list[str]:
    """Small pieces that join back to exactly ``text`` (whitespace kept with the word)."""
    pieces = _WORD.findall(text)
    if "".join(pieces) != text:  # whitespace-only text has no words
        return [text] if text else []
    return pieces


def assistant_message(content: str = "", **extra: Any) -> JsonObject:
    return {"role": "assistant", "content": content, **extra}


def _call_id() -> str:
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(8))


def tool_call_payload(calls: Sequence[tuple[str, Mapping[str, Any]]]) -> list[JsonObject]:
    return [
        {"id": _call_id(), "function": {"index": i, "name": name, "arguments": dict(arguments)}}
        for i, (name, arguments) in enumerate(calls)
    ]


def plan_messages(reply: Reply, think: bool) -> list[JsonObject]:
    """The ``message`` of every non-final chunk, in stream order: thinking, content, tools."""
    planned: list[JsonObject] = []
    if think:
        planned += [assistant_message(thinking=piece) for piece in split_words(reply.thinking)]
    planned += [assistant_message(piece) for piece in split_words(reply.text)]
    if reply.tool_calls:
        planned.append(assistant_message(tool_calls=tool_call_payload(reply.tool_calls)))
    return planned


def merge_messages(messages: Sequence[JsonObject]) -> JsonObject:
    """What a client accumulates over all chunks: the non-streaming answer's message."""
    content = "".join(m.get("content", "") for m in messages)
    thinking = "".join(m.get("thinking", "") for m in messages)
    calls = [call for m in messages for call in m.get("tool_calls", [])]
    merged = assistant_message(content)
    if thinking:
        merged["thinking"] = thinking
    if calls:
        merged["tool_calls"] = calls
    return merged


def eval_tokens(messages: Sequence[JsonObject]) -> int:
    """Tokens the model generated: thinking, content and the tool-call JSON."""
    merged = merge_messages(messages)
    text = merged.get("thinking", "") + merged["content"]
    for call in merged.get("tool_calls", []):
        text += str(call["function"])
    return count_text_tokens(text)


def final_metrics(prompt_eval_count: int, eval_count: int, elapsed_ns: int, cached: int = 0) -> JsonObject:
    """Metrics of the final chunk; Ollama omits any that is zero. Only the tokens not ``cached``
    take time to read."""
    prompt_ns = (prompt_eval_count - cached) * PROMPT_EVAL_NS_PER_TOKEN
    eval_ns = eval_count * EVAL_NS_PER_TOKEN
    metrics = {
        "total_duration": max(elapsed_ns, LOAD_DURATION_NS + prompt_ns + eval_ns),
        "load_duration": LOAD_DURATION_NS,
        "prompt_eval_count": prompt_eval_count,
        "prompt_eval_duration": prompt_ns,
        "eval_count": eval_count,
        "eval_duration": eval_ns,
    }
    return {key: value for key, value in metrics.items() if value}


def chunk(model: str, message: JsonObject, done: bool = False) -> JsonObject:
    return {"model": model, "created_at": now_iso(), "message": message, "done": done}


def _last_user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return str(message.get("content") or "")
    return ""


def default_reply(body: Mapping[str, Any]) -> Reply:
    """Deterministic answer when nothing is scripted: an echo of the last user message."""
    asked = _last_user_text(body.get("messages") or [])
    echo = " ".join(asked.split()[:40])
    return Reply(
        text=f"Simulated answer to: {echo}" if echo else "Simulated answer.",
        thinking="Reading the request and preparing a short answer.",
    )

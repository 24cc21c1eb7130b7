"""Storing what a turn produced: its user message while the prompt is sized, the model's answer
(exactly once, with the call's report), a partial answer when the turn is cut short, tool calls."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Generator, Sequence
from typing import Any

from palimpsest.agent.conversation import Conversation
from palimpsest.agent.events import EventSink
from palimpsest.shared.errors import PalimpsestError
from palimpsest.shared.ollama import ChatResult
from palimpsest.shared.settings import Settings
from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as store_pb

log = logging.getLogger("palimpsest.agent")

Message = common_pb2.Message
# The answer was streamed but could not be stored: say so, and where its text still is.
NOT_STORED = (
    "The answer above was not stored in the session: {cause}. Its full text is in this stream's "
    "stream_end; copy it from there, or ask again once the SessionStore is back."
)


class StalePrompt(Exception):
    """The session changed under the turn (another writer) while the prompt was on its way."""


class StoringTask:
    """Messages being appended in the background; awaitable any number of times. `stale` says
    the append found the session changed by someone else (the conversation reloaded first)."""

    def __init__(self, conv: Conversation, messages: Sequence[Message]) -> None:
        self._reloads = conv.reloads
        self._conv = conv
        self._task = asyncio.ensure_future(conv.append(messages))

    def __await__(self) -> Generator[Any, None, list[int]]:
        return self._task.__await__()

    @property
    def stale(self) -> bool:
        return self._conv.reloads != self._reloads


def answer_message(reply: ChatResult, **fields: Any) -> Message:
    """A model call's answer as stored: what it said and thought, the seconds it took and the tokens
    the model generated for it (a size check later replaces that count with the message's own
    count by the model's tokenizer, with its digest)."""
    return Message(
        role="assistant",
        content=reply.content,
        thinking=reply.thinking,
        elapsed_seconds=reply.elapsed_seconds,
        token_count=reply.eval_count or 0,
        **fields,
    )


def tool_calls_of(reply: ChatResult) -> list[common_pb2.ToolCall]:
    """The reply's tool calls as stored, each with an id (the model's, or its place in it)."""
    calls = []
    for i, raw in enumerate(reply.tool_calls):
        fn = raw.get("function") or {}
        arguments = fn.get("arguments") or {}
        calls.append(
            common_pb2.ToolCall(
                id=raw.get("id") or f"call_{i}",
                name=fn.get("name", ""),
                arguments_json=json.dumps(arguments) if not isinstance(arguments, str) else arguments,
            )
        )
    return calls


async def store_answer(
    conv: Conversation,
    reply: ChatResult,
    report: store_pb.ModelReport,
    *,
    settings: Settings,
    sink: EventSink,
) -> bool:
    """The turn's answer, stored exactly once with the call's report: retried under one
    idempotency key while the store does not answer, until the reply-write deadline. False (and
    the client told) if it was not."""
    try:
        await conv.append(
            [answer_message(reply)],
            retry_for=settings.reply_write_deadline_s,
            attempt_timeout=settings.rpc_timeout_s,
            report=report,
        )
        return True
    except PalimpsestError as exc:
        log.error("the answer of session %s was not stored: %s", conv.session_id, exc)
        sink.error(exc.code.name, NOT_STORED.format(cause=exc))
        return False


async def save_partial(conv: Conversation, partial: ChatResult | None, why: str) -> None:
    """What the model had said when the turn was cut short (`why`: stopped, error), kept marked
    partial; a failure to keep it is logged (the turn is ending anyway)."""
    if partial is None or not (partial.content or partial.thinking):
        return
    message = Message(role="assistant", content=partial.content, thinking=partial.thinking)
    message.metadata.update({"partial": True, "ended": why})
    try:
        await conv.append([message])
    except PalimpsestError:
        log.exception("could not save the partial answer of session %s", conv.session_id)

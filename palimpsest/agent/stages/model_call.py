"""Calling the model: the request Ollama gets, and one call streamed to the turn's sink."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from palimpsest.agent.events import EventSink
from palimpsest.agent.stages.storing import StalePrompt, StoringTask
from palimpsest.agent.stream_guard import guarded, read_rest_in_background
from palimpsest.shared.context_view import to_ollama_messages
from palimpsest.shared.ollama import ChatResult, ModelFacts, OllamaClient
from palimpsest.shared.settings import Settings
from palimpsest.v1 import common_pb2

Message = common_pb2.Message


def request_body(
    built: list[Message],
    *,
    model: str,
    facts: ModelFacts,
    window: int,
    tools: list[dict] | None,
    think_enabled: bool,
) -> dict:
    """Ollama's chat request for the prompt `built`: images only for a model that sees them, the
    think switch only for one that thinks."""
    messages = to_ollama_messages(built)
    if not facts.vision:
        for m in messages:
            m.pop("images", None)
    think = think_enabled if facts.thinking else None
    return OllamaClient.chat_body(model, messages, num_ctx=window, tools=tools, think=think)


async def call_model(
    ollama: OllamaClient,
    body: Callable[[], dict],
    reply: ChatResult,
    *,
    sink: EventSink,
    stop: asyncio.Event,
    settings: Settings,
    storing: StoringTask | None,
    model: str,
    window: int,
    said: Callable[[str], None],
) -> ChatResult:
    """Stream one model call to the client into `reply` (the caller's, so what was said survives
    a failure); `said` hears the answer's text as it grows. With `storing`, the user's message is
    still on its way to the store: nothing reaches the client, and nothing else is written, before
    it is stored. If storing fails, the call is dropped and the store's error ends the turn; if it
    found the session changed by another writer, the call is dropped as StalePrompt."""
    started = time.monotonic()
    try:
        await _stream_reply(
            ollama,
            body(),
            reply,
            sink=sink,
            stop=stop,
            settings=settings,
            storing=storing,
            model=model,
            window=window,
            said=said,
        )
    finally:
        if storing is not None:
            await storing
    reply.elapsed_seconds = time.monotonic() - started
    return reply


async def _stream_reply(
    ollama: OllamaClient,
    body: dict,
    reply: ChatResult,
    *,
    sink: EventSink,
    stop: asyncio.Event,
    settings: Settings,
    storing: StoringTask | None,
    model: str,
    window: int,
    said: Callable[[str], None],
) -> None:
    thinking_open = False
    stream = ollama.chat_stream(body)
    chunks = guarded(
        stream,
        first_chunk_timeout=settings.stream_first_chunk_timeout,
        chunk_timeout=settings.stream_chunk_timeout,
        stop=stop,
    )
    done = False
    try:
        async for chunk in chunks:
            if storing is not None:
                await storing
                if storing.stale:
                    raise StalePrompt
                storing = None
            message = chunk.get("message") or {}
            if message.get("thinking"):
                thinking_open = True
                sink.thinking(message["thinking"])
            if thinking_open and (message.get("content") or message.get("tool_calls") or chunk.get("done")):
                thinking_open = False
                sink.thinking_end()
            if message.get("content"):
                sink.text(message["content"])
            reply.absorb(chunk)
            said(reply.content)
            if chunk.get("done"):  # Ollama's last chunk: the reply is whole
                done = True
                break
    finally:
        if done:  # the response's end is read off the turn's path, so its connection is kept
            read_rest_in_background(chunks)
        else:  # an error in here closes the HTTP stream at once
            await chunks.aclose()
    if storing is not None:  # a stream without a single chunk: the prompt must still not be stale
        await storing
        if storing.stale:
            raise StalePrompt
    if reply.model and reply.model != model:
        sink.model_info(reply.model, window)

"""The streaming guard: timeouts for a silent prefill and for gaps between chunks, and a stop
signal honoured even while Ollama has not said a word yet."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, suppress
from typing import TypeVar

T = TypeVar("T")

# The seed's bound on how long a Stop may go unnoticed during a silent prefill.
STOP_POLL_SECONDS = 1.0


class StreamStopped(Exception):
    """The stop signal was set while waiting for the model."""


class StreamTimeout(Exception):
    def __init__(self, first_chunk: bool, seconds: float) -> None:
        what = "the first token" if first_chunk else "the next token"
        super().__init__(f"the model sent nothing for {seconds:g}s while we waited for {what}")
        self.first_chunk = first_chunk


async def guarded(
    stream: AsyncIterator[T],
    *,
    first_chunk_timeout: float,
    chunk_timeout: float,
    stop: asyncio.Event,
    poll: float = STOP_POLL_SECONDS,
) -> AsyncGenerator[T, None]:
    """Yield `stream`'s items; on stop or timeout close it, which closes the HTTP connection."""
    iterator = stream.__aiter__()
    loop = asyncio.get_running_loop()
    first = True
    try:
        while True:
            limit = first_chunk_timeout if first else chunk_timeout
            deadline = loop.time() + limit
            pending = asyncio.ensure_future(iterator.__anext__())
            try:
                while not pending.done():
                    if stop.is_set():
                        raise StreamStopped()
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        raise StreamTimeout(first, limit)
                    await asyncio.wait({pending}, timeout=min(poll, remaining))
            except BaseException:
                pending.cancel()
                with suppress(asyncio.CancelledError, StopAsyncIteration, Exception):
                    await pending
                raise
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
            first = False
            yield item
    finally:
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            with suppress(Exception):
                await aclose()


# Streams being read to their end in the background, held until done (the loop keeps only a weak
# reference to a task).
_reading: set[asyncio.Task] = set()


def read_rest_in_background(stream: AsyncGenerator[T, None]) -> None:
    """Read what is left of ``stream`` (after Ollama's final chunk: the HTTP response's end) and
    close it, off the caller's path. Read to its end, the response hands its connection back to
    the pool for the next call; closed before that, the connection would be dropped."""

    async def read() -> None:
        with suppress(Exception):  # the reply is already whole: nothing here concerns it
            async with aclosing(stream):
                async for _ in stream:
                    pass

    task = asyncio.get_running_loop().create_task(read())
    _reading.add(task)
    task.add_done_callback(_reading.discard)

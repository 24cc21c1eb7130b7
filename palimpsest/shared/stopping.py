"""A server's stop, as the bidirectional calls it serves see it: a call that would otherwise hold the
stop for the whole grace period while it waits for its client's next message ends at once instead."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

from palimpsest.shared.errors import Unavailable

T = TypeVar("T")


class Stopping:
    """Set once when the server starts to stop. ``until`` passes a call's requests on until then;
    a request being served when it is set is served to its end first, so what ends a call is only
    ever the wait for a request its client has not sent (or that never reached the servicer), and
    the client may send it again elsewhere."""

    def __init__(self) -> None:
        self._stopped = False
        self._waiting: set[asyncio.Task] = set()  # the calls' tasks while they wait for a request

    def set(self) -> None:
        self._stopped = True
        for task in self._waiting:
            task.cancel()  # (no task of its own per request read: that cost every append on the path)

    async def until(self, requests: AsyncIterator[T], why: str) -> AsyncIterator[T]:
        """The requests, until the client ends its side (the call then ends OK) or the server
        stops (it ends UNAVAILABLE, saying ``why``)."""
        task = asyncio.current_task()
        assert task is not None
        while not self._stopped:
            self._waiting.add(task)
            try:
                request = await anext(requests)
            except StopAsyncIteration:
                return
            except asyncio.CancelledError:
                if not self._stopped or task.cancelling() > 1:  # the client went, or the server: not ours
                    raise
                task.uncancel()
                break
            finally:
                self._waiting.discard(task)
            yield request
        raise Unavailable(why)

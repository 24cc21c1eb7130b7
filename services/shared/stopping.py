"""A server's stop, as the bidirectional calls it serves see it: a call that would otherwise hold the
stop for the whole grace period while it waits for its client's next message ends at once instead."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

from services.shared.errors import Unavailable

T = TypeVar("T")


class Stopping:
    """Set once when the server starts to stop. ``until`` passes a call's requests on until then;
    a request being served when it is set is served to its end first, so what ends a call is only
    ever the wait for a request its client has not sent (or that never reached the servicer), and
    the client may send it again elsewhere."""

    def __init__(self) -> None:
        self._set = asyncio.Event()

    def set(self) -> None:
        self._set.set()

    async def until(self, requests: AsyncIterator[T], why: str) -> AsyncIterator[T]:
        """The requests, until the client ends its side (the call then ends OK) or the server
        stops (it ends UNAVAILABLE, saying ``why``)."""
        stopped = asyncio.ensure_future(self._set.wait())
        following: asyncio.Future | None = None
        try:
            while not self._set.is_set():
                following = asyncio.ensure_future(anext(requests))
                await asyncio.wait((following, stopped), return_when=asyncio.FIRST_COMPLETED)
                if not following.done():
                    break
                try:
                    request = following.result()
                except StopAsyncIteration:
                    return
                yield request
        finally:  # (the call cancelled, or stopped: nothing is left waiting on its requests)
            stopped.cancel()
            if following is not None:
                following.cancel()
        raise Unavailable(why)

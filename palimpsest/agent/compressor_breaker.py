"""The Agent's calls to the Compressor, behind a circuit breaker: a Compressor that stops answering
(frozen, hung, gone) costs the turns one deadline, not one each.

- Closed: calls go through. A call the Compressor does not answer — its deadline passes, or it is
  UNAVAILABLE — opens the breaker, and every other call waiting on it then is given up at once.
- Open: calls fail at once with UNAVAILABLE saying the Compressor is not called; a turn then goes on
  without it, as it does when the Compressor is away (one error event, no compression, counts cut
  at the heuristic rate). Meanwhile one probe at a time (a health check, never a turn's call) asks
  it every ``retry_s``; SERVING closes the breaker.
- A status the Compressor sends is an answer, whatever it says (its own store away, nothing to
  compress): only silence opens the breaker.

The Compressor's replicas share one channel (round-robin), so they share one breaker: one hung
replica of several opens it until a probe (which may reach another replica) finds one answering.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import grpc

from palimpsest.shared.errors import NOT_ANSWERING, NotAnswering, PalimpsestError, Unavailable
from palimpsest.v1 import compressor_pb2

log = logging.getLogger("palimpsest.agent")

# What a turn is told while the breaker is open (tests look for it).
NOT_CALLED = "not called until it answers again"
_STREAMS = frozenset(
    m.name for m in compressor_pb2.DESCRIPTOR.services_by_name["Compressor"].methods if m.server_streaming
)


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class GuardedCompressor:
    """The Compressor stub as the Agent's turns use it: every call through the breaker.
    ``probe``: True when the Compressor answers SERVING (raises, or False, when not)."""

    def __init__(
        self,
        stub: Any,
        address: str,
        *,
        retry_s: float,
        probe: Callable[[], Awaitable[bool]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stub = stub
        self.address = address
        self.retry_s = retry_s
        self._probe = probe
        self._clock = clock
        self._failure: tuple[float, str] | None = None  # open: when, and what went unanswered
        self._in_flight: set[Any] = set()
        self._given_up: set[Any] = set()  # calls cut short when the breaker opened
        self._probing: asyncio.Task | None = None

    @property
    def is_open(self) -> bool:
        return self._failure is not None

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._stub, name)
        if name in _STREAMS:
            return lambda request, **kwargs: self._stream(method, request, **kwargs)
        return lambda request, **kwargs: self._unary(method, request, **kwargs)

    async def aclose(self) -> None:
        if self._probing is not None:
            self._probing.cancel()
            await asyncio.gather(self._probing, return_exceptions=True)

    # -- calls -------------------------------------------------------------------------------
    def _refuse_while_open(self) -> None:
        if self._failure is not None:
            since, what = self._failure
            raise Unavailable(
                f"Compressor at {self.address} {NOT_ANSWERING} ({what}, {self._clock() - since:.0f}s "
                f"ago): {NOT_CALLED} (asked every {self.retry_s:g}s)"
            )

    def _given_up_error(self) -> Unavailable:
        return Unavailable(
            f"Compressor at {self.address} {NOT_ANSWERING}: this call was given up when another one went unanswered"
        )

    async def _unary(self, method: Callable[..., Any], request: Any, **kwargs: Any) -> Any:
        self._refuse_while_open()
        call = method(request, **kwargs)
        with self._watching(call):
            return await call

    async def _stream(self, method: Callable[..., Any], request: Any, **kwargs: Any) -> AsyncIterator[Any]:
        self._refuse_while_open()
        call = method(request, **kwargs)
        with self._watching(call):
            async for reply in call:
                yield reply

    @contextlib.contextmanager
    def _watching(self, call: grpc.aio.Call) -> Iterator[None]:
        """A call in flight: its silence opens the breaker, and it is given up when another's does."""
        self._in_flight.add(call)
        try:
            yield
        except NotAnswering as exc:
            self._open(exc)
            raise
        except asyncio.CancelledError:
            if call in self._given_up and not _being_cancelled():
                raise self._given_up_error() from None
            raise
        finally:
            self._in_flight.discard(call)
            self._given_up.discard(call)

    # -- open, probe, close --------------------------------------------------------------------
    def _open(self, failure: NotAnswering) -> None:
        for call in self._in_flight:  # they wait on the same silence
            if call.cancel():
                self._given_up.add(call)
        if self._failure is not None:
            return
        self._failure = (self._clock(), failure.details)
        log.warning("%s; turns go on without it, and it is asked again every %gs", failure, self.retry_s)
        self._probing = asyncio.get_running_loop().create_task(self._probe_until_answered())

    async def _probe_until_answered(self) -> None:
        while True:
            await asyncio.sleep(self.retry_s)  # between probes: the interval, not a wait for something
            try:
                if await self._probe():
                    break
            except PalimpsestError as exc:
                log.debug("the Compressor at %s still does not answer: %s", self.address, exc)
        self._failure, self._probing = None, None
        log.info("the Compressor at %s answers again: turns use it again", self.address)

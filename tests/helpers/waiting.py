"""Waiting in tests for a condition another process or task makes true: checked every 50 ms until
a deadline, never a sleep standing in for the event itself."""

from __future__ import annotations

import asyncio
import inspect


async def until(condition, timeout: float = 20.0) -> bool:
    """True once ``condition()`` (plain or async) is true; False at the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return True
        await asyncio.sleep(0.05)  # between checks of the condition
    return False


# Server-streamed RPCs that never end by themselves: a test reads until the watch is in place.
NEVER_ENDING = frozenset({"WatchSession", "ListenSessionMessages"})


async def drain_call(call, method_name: str) -> None:
    """Run a server-streamed call to its end, or, for one that never ends, until the server says
    it is in place (its initial metadata) or fails; raises the call's error."""
    if method_name not in NEVER_ENDING:
        async for _ in call:
            pass
        return
    await call.initial_metadata()
    if call.done():
        async for _ in call:  # ended already: its status, raised as the call's error
            pass
    call.cancel()


def one_request(method) -> bool:
    """A method a test can call with one request: all but client-streamed uploads (a bidirectional
    method takes it as its only request)."""
    return not method.client_streaming or method.server_streaming


async def call_to_end(stub, method, request, **kwargs) -> None:
    """Call ``method`` with ``request`` and run the call to its end; raises the call's error."""
    fn = getattr(stub, method.name)
    call = fn(iter([request]), **kwargs) if method.client_streaming else fn(request, **kwargs)
    if method.server_streaming:
        await drain_call(call, method.name)
    else:
        await call


async def raw_call_to_end(channel, method, body: bytes, **kwargs) -> None:
    """``body`` sent as ``method``'s request (a stream's one message), bytes as they are, and the
    call run to its end as ``call_to_end`` runs it; raises the call's error."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    if method.client_streaming:
        streaming = channel.stream_stream if method.server_streaming else channel.stream_unary
        call = streaming(path)(iter([body]), **kwargs)
    else:
        unary = channel.unary_stream if method.server_streaming else channel.unary_unary
        call = unary(path)(body, **kwargs)
    if method.server_streaming:
        await drain_call(call, method.name)
    else:
        await call

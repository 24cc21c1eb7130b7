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

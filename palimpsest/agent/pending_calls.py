"""The client tool calls a replica waits on, by (session, turn, call), and a memory of those that no
longer wait, so a second answer is told "already answered", not "never asked". Apart from the client
tools themselves so the tool interface (`tools.base`) can name it without importing a tool."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

# Calls that no longer wait, remembered to answer a late or second answer plainly.
FINISHED_KEPT = 10_000

Key = tuple[str, str, str]  # session, turn, call
Outcome = Literal["taken", "answered", "unknown"]


@dataclass(frozen=True)
class Answer:
    content: str
    is_error: bool
    trusted: bool  # sent by the Palimpsest services: not outside content


class PendingCalls:
    """The client tool calls waiting on this replica, and those that recently stopped waiting."""

    def __init__(self) -> None:
        self._waiting: dict[Key, asyncio.Future[Answer]] = {}
        self._finished: OrderedDict[Key, None] = OrderedDict()

    def open(self, key: Key) -> asyncio.Future[Answer]:
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._waiting[key] = future
        return future

    def close(self, key: Key) -> None:
        self._waiting.pop(key, None)
        self._finished[key] = None
        while len(self._finished) > FINISHED_KEPT:
            self._finished.popitem(last=False)

    def answer(self, key: Key, answer: Answer) -> Outcome:
        future = self._waiting.get(key)
        if future is None:
            return "answered" if key in self._finished else "unknown"
        if future.done():
            return "answered"
        future.set_result(answer)
        return "taken"

"""The sessions the Agent keeps warm between turns, bounded by count and by bytes.

A warm session saves a store round trip before the next turn's first token; a cache bounded by
count alone grew from 58 MB to 442 MB over 50 concurrent turns with large contexts, so bytes bound
it too, and a session too big to be worth keeping is not kept.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

V = TypeVar("V")


class WarmCache(Generic[V]):
    """Least recently stored first out, within ``max_entries`` and ``max_bytes``."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, tuple[V, int]] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def put(self, key: str, value: V, size: int) -> None:
        self.pop(key)
        # One entry may take at most a quarter of the budget: a huge session would evict every
        # other one for a round trip it saves once.
        if size > self.max_bytes // 4:
            return
        self._items[key] = (value, size)
        self.bytes += size
        while len(self._items) > self.max_entries or self.bytes > self.max_bytes:
            _, (_, dropped) = self._items.popitem(last=False)
            self.bytes -= dropped

    def pop(self, key: str) -> V | None:
        found = self._items.pop(key, None)
        if found is None:
            return None
        self.bytes -= found[1]
        return found[0]

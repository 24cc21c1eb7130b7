"""Who watches which session: every event of a session's turns (and what happens after them)
copied to the clients of WatchSession. In-process: watchers of a session see the turns this Agent
replica runs (across replicas: the scale-out issue)."""

from __future__ import annotations

import asyncio
from collections import defaultdict

from palimpsest.v1 import agent_pb2

# A watcher that stops reading loses its oldest events, never blocks a turn.
WATCH_QUEUE_EVENTS = 1024


class SessionWatchers:
    def __init__(self) -> None:
        self._queues: dict[str, set[asyncio.Queue]] = defaultdict(set)

    def subscribe(self, session_id: str) -> asyncio.Queue:
        queue: asyncio.Queue = asyncio.Queue(WATCH_QUEUE_EVENTS)
        self._queues[session_id].add(queue)
        return queue

    def unsubscribe(self, session_id: str, queue: asyncio.Queue) -> None:
        queues = self._queues.get(session_id)
        if queues is not None:
            queues.discard(queue)
            if not queues:
                del self._queues[session_id]

    def publish(self, event: agent_pb2.AgentEvent) -> None:
        for queue in self._queues.get(event.session_id, ()):
            if queue.full():
                queue.get_nowait()  # the oldest goes: a meter wants the newest
            queue.put_nowait(event)

"""Who follows which session on this Agent replica, and what each WatchSession client is still to
be sent.

- A WatchSession client gets every event of the session's turns (and what happens after them); a
  ResumeStream reader follows one turn's kept log. Both follow the session, and both count: at most
  ``per_user`` such streams per user and ``per_session`` per session (0: no limit), checked before
  anything else is done for the call, since every one costs a write per event of what it follows.
  One more is RESOURCE_EXHAUSTED naming the setting.
- An event is serialized once: every watcher's queue holds the same bytes. A watcher that stops
  reading keeps the newest WATCH_QUEUE_EVENTS / WATCH_QUEUE_BYTES of them (the newest one always):
  its oldest go, a turn never waits.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Iterator
from contextlib import contextmanager

from palimpsest.shared.errors import ResourceExhausted

# A meter wants the newest; a watcher that stops reading costs at most this (the bytes shared with
# the session's other watchers).
WATCH_QUEUE_EVENTS = 1024
WATCH_QUEUE_BYTES = 1024 * 1024


class Watch:
    """One WatchSession client's events still to be sent, serialized."""

    def __init__(self) -> None:
        self._payloads: deque[bytes] = deque()
        self._bytes = 0
        self._more = asyncio.Event()

    def put(self, payload: bytes) -> None:
        self._payloads.append(payload)
        self._bytes += len(payload)
        while len(self._payloads) > 1 and (len(self._payloads) > WATCH_QUEUE_EVENTS or self._bytes > WATCH_QUEUE_BYTES):
            self._bytes -= len(self._payloads.popleft())
        self._more.set()

    async def next(self) -> bytes:
        while not self._payloads:
            self._more.clear()
            await self._more.wait()
        payload = self._payloads.popleft()
        self._bytes -= len(payload)
        return payload


class SessionWatchers:
    def __init__(self, per_user: int = 0, per_session: int = 0) -> None:
        self.per_user = per_user
        self.per_session = per_session
        self._watches: dict[str, set[Watch]] = {}
        self._by_user: Counter[str] = Counter()
        self._by_session: Counter[str] = Counter()

    @contextmanager
    def following(self, session_id: str, user: str) -> Iterator[None]:
        """One more stream following the session, for as long as the block runs; RESOURCE_EXHAUSTED
        when the user or the session has as many as the settings allow."""
        if self.per_user and self._by_user[user] >= self.per_user:
            raise ResourceExhausted(
                f"PALIMPSEST_WATCHERS_PER_USER: {user} already has {self._by_user[user]} streams following sessions "
                "(WatchSession, ResumeStream) on this Agent, the most allowed; end one first"
            )
        if self.per_session and self._by_session[session_id] >= self.per_session:
            raise ResourceExhausted(
                f"PALIMPSEST_WATCHERS_PER_SESSION: session {session_id} already has {self._by_session[session_id]} "
                "streams following it (WatchSession, ResumeStream) on this Agent, the most allowed; end one first"
            )
        self._by_user[user] += 1
        self._by_session[session_id] += 1
        try:
            yield
        finally:
            for counts, key in ((self._by_user, user), (self._by_session, session_id)):
                counts[key] -= 1
                if not counts[key]:
                    del counts[key]

    @contextmanager
    def watching(self, session_id: str, user: str) -> Iterator[Watch]:
        """A watch of the session (counted as following it): every event published from now on."""
        with self.following(session_id, user):
            watch = Watch()
            self._watches.setdefault(session_id, set()).add(watch)
            try:
                yield watch
            finally:
                watches = self._watches[session_id]
                watches.discard(watch)
                if not watches:
                    del self._watches[session_id]

    def publish(self, session_id: str, payload: bytes) -> None:
        for watch in self._watches.get(session_id, ()):
            watch.put(payload)

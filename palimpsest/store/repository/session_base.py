"""What the parts of Sessions share: the pool, the hot window's caps and the owners' usage."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import asyncpg

from palimpsest.store.db import Connection
from palimpsest.store.repository.usage import OwnerUsage

# A session's preview: the start of its first user message.
PREVIEW_CHARS = 120


@dataclass
class HotWindow:
    """Past either cap, the oldest message groups move to the archive."""

    max_messages: int
    max_bytes: int


class SessionsBase:
    """The state Sessions' parts share (SessionReads, HotWindowArchive and Sessions itself)."""

    def __init__(self, pool: asyncpg.Pool, *, hot_window: HotWindow, usage: OwnerUsage) -> None:
        self.pool = pool
        self.hot_window = hot_window
        self.usage = usage

    @staticmethod
    async def _bump(conn: Connection, session_id: uuid.UUID) -> int:
        return await conn.fetchval(
            "UPDATE sessions SET revision = revision + 1, last_active = now() WHERE id = $1 RETURNING revision",
            session_id,
        )

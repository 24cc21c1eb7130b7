"""A session's audit log: tool_runs, one row per tool run of its turns. The rows are written by the
append function with the append that carries them (see Sessions.append_messages and functions.sql);
here they are read, a page at a time."""

from __future__ import annotations

import uuid

import asyncpg

from palimpsest.shared.auth import Identity
from palimpsest.store.repository.access import readable

_COLUMNS = (
    "seq, turn_id, call_id, is_subagent, tool, arguments, call_seq, started_at, duration_seconds, outcome,"
    " bytes_in, bytes_out, error"
)
# One more row than the page, to know whether more remain; both walk the primary key.
_NEWEST_BEFORE = f"SELECT {_COLUMNS} FROM tool_runs WHERE session_id = $1 AND seq < $2 ORDER BY seq DESC LIMIT $3"
_OLDEST_AFTER = f"SELECT {_COLUMNS} FROM tool_runs WHERE session_id = $1 AND seq > $2 ORDER BY seq LIMIT $3"


class ToolRuns:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def list_runs(
        self, identity: Identity, session_id: uuid.UUID, *, before_seq: int, after_seq: int | None, limit: int
    ) -> tuple[list[asyncpg.Record], bool]:
        """Up to `limit` runs, oldest first: the newest before `before_seq` (0: the newest of all), or
        with `after_seq` the oldest after it; and whether more remain that way. Only for a caller who
        may read the session."""
        async with self.pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            await readable(conn, session_id, identity)
            if after_seq is not None:
                rows = await conn.fetch(_OLDEST_AFTER, session_id, after_seq, limit + 1)
            else:
                rows = await conn.fetch(_NEWEST_BEFORE, session_id, before_seq or 2**62, limit + 1)
        page = rows[:limit]
        if after_seq is None:
            page.reverse()
        return page, len(rows) > limit

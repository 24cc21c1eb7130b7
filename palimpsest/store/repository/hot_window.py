"""The hot window: past its caps the oldest message groups move to session_messages_archive (the first
system message and the original task stay); archiving below a seq and trimming on request."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence

import asyncpg

from palimpsest.shared.auth import Identity
from palimpsest.store.convert import INSERT_COLUMNS
from palimpsest.store.db import Connection
from palimpsest.store.repository.access import (
    lock_session,
    rows_affected,
)
from palimpsest.store.repository.calibration import forget_baseline
from palimpsest.store.repository.message_rows import BOTH_TABLES, ROW_BYTES
from palimpsest.store.repository.session_base import PREVIEW_CHARS, SessionsBase
from palimpsest.store.repository.trim import TrimRow, displayed, kept_seqs

log = logging.getLogger("palimpsest.store.sessions")


class HotWindowArchive(SessionsBase):
    """Moving rows out of the hot window, and the counters that follow."""

    async def _archive_if_over(self, session_id: uuid.UUID) -> int:
        """After an append took the session past the hot window: its own transaction, the counters
        read again under the lock (another append may have moved the rows already). The append has
        committed, so a failure here is logged, not answered: the next append past the window tries
        again."""
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                locked = await conn.fetchrow(
                    "SELECT hot_count, hot_bytes FROM sessions WHERE id = $1 FOR UPDATE", session_id
                )
                if locked is None or not self._over_hot_window(locked["hot_count"], locked["hot_bytes"]):
                    return 0
                return await self._archive_overflow(conn, session_id)
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError) as exc:
            log.warning(
                "session %s: moving rows past the hot window to the archive failed (%s); the next append tries again",
                session_id,
                exc,
            )
            return 0

    def _over_hot_window(self, count: int, size: int) -> bool:
        return count > self.hot_window.max_messages or size > self.hot_window.max_bytes

    async def _archive_overflow(self, conn: Connection, session_id: uuid.UUID) -> int:
        """Move the oldest whole groups out until the hot rows are back to 80% of both caps."""
        rows = await conn.fetch(
            f"SELECT seq, role, is_summary, {ROW_BYTES} AS size FROM session_messages WHERE session_id = $1"
            " ORDER BY seq",
            session_id,
        )
        protected = _protected_seqs(rows)
        count, size = len(rows), sum(r["size"] for r in rows)
        goal_count = int(self.hot_window.max_messages * 0.8)
        goal_bytes = int(self.hot_window.max_bytes * 0.8)
        threshold = None
        for i, row in enumerate(rows):
            if count <= goal_count and size <= goal_bytes:
                break
            if row["seq"] not in protected:
                count -= 1
                size -= row["size"]
            # Cut only where a new group starts, so a turn never straddles the two tables.
            nxt = rows[i + 1] if i + 1 < len(rows) else None
            if nxt is not None and nxt["role"] == "user" and not nxt["is_summary"]:
                threshold = nxt["seq"]
        if threshold is None:
            return 0
        return await self._move_to_archive(conn, session_id, threshold, sorted(protected))

    @staticmethod
    async def _move_to_archive(conn: Connection, session_id: uuid.UUID, below_seq: int, protected: list[int]) -> int:
        status = await conn.execute(
            f"""
            WITH moved AS (
                DELETE FROM session_messages
                 WHERE session_id = $1 AND seq < $2 AND NOT (seq = ANY($3::bigint[]))
                RETURNING {INSERT_COLUMNS}, token_digest, token_cut
            )
            INSERT INTO session_messages_archive ({INSERT_COLUMNS}, token_digest, token_cut)
            SELECT {INSERT_COLUMNS}, token_digest, token_cut FROM moved
            """,
            session_id,
            below_seq,
            protected,
        )
        moved = rows_affected(status)
        if moved:
            await conn.execute(
                f"""
                UPDATE sessions SET hot_count = sub.n, hot_bytes = sub.bytes FROM (
                    SELECT count(*) AS n, coalesce(sum({ROW_BYTES}), 0) AS bytes
                      FROM session_messages WHERE session_id = $1) sub
                 WHERE id = $1
                """,
                session_id,
            )
        return moved

    async def archive_old_messages(self, identity: Identity, session_id: uuid.UUID, below_seq: int) -> int:
        async with self.pool.acquire() as conn, conn.transaction():
            await lock_session(conn, session_id, identity, None)
            rows = await conn.fetch(
                "SELECT seq, role, is_summary FROM session_messages WHERE session_id = $1 AND seq < $2 ORDER BY seq",
                session_id,
                below_seq,
            )
            first_rows = await conn.fetch(
                "SELECT seq, role, is_summary FROM session_messages WHERE session_id = $1 AND role IN ('system', 'user')"
                " ORDER BY seq",
                session_id,
            )
            protected = _protected_seqs(first_rows)
            moved = await self._move_to_archive(conn, session_id, below_seq, sorted(protected)) if rows else 0
            if moved:
                await self._bump(conn, session_id)
        return moved

    async def trim_session(self, identity: Identity, session_id: uuid.UUID, keep: int) -> tuple[int, int]:
        """Keep the newest `keep` displayed messages, a stored system prompt counting as one
        (trim.kept_seqs); returns the displayed messages before and after."""
        async with self.pool.acquire() as conn, conn.transaction():
            await lock_session(conn, session_id, identity, None)
            rows = [
                TrimRow(r["seq"], r["role"], r["is_display"], r["is_compression"])
                for r in await conn.fetch(
                    "SELECT seq, role, is_display, is_compression FROM session_messages WHERE session_id = $1"
                    " UNION ALL SELECT seq, role, is_display, is_compression FROM session_messages_archive"
                    " WHERE session_id = $1 ORDER BY seq",
                    session_id,
                )
            ]
            kept = kept_seqs(rows, keep)
            drop = [r.seq for r in rows if r.seq not in kept]
            if drop:
                for table in ("session_messages", "session_messages_archive"):
                    await conn.execute(
                        f"DELETE FROM {table} WHERE session_id = $1 AND seq = ANY($2::bigint[])", session_id, drop
                    )
                if await conn.fetchval("SELECT to_regclass('message_vectors') IS NOT NULL"):
                    # Search by meaning must not find the session by what was trimmed away.
                    await conn.execute(
                        "DELETE FROM message_vectors WHERE session_id = $1 AND seq = ANY($2::bigint[])",
                        session_id,
                        drop,
                    )
                await self._recount(conn, session_id)
                # The last real prompt size described rows that are gone.
                await forget_baseline(conn, session_id)
        self.usage.forget()
        return displayed(rows), displayed(rows, kept)

    @staticmethod
    async def _recount(conn: Connection, session_id: uuid.UUID) -> None:
        # next_seq moves on (one seq never used): messages went, and a writer holding the session from
        # before (an Agent's warm copy) must not append through expected_next_seq as if only a name
        # or a pin had changed; its append is ABORTED and it reads the session again.
        await conn.execute(
            f"""
            UPDATE sessions s SET revision = revision + 1, last_active = now(), context_token_count = 0,
                   next_seq = next_seq + 1,
                   display_count = (SELECT count(*) FROM ({BOTH_TABLES.format(where="is_display")}) d),
                   hot_count = (SELECT count(*) FROM session_messages WHERE session_id = $1),
                   hot_bytes = (SELECT coalesce(sum({ROW_BYTES}), 0)
                                  FROM session_messages WHERE session_id = $1),
                   message_bytes = (SELECT coalesce(sum({ROW_BYTES}), 0) FROM (
                        SELECT content, thinking, tool_calls, images FROM session_messages WHERE session_id = $1
                        UNION ALL
                        SELECT content, thinking, tool_calls, images FROM session_messages_archive
                         WHERE session_id = $1) m),
                   preview = coalesce((SELECT left(content, {PREVIEW_CHARS}) FROM (
                        {BOTH_TABLES.format(where="role = 'user' AND content <> ''")}) u ORDER BY seq LIMIT 1), '')
             WHERE id = $1
            """,
            session_id,
        )


def _protected_seqs(rows: Sequence[asyncpg.Record]) -> set[int]:
    """The first system message and the first user message (the original task) always stay hot."""
    protected = set()
    system = next((r["seq"] for r in rows if r["role"] == "system"), None)
    user = next((r["seq"] for r in rows if r["role"] == "user" and not r["is_summary"]), None)
    for seq in (system, user):
        if seq is not None:
            protected.add(seq)
    return protected

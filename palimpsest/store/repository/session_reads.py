"""Reading sessions: one session with pages of its display history and context, lists and searches
of sessions, history pages (hot rows and the archive together)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from palimpsest.shared.auth import Identity
from palimpsest.store import convert
from palimpsest.store.db import Connection
from palimpsest.store.repository.access import (
    like_pattern,
    readable,
    visible,
)
from palimpsest.store.repository.message_rows import BOTH_TABLES, ROW_BYTES
from palimpsest.store.repository.session_base import SessionsBase
from palimpsest.store.repository.session_matches import matched_sql, matching_words, snippet_around
from palimpsest.v1 import common_pb2

_SORT_COLUMNS = {
    "last_active": "s.last_active",
    "created_at": "s.created_at",
    "name": "lower(s.name)",
    "message_count": "s.display_count",
}

# The sizes of a page's candidate rows, in page order: display rows newest first before $2 (at most
# $3), archived rows the same, the context in its order from offset $2.
_SIZES = f"SELECT seq, replaces_first, {ROW_BYTES} AS bytes FROM {{table}} WHERE session_id = $1 AND {{where}}"
_DISPLAY_NEWEST = (
    f"{_SIZES.format(table='session_messages', where='is_display AND seq < $2')} UNION ALL "
    f"{_SIZES.format(table='session_messages_archive', where='is_display AND seq < $2')}"
    " ORDER BY seq DESC LIMIT $3"
)
_ARCHIVED_NEWEST = f"{_SIZES.format(table='session_messages_archive', where='seq < $2')} ORDER BY seq DESC LIMIT $3"
# A summary stands where the history it replaced stood, so it sorts at its range's start.
_CONTEXT_FROM = (
    f"SELECT * FROM ({_SIZES.format(table='session_messages', where='is_context')} UNION ALL "
    f"{_SIZES.format(table='session_messages_archive', where='is_context')}) rows"
    " ORDER BY coalesce(replaces_first, seq), seq OFFSET $2"
)


def rows_within(sizes: Sequence[int], budget: int) -> int:
    """How many of the leading rows fit `budget` bytes together; at least one, so a page always
    moves on (one message is capped below the budget when it is written)."""
    total = 0
    for count, size in enumerate(sizes):
        total += size
        if total > budget and count:
            return count
    return len(sizes)


@dataclass
class Page:
    messages: list[common_pb2.Message]
    has_more: bool


@dataclass
class SessionRead:
    row: asyncpg.Record
    display: Page | None = None
    context: Page | None = None


class SessionReads(SessionsBase):
    """Reads of sessions and their messages."""

    async def get_session(self, identity: Identity, session_id: uuid.UUID) -> asyncpg.Record:
        async with self.pool.acquire() as conn:
            return await readable(conn, session_id, identity)

    async def read_session(
        self,
        identity: Identity,
        session_id: uuid.UUID,
        *,
        display_budget: int = 0,
        context_budget: int = 0,
        context_offset: int = 0,
    ) -> SessionRead:
        """The session's row and, for each budget given, its newest display messages / its context
        from `context_offset` on, each within its budget in bytes; all from one snapshot."""
        async with self.pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            read = SessionRead(await readable(conn, session_id, identity))
            if display_budget:
                read.display = await self._page(conn, session_id, _DISPLAY_NEWEST, [2**62, 2**62], display_budget)
                read.display.messages.reverse()  # read newest first, shown oldest first
            if context_budget:
                read.context = await self._page(conn, session_id, _CONTEXT_FROM, [context_offset], context_budget)
        return read

    @staticmethod
    async def _page(
        conn: Connection,
        session_id: uuid.UUID,
        sizes_sql: str,
        params: list[Any],
        budget: int,
        max_rows: int | None = None,
    ) -> Page:
        """The rows `sizes_sql` lists (seq and bytes, in page order), at most `max_rows` and as many
        as fit `budget`. Sizes come first, so rows past the budget are never read."""
        sizes = await conn.fetch(sizes_sql, session_id, *params)
        taken = rows_within([r["bytes"] for r in sizes[:max_rows]], budget)
        seqs = [r["seq"] for r in sizes[:taken]]
        rows = await conn.fetch(BOTH_TABLES.format(where="seq = ANY($2::bigint[])"), session_id, seqs)
        by_seq = {r["seq"]: convert.message_from_row(r, archived=r["archived"]) for r in rows}
        return Page([by_seq[seq] for seq in seqs if seq in by_seq], has_more=taken < len(sizes))

    async def list_sessions(
        self,
        identity: Identity,
        *,
        profile_id: str,
        query: str,
        sort_by: str,
        descending: bool,
        limit: int,
        offset: int,
        meaning: tuple[str, str, int, float] | None = None,
    ) -> tuple[list[asyncpg.Record], int]:
        """``meaning``: (model, the query's vector, its dimensions, the floor) to match sessions by
        their messages' and summaries' meaning too (MemoryIndex.sessions_query); None: words only.
        Sort "relevance" ranks a query's matches best first (session_matches)."""
        params: list[Any] = []
        where = [visible(identity, params)]
        if profile_id:
            params.append(profile_id)
            where.append(f"s.profile_id = ${len(params)}")
        source = "sessions s"
        order = f"s.pinned DESC, {_SORT_COLUMNS.get(sort_by, 's.last_active')} {'DESC' if descending else 'ASC'}, s.id"
        if query:
            # The matching ids are collected once, each arm on its own trigram index, and the page
            # and its total come from one pass (no second search for count(*)).
            matched, relevance = matched_sql(query, params, meaning)
            source = f"{matched} JOIN sessions s ON s.id = matched.id"
            if sort_by == "relevance":
                order = f"{relevance} DESC, s.last_active DESC, s.id"
        where_sql = " AND ".join(where)
        count_params = list(params)
        params.extend([limit, offset])
        total_column = ", count(*) OVER () AS total" if query else ""
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                f"SELECT s.*{total_column} FROM {source} WHERE {where_sql} ORDER BY {order}"
                f" LIMIT ${len(params) - 1} OFFSET ${len(params)}",
                *params,
            )
            if rows and query:
                total = rows[0]["total"]
            else:  # no query (an index-ordered page), or a page past the end
                total = await conn.fetchval(f"SELECT count(*) FROM {source} WHERE {where_sql}", *count_params)
        return rows, total

    async def search_matches(
        self, identity: Identity, session_ids: list[uuid.UUID], query: str
    ) -> list[tuple[str, list[int], str]]:
        """Display indices of the messages holding `query` or, for a query of several words, any
        of its words, per session, in one aggregate query; the snippet comes from the message
        holding the most of them (the whole query first), the earliest of those."""
        params: list[Any] = [session_ids]
        callers = visible(identity, params)
        params.append(like_pattern(query))
        whole = f"${len(params)}"
        params.append([like_pattern(w) for w in matching_words(query)])
        words = f"${len(params)}::text[]"
        patterns = [whole]
        for word in matching_words(query):
            params.append(like_pattern(word))
            patterns.append(f"${len(params)}")
        # One arm per table and pattern, each on its trigram index (an OR of patterns used none).
        arms = " UNION ".join(
            f"SELECT session_id, seq FROM {table} WHERE session_id = ANY($1) AND is_display AND content ILIKE {p}"
            for p in patterns
            for table in ("session_messages", "session_messages_archive")
        )
        rows = await self.pool.fetch(
            f"""
            WITH allowed AS (SELECT s.id FROM sessions s WHERE s.id = ANY($1) AND {callers}),
            hits AS (
                -- the matching rows' text by key: reading the pages' whole history would cost more
                SELECT k.session_id, k.seq, coalesce(
                           (SELECT content FROM session_messages WHERE session_id = k.session_id AND seq = k.seq),
                           (SELECT content FROM session_messages_archive
                             WHERE session_id = k.session_id AND seq = k.seq)) AS content
                  FROM ({arms}) k
            ),
            scored AS (
                SELECT h.*, (CASE WHEN content ILIKE {whole} THEN 100 ELSE 0 END
                             + (SELECT count(*) FROM unnest({words}) w WHERE h.content ILIKE w)) AS held
                  FROM hits h WHERE session_id IN (SELECT id FROM allowed)
            ),
            numbered AS (
                -- display positions, only for the sessions that have a hit
                SELECT session_id, seq, row_number() OVER (PARTITION BY session_id ORDER BY seq) - 1 AS idx
                  FROM (SELECT session_id, seq FROM session_messages
                         WHERE session_id = ANY(ARRAY(SELECT DISTINCT session_id FROM scored)) AND is_display
                        UNION ALL
                        SELECT session_id, seq FROM session_messages_archive
                         WHERE session_id = ANY(ARRAY(SELECT DISTINCT session_id FROM scored)) AND is_display) d
            )
            SELECT h.session_id, array_agg(n.idx ORDER BY n.idx) AS indices,
                   (array_agg(h.content ORDER BY h.held DESC, n.idx))[1] AS best_content
              FROM scored h JOIN numbered n USING (session_id, seq)
             GROUP BY h.session_id
            """,
            *params,
        )
        return [(str(r["session_id"]), list(r["indices"]), snippet_around(r["best_content"], query)) for r in rows]

    async def history_page(
        self,
        identity: Identity | None,
        session_id: uuid.UUID,
        before_seq: int,
        limit: int,
        *,
        archive_only: bool,
        budget: int,
    ) -> Page:
        """Up to `limit` display (or archived) messages before `before_seq`, newest of them, oldest
        first, within `budget` bytes; `has_more` when older ones remain."""
        async with self.pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            if identity is not None:
                await readable(conn, session_id, identity)
            before = before_seq if before_seq > 0 else 2**62
            page = await self._page(
                conn,
                session_id,
                _ARCHIVED_NEWEST if archive_only else _DISPLAY_NEWEST,
                [before, limit + 1],
                budget,
                max_rows=limit,
            )
        page.messages.reverse()
        return page

"""All SQL of the SessionStore, one method per mutation or query; parameters always bound.

Every write to a session locks its row, checks ownership and `expected_revision`, and bumps the
revision in the same transaction, so two writers can never interleave unnoticed.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import asyncpg

from palimpsest.v1 import common_pb2
from services.shared.auth import Identity
from services.shared.errors import Aborted, FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from services.shared.validation import capped
from services.session_store import convert, share_links
from services.session_store.convert import INSERT_COLUMNS, MESSAGE_COLUMNS

PLANNING_LOG_CAP = 20
# A recall query is the user's whole message; its first words carry enough to find candidates.
MEMORY_QUERY_CHARS = 500
MEMORY_CANDIDATES_PER_RESULT = 10
PREVIEW_CHARS = 120

_SORT_COLUMNS = {
    "last_active": "s.last_active",
    "created_at": "s.created_at",
    "name": "lower(s.name)",
    "message_count": "s.display_count",
}

# What a row weighs against the hot window's byte cap: one definition, in SQL, for every counter.
ROW_BYTES = ("(octet_length(content) + octet_length(thinking) + octet_length(tool_calls::text)"
             " + coalesce((SELECT sum(octet_length(i)) FROM unnest(images) i), 0))")



def new_rows_bytes(first_seq_param: str) -> str:
    """SQL for the bytes of a session's rows from seq `first_seq_param` on: O(new rows), inside the
    statement that updates the counters (no round trip of its own)."""
    return (f"(SELECT coalesce(sum({ROW_BYTES}), 0) FROM session_messages"
            f" WHERE session_id = $1 AND seq >= {first_seq_param})")


_INSERT_SQL = (
    f"INSERT INTO session_messages ({INSERT_COLUMNS}) VALUES "
    f"({', '.join(f'${i}' for i in range(1, 26))})"
)

# Hot and archived rows read as one history; `archived` tells them apart.
_BOTH_TABLES = f"""
    SELECT {MESSAGE_COLUMNS}, false AS archived FROM session_messages WHERE session_id = $1 AND {{where}}
    UNION ALL
    SELECT {MESSAGE_COLUMNS}, true AS archived FROM session_messages_archive WHERE session_id = $1 AND {{where}}
"""


def like_pattern(text: str) -> str:
    """A substring ILIKE pattern matching `text` literally."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def snippet_around(content: str, query: str, radius: int = 60) -> str:
    at = content.lower().find(query.lower())
    if at < 0:
        return content[: radius * 2]
    start, end = max(0, at - radius), min(len(content), at + len(query) + radius)
    return ("…" if start else "") + content[start:end] + ("…" if end < len(content) else "")


# The columns of an exact observation are the fields of PromptShape, one owner for both.
EXACT_FIELDS = tuple(f.name for f in common_pb2.PromptShape.DESCRIPTOR.fields)
# The calibrated line fits the newest 8 (calibration.OBSERVATION_WINDOW); the per-class rates,
# with eight constants to learn, the newest 16.
CHAR_OBSERVATIONS = 16
EXACT_OBSERVATIONS = 32  # the template fit: per model, so every session of it contributes
# A cut view can come out a few tokens over its budget where a merge crosses the cut. Only rows
# without tool calls are capped: calls are never cut, so such a row may cost more than the budget.
CUT_SEAM_TOKENS = 4
_COUNTED = "token_digest = $2 AND cardinality(images) = 0"
# A session, its baseline and its context's size from stored counts in one round trip: the
# pre-call size check runs before every model call, so its reads must not add up.
_BASELINE_COLUMNS = ("tokens", "through_seq", "model", "context_truncated", "recorded_at")
_SESSION_AND_BASELINE = f"""
    SELECT s.owner, s.revision, b.session_id IS NOT NULL AS has_baseline,
           {', '.join(f'b.{c} AS baseline_{c}' for c in _BASELINE_COLUMNS)}{{more}}
      FROM sessions s LEFT JOIN session_baselines b ON b.session_id = s.id{{join}}
     WHERE s.id = $1
"""
_SESSION_BASELINE_SQL = _SESSION_AND_BASELINE.format(more="", join="")
_COUNTED_CONTEXT_SQL = _SESSION_AND_BASELINE.format(more=", c.*", join=f"""
     CROSS JOIN LATERAL (
        SELECT coalesce(sum(CASE WHEN role IN ('assistant', 'tool') AND jsonb_array_length(tool_calls) = 0
                                 THEN least(token_count, $3) ELSE token_count END) FILTER (WHERE counted), 0)
                   AS counted_tokens,
               count(*) FILTER (WHERE counted) AS counted_messages,
               count(*) FILTER (WHERE counted AND role = 'tool') AS counted_tool_results,
               coalesce(sum(jsonb_array_length(tool_calls)) FILTER (WHERE counted), 0) AS counted_tool_calls,
               count(*) FILTER (WHERE NOT counted) AS uncounted_messages
          FROM (SELECT role, token_count, tool_calls, {_COUNTED} AS counted FROM session_messages
                 WHERE session_id = $1 AND is_context
                UNION ALL
                SELECT role, token_count, tool_calls, {_COUNTED} AS counted FROM session_messages_archive
                 WHERE session_id = $1 AND is_context) ctx) c""")
_UNCOUNTED_CONTEXT_SQL = (
    f"SELECT * FROM ({_BOTH_TABLES.format(where=f'is_context AND NOT ({_COUNTED})')}) rows ORDER BY seq"
)
_OBSERVATION_COLUMNS = f"id, model, chars, tokens, observed_at, {', '.join(EXACT_FIELDS)}"
_OBSERVATIONS_SQL = f"""
    (SELECT {_OBSERVATION_COLUMNS} FROM calibration_observations WHERE model = $1 AND content_tokens = 0
     ORDER BY id DESC LIMIT $2)
    UNION ALL
    (SELECT {_OBSERVATION_COLUMNS} FROM calibration_observations WHERE model = $1 AND content_tokens > 0
     ORDER BY id DESC LIMIT $3)
    ORDER BY id DESC
"""


# A retry comes within its writer's deadline (seconds to minutes); a day of keys is plenty.
APPEND_KEY_DAYS = 1
# One statement: remember this append's key, and forget the session's keys past their day.
_REMEMBER_APPEND_SQL = """
    WITH expired AS (
        DELETE FROM applied_appends WHERE session_id = $1 AND applied_at < $5::timestamptz - make_interval(days => $6)
    )
    INSERT INTO applied_appends (session_id, key, seqs, revision, applied_at) VALUES ($1, $2, $3, $4, $5)
"""


def _check_revision(session_id: uuid.UUID, revision: int, expected_revision: int | None) -> None:
    if expected_revision is not None and revision != expected_revision:
        raise Aborted(
            f"session {session_id} is at revision {revision}, not the expected {expected_revision}: "
            "another writer changed it; reload and retry"
        )


# The sizes of a page's candidate rows, in page order: display rows newest first before $2 (at most
# $3), archived rows the same, the context in its order from offset $2.
_SIZES = f"SELECT seq, replaces_first, {ROW_BYTES} AS bytes FROM {{table}} WHERE session_id = $1 AND {{where}}"
_DISPLAY_NEWEST = (f"{_SIZES.format(table='session_messages', where='is_display AND seq < $2')} UNION ALL "
                   f"{_SIZES.format(table='session_messages_archive', where='is_display AND seq < $2')}"
                   " ORDER BY seq DESC LIMIT $3")
_ARCHIVED_NEWEST = (f"{_SIZES.format(table='session_messages_archive', where='seq < $2')}"
                    " ORDER BY seq DESC LIMIT $3")
# A summary stands where the history it replaced stood, so it sorts at its range's start.
_CONTEXT_FROM = (f"SELECT * FROM ({_SIZES.format(table='session_messages', where='is_context')} UNION ALL "
                 f"{_SIZES.format(table='session_messages_archive', where='is_context')}) rows"
                 " ORDER BY coalesce(replaces_first, seq), seq OFFSET $2")


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


@dataclass
class AppendResult:
    seqs: list[int]
    revision: int
    archived: int


# How stale an owner's stored bytes may be when a write is checked against the quota; other
# replicas' writes meanwhile may pass it by their own size, as concurrent writes always could.
USAGE_REFRESH_S = 5.0
USAGE_OWNERS = 100_000


@dataclass(frozen=True)
class Quotas:
    """What one owner may keep; 0: no limit."""

    max_sessions: int
    max_bytes: int


# Advisory-lock class of per-owner session creation (the second key is the owner's hash).
_OWNER_LOCK = 0x6F776E  # "own"


@dataclass
class HotWindow:
    """Past either cap, the oldest message groups move to the archive."""

    max_messages: int
    max_bytes: int


class SessionRepository:
    """The store's one way into PostgreSQL (sessions, messages and their archive, shares, memory chunks,
    baselines, calibration): the servicer turns protos and callers into these calls, this runs the SQL."""

    def __init__(self, pool: asyncpg.Pool, *, hot_window: HotWindow, share_key: bytes,
                 quotas: Quotas = Quotas(0, 0)):
        self.pool = pool
        self.hot_window = hot_window
        self.share_key = share_key
        self.quotas = quotas
        # Each owner's stored bytes as last read, with when: see _owner_bytes.
        self._usage: OrderedDict[str, tuple[int, float]] = OrderedDict()

    # -- access ----------------------------------------------------------------------------
    async def _lock_session(
        self, conn: asyncpg.Connection, session_id: uuid.UUID, identity: Identity, expected_revision: int | None
    ) -> asyncpg.Record:
        row = await conn.fetchrow(
            "SELECT owner, revision, next_seq, hot_count, hot_bytes FROM sessions WHERE id = $1 FOR UPDATE",
            session_id,
        )
        if row is None:
            raise NotFound(f"session {session_id} not found")
        identity.require_access(row["owner"], str(session_id))
        _check_revision(session_id, row["revision"], expected_revision)
        return row

    async def _readable(self, conn: asyncpg.Connection, session_id: uuid.UUID, identity: Identity) -> asyncpg.Record:
        row = await conn.fetchrow("SELECT * FROM sessions WHERE id = $1", session_id)
        if row is None:
            raise NotFound(f"session {session_id} not found")
        identity.require_access(row["owner"], str(session_id))
        return row

    @staticmethod
    def _visible(identity: Identity, params: list[Any]) -> str:
        """A WHERE fragment limiting sessions to the caller's (admins and auth-off see all)."""
        if not identity.enforced or identity.is_admin:
            return "true"
        params.append(identity.sub)
        return f"s.owner = ${len(params)}"

    # -- sessions --------------------------------------------------------------------------
    async def create_session(
        self,
        identity: Identity,
        *,
        profile_id: str,
        name: str,
        provider: str,
        model: str,
        external_refs: list[dict[str, Any]],
        metadata: dict[str, Any],
    ) -> asyncpg.Record:
        owner = identity.owner_for_new_session
        async with self.pool.acquire() as conn, conn.transaction():
            if self.quotas.max_sessions and owner is not None:
                # One creation at a time per owner, so two at once cannot both take the last place.
                await conn.execute("SELECT pg_advisory_xact_lock($1::int, hashtext($2))", _OWNER_LOCK, owner)
                count = await conn.fetchval("SELECT count(*) FROM sessions WHERE owner = $1", owner)
                if count >= self.quotas.max_sessions:
                    raise ResourceExhausted(
                        f"session quota: {capped(owner, 100)} has {count:,} sessions, the most one "
                        f"owner may keep (PALIMPSEST_OWNER_MAX_SESSIONS = {self.quotas.max_sessions:,}); "
                        "delete or clean up sessions first")
            return await conn.fetchrow(
                "INSERT INTO sessions (id, owner, profile_id, name, provider, model, external_refs, metadata)"
                " VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING *",
                uuid.uuid4(), owner, profile_id, name, provider, model, external_refs, metadata,
            )

    async def _check_storage(self, conn: asyncpg.Connection, owner: str | None, adding: int) -> None:
        """Refuse a write that would take the owner past the storage quota (messages and files of
        all their sessions). Checked before writing: concurrent writes may pass it by their own size.
        Ownerless (legacy, admin-only) sessions have no quota."""
        if not self.quotas.max_bytes or adding <= 0 or owner is None:
            return
        used = await self._owner_bytes(conn, owner)
        if used + adding > self.quotas.max_bytes:
            raise ResourceExhausted(
                f"storage quota: {capped(owner, 100)} stores {used:,} bytes; {adding:,} more would pass "
                f"the {self.quotas.max_bytes:,} one owner may keep (PALIMPSEST_OWNER_MAX_MB); "
                "delete or trim sessions first")
        self._usage[owner] = (used + adding, self._usage[owner][1])

    def _forget_usage(self) -> None:
        """After a delete or trim has committed: what owners store went down, read it again."""
        self._usage.clear()

    async def _owner_bytes(self, conn: asyncpg.Connection, owner: str) -> int:
        """What the owner stores: summed over their sessions at most every USAGE_REFRESH_S, and
        kept up with this replica's own writes in between. The sum costs ~1.7 ms for an owner of
        10,000 sessions; paid on every append, it stood between a user's message and the model."""
        now = time.monotonic()
        cached = self._usage.get(owner)
        if cached is not None and now - cached[1] < USAGE_REFRESH_S:
            return cached[0]
        used = await conn.fetchval("SELECT coalesce(sum(message_bytes + file_bytes), 0) FROM sessions"
                                   " WHERE owner = $1", owner)
        self._usage[owner] = (used, now)
        self._usage.move_to_end(owner)
        while len(self._usage) > USAGE_OWNERS:
            self._usage.popitem(last=False)
        return used

    async def reserve_file_bytes(self, identity: Identity, session_id: uuid.UUID, size: int) -> None:
        """Before a file is kept: refused past the owner's storage quota."""
        async with self.pool.acquire() as conn:
            row = await self._readable(conn, session_id, identity)
            await self._check_storage(conn, row["owner"], size)

    async def add_file_bytes(self, session_id: uuid.UUID, size: int) -> None:
        await self.pool.execute("UPDATE sessions SET file_bytes = file_bytes + $2 WHERE id = $1", session_id, size)

    async def get_session(self, identity: Identity, session_id: uuid.UUID) -> asyncpg.Record:
        async with self.pool.acquire() as conn:
            return await self._readable(conn, session_id, identity)

    async def read_session(self, identity: Identity, session_id: uuid.UUID, *, display_budget: int = 0,
                           context_budget: int = 0, context_offset: int = 0) -> SessionRead:
        """The session's row and, for each budget given, its newest display messages / its context
        from `context_offset` on, each within its budget in bytes; all from one snapshot."""
        async with self.pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            read = SessionRead(await self._readable(conn, session_id, identity))
            if display_budget:
                read.display = await self._page(conn, session_id, _DISPLAY_NEWEST, [2**62, 2**62], display_budget)
                read.display.messages.reverse()  # read newest first, shown oldest first
            if context_budget:
                read.context = await self._page(conn, session_id, _CONTEXT_FROM, [context_offset], context_budget)
        return read

    @staticmethod
    async def _page(conn: asyncpg.Connection, session_id: uuid.UUID, sizes_sql: str, params: list[Any],
                    budget: int, max_rows: int | None = None) -> Page:
        """The rows `sizes_sql` lists (seq and bytes, in page order), at most `max_rows` and as many
        as fit `budget`. Sizes come first, so rows past the budget are never read."""
        sizes = await conn.fetch(sizes_sql, session_id, *params)
        taken = rows_within([r["bytes"] for r in sizes[:max_rows]], budget)
        seqs = [r["seq"] for r in sizes[:taken]]
        rows = await conn.fetch(_BOTH_TABLES.format(where="seq = ANY($2::bigint[])"), session_id, seqs)
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
    ) -> tuple[list[asyncpg.Record], int]:
        params: list[Any] = []
        where = [self._visible(identity, params)]
        if profile_id:
            params.append(profile_id)
            where.append(f"s.profile_id = ${len(params)}")
        source = "sessions s"
        if query:
            params.append(like_pattern(query))
            p = f"${len(params)}"
            # The matching ids are collected once, each branch on its own trigram index, and the
            # page and its total come from one pass (no second search for count(*)).
            source = (
                f"(SELECT id FROM sessions WHERE name ILIKE {p}"
                f" UNION SELECT session_id FROM session_messages WHERE is_display AND content ILIKE {p}"
                f" UNION SELECT session_id FROM session_messages_archive WHERE is_display AND content ILIKE {p})"
                " matched JOIN sessions s ON s.id = matched.id"
            )
        where_sql = " AND ".join(where)
        direction = "DESC" if descending else "ASC"
        order = f"s.pinned DESC, {_SORT_COLUMNS[sort_by]} {direction}, s.id"
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
        """Display indices where `query` appears, per session, in one aggregate query."""
        params: list[Any] = [session_ids]
        visible = self._visible(identity, params)
        params.append(like_pattern(query))
        rows = await self.pool.fetch(
            f"""
            WITH allowed AS (SELECT s.id FROM sessions s WHERE s.id = ANY($1) AND {visible}),
            hits AS (
                -- the matching rows first, where the trigram index applies
                SELECT session_id, seq, content FROM session_messages
                 WHERE session_id = ANY($1) AND is_display AND content ILIKE ${len(params)}
                UNION ALL
                SELECT session_id, seq, content FROM session_messages_archive
                 WHERE session_id = ANY($1) AND is_display AND content ILIKE ${len(params)}
            ),
            hit_sessions AS (
                SELECT DISTINCT session_id FROM hits WHERE session_id IN (SELECT id FROM allowed)
            ),
            numbered AS (
                -- display positions, only for the sessions that have a hit
                SELECT session_id, seq, row_number() OVER (PARTITION BY session_id ORDER BY seq) - 1 AS idx
                  FROM (SELECT session_id, seq FROM session_messages
                         WHERE session_id = ANY(ARRAY(SELECT session_id FROM hit_sessions)) AND is_display
                        UNION ALL
                        SELECT session_id, seq FROM session_messages_archive
                         WHERE session_id = ANY(ARRAY(SELECT session_id FROM hit_sessions)) AND is_display) d
            )
            SELECT h.session_id, array_agg(n.idx ORDER BY n.idx) AS indices,
                   (array_agg(h.content ORDER BY n.idx))[1] AS first_content
              FROM hits h JOIN numbered n USING (session_id, seq)
             GROUP BY h.session_id
            """,
            *params,
        )
        return [(str(r["session_id"]), list(r["indices"]), snippet_around(r["first_content"], query)) for r in rows]

    async def history_page(
        self, identity: Identity | None, session_id: uuid.UUID, before_seq: int, limit: int, *, archive_only: bool,
        budget: int,
    ) -> Page:
        """Up to `limit` display (or archived) messages before `before_seq`, newest of them, oldest
        first, within `budget` bytes; `has_more` when older ones remain."""
        async with self.pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            if identity is not None:
                await self._readable(conn, session_id, identity)
            before = before_seq if before_seq > 0 else 2**62
            page = await self._page(conn, session_id, _ARCHIVED_NEWEST if archive_only else _DISPLAY_NEWEST,
                                    [before, limit + 1], budget, max_rows=limit)
        page.messages.reverse()
        return page

    # -- writes ----------------------------------------------------------------------------
    async def append_messages(
        self,
        identity: Identity,
        session_id: uuid.UUID,
        messages: Sequence[common_pb2.Message],
        expected_revision: int | None,
        idempotency_key: str = "",
    ) -> AppendResult:
        now = datetime.now(timezone.utc)
        async with self.pool.acquire() as conn, conn.transaction():
            # The key is looked up before the revision check: the first attempt moved the revision,
            # and its retry must get that attempt's answer, not a conflict.
            locked = await self._lock_session(conn, session_id, identity, None)
            if idempotency_key:
                applied = await conn.fetchrow(
                    "SELECT seqs, revision FROM applied_appends WHERE session_id = $1 AND key = $2",
                    session_id, idempotency_key)
                if applied is not None:
                    return AppendResult(seqs=list(applied["seqs"]), revision=applied["revision"], archived=0)
            _check_revision(session_id, locked["revision"], expected_revision)
            await self._check_storage(conn, locked["owner"], sum(m.ByteSize() for m in messages))
            first = locked["next_seq"]
            seqs = list(range(first, first + len(messages)))
            rows = [convert.message_row(session_id, seq, m, now) for seq, m in zip(seqs, messages)]
            await conn.executemany(_INSERT_SQL, rows)
            displayed = sum(1 for r in rows if r[12])
            preview = next((m.content for m in messages if m.role == "user" and m.content), "")[:PREVIEW_CHARS]
            updated = await conn.fetchrow(
                f"""
                UPDATE sessions SET revision = revision + 1, next_seq = $2, last_active = $3,
                       display_count = display_count + $4, hot_count = hot_count + $5,
                       hot_bytes = hot_bytes + added.bytes, message_bytes = message_bytes + added.bytes,
                       preview = CASE WHEN preview = '' THEN $7 ELSE preview END
                  FROM (SELECT {new_rows_bytes("$6")} AS bytes) added
                 WHERE id = $1 RETURNING revision, hot_count, hot_bytes
                """,
                session_id, first + len(messages), now, displayed, len(messages), first, preview,
            )
            archived = 0
            if self._over_hot_window(updated["hot_count"], updated["hot_bytes"]):
                archived = await self._archive_overflow(conn, session_id)
            if idempotency_key:
                await conn.execute(_REMEMBER_APPEND_SQL, session_id, idempotency_key, seqs, updated["revision"], now,
                                   APPEND_KEY_DAYS)
        return AppendResult(seqs=seqs, revision=updated["revision"], archived=archived)

    async def update_session(self, identity: Identity, session_id: uuid.UUID, changes: dict[str, Any],
                             expected_revision: int | None) -> asyncpg.Record:
        async with self.pool.acquire() as conn, conn.transaction():
            await self._lock_session(conn, session_id, identity, expected_revision)
            current = await conn.fetchrow("SELECT * FROM sessions WHERE id = $1", session_id)
            sets: dict[str, Any] = {}
            for key in ("name", "pinned", "profile_id", "context_token_count", "provider", "model"):
                if key in changes:
                    sets[key] = changes[key]
            if "metadata" in changes:
                merged = dict(current["metadata"])
                for key, value in changes["metadata"].items():
                    if value is None:
                        merged.pop(key, None)
                    else:
                        merged[key] = value
                sets["metadata"] = merged
            if "external_refs" in changes:
                sets["external_refs"] = changes["external_refs"](current["external_refs"])
            if changes.get("untrusted_ingested"):
                sets["untrusted_ingested"] = True
            if changes.get("episode_untrusted"):
                sets["episode_untrusted"] = True
            if "planning_log" in changes:
                sets["planning_logs"] = (list(current["planning_logs"]) + [changes["planning_log"]])[-PLANNING_LOG_CAP:]
            columns = list(sets)
            assignments = ", ".join(f"{c} = ${i + 2}" for i, c in enumerate(columns))
            return await conn.fetchrow(
                f"UPDATE sessions SET {assignments}{',' if assignments else ''} revision = revision + 1"
                " WHERE id = $1 RETURNING *",
                session_id, *[sets[c] for c in columns],
            )

    async def set_context_flag(self, identity: Identity, session_id: uuid.UUID, seqs: list[int], is_context: bool,
                               expected_revision: int | None) -> tuple[int, int]:
        async with self.pool.acquire() as conn, conn.transaction():
            await self._lock_session(conn, session_id, identity, expected_revision)
            updated = await self._set_flag(conn, session_id, seqs, is_context)
            revision = await self._bump(conn, session_id)
        return updated, revision

    @staticmethod
    async def _set_flag(conn: asyncpg.Connection, session_id: uuid.UUID, seqs: list[int], is_context: bool) -> int:
        # Deliberately no filter on is_display: context-only rows (older summaries) must flip too.
        total = 0
        for table in ("session_messages", "session_messages_archive"):
            status = await conn.execute(
                f"UPDATE {table} SET is_context = $3 WHERE session_id = $1 AND seq = ANY($2::bigint[])",
                session_id, seqs, is_context,
            )
            total += int(status.split()[-1])
        return total

    @staticmethod
    async def _bump(conn: asyncpg.Connection, session_id: uuid.UUID) -> int:
        return await conn.fetchval(
            "UPDATE sessions SET revision = revision + 1, last_active = now() WHERE id = $1 RETURNING revision",
            session_id,
        )

    async def commit_compression(
        self,
        identity: Identity,
        session_id: uuid.UUID,
        *,
        demote_seqs: list[int],
        summary: common_pb2.Message | None,
        marker: common_pb2.Message | None,
        context_token_count: int,
        chunks: Sequence[common_pb2.RawChunk],
        expected_revision: int | None,
        archive: bool,
        replacements: Sequence[common_pb2.Message] = (),
    ) -> dict[str, int]:
        now = datetime.now(timezone.utc)
        async with self.pool.acquire() as conn, conn.transaction():
            locked = await self._lock_session(conn, session_id, identity, expected_revision)
            await self._set_flag(conn, session_id, demote_seqs, False)
            next_seq = locked["next_seq"]
            result = {"summary_seq": 0, "marker_seq": 0}
            added = []
            if summary is not None:
                summary.is_summary, summary.is_context, summary.is_display = True, True, False
                summary.explicit_flags = True
                result["summary_seq"] = next_seq
                added.append((next_seq, summary))
                next_seq += 1
            for replacement in replacements:  # each stands where the row it replaces stood (its `replaces`)
                replacement.is_context, replacement.is_display, replacement.explicit_flags = True, False, True
                added.append((next_seq, replacement))
                next_seq += 1
            if marker is not None:
                marker.is_compression, marker.is_context, marker.is_display = True, False, True
                marker.explicit_flags = True
                result["marker_seq"] = next_seq
                added.append((next_seq, marker))
                next_seq += 1
            await conn.executemany(_INSERT_SQL, [convert.message_row(session_id, s, m, now) for s, m in added])
            result["chunks_indexed"] = await self._insert_chunks(conn, session_id, chunks)
            updated = await conn.fetchrow(
                f"""
                UPDATE sessions SET revision = revision + 1, next_seq = $2, last_active = $3,
                       context_token_count = $4, display_count = display_count + $5,
                       hot_count = hot_count + $6, hot_bytes = hot_bytes + added.bytes,
                       message_bytes = message_bytes + added.bytes
                  FROM (SELECT {new_rows_bytes("$7")} AS bytes) added
                 WHERE id = $1 RETURNING revision, hot_count, hot_bytes
                """,
                session_id, next_seq, now, context_token_count, 1 if marker is not None else 0,
                len(added), locked["next_seq"],
            )
            result["revision"] = updated["revision"]
            # The context just shrank: the last real prompt size no longer describes it.
            await conn.execute("DELETE FROM session_baselines WHERE session_id = $1", session_id)
            result["archived"] = 0
            if archive and self._over_hot_window(updated["hot_count"], updated["hot_bytes"]):
                result["archived"] = await self._archive_overflow(conn, session_id)
        return result

    def _over_hot_window(self, count: int, size: int) -> bool:
        return count > self.hot_window.max_messages or size > self.hot_window.max_bytes

    async def _archive_overflow(self, conn: asyncpg.Connection, session_id: uuid.UUID) -> int:
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
    async def _move_to_archive(
        conn: asyncpg.Connection, session_id: uuid.UUID, below_seq: int, protected: list[int]
    ) -> int:
        status = await conn.execute(
            f"""
            WITH moved AS (
                DELETE FROM session_messages
                 WHERE session_id = $1 AND seq < $2 AND NOT (seq = ANY($3::bigint[]))
                RETURNING {INSERT_COLUMNS}, token_digest
            )
            INSERT INTO session_messages_archive ({INSERT_COLUMNS}, token_digest)
            SELECT {INSERT_COLUMNS}, token_digest FROM moved
            """,
            session_id, below_seq, protected,
        )
        moved = int(status.split()[-1])
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
            await self._lock_session(conn, session_id, identity, None)
            rows = await conn.fetch(
                "SELECT seq, role, is_summary FROM session_messages WHERE session_id = $1 AND seq < $2 ORDER BY seq",
                session_id, below_seq,
            )
            first_rows = await conn.fetch(
                "SELECT seq, role, is_summary FROM session_messages WHERE session_id = $1 AND role IN ('system', 'user')"
                " ORDER BY seq", session_id,
            )
            protected = _protected_seqs(first_rows)
            moved = await self._move_to_archive(conn, session_id, below_seq, sorted(protected)) if rows else 0
            if moved:
                await self._bump(conn, session_id)
        return moved

    async def trim_session(self, identity: Identity, session_id: uuid.UUID, keep: int) -> tuple[int, int]:
        """Keep the newest `keep` messages, the first system message counting as one of them."""
        async with self.pool.acquire() as conn, conn.transaction():
            await self._lock_session(conn, session_id, identity, None)
            rows = await conn.fetch(
                "SELECT seq, role FROM session_messages WHERE session_id = $1"
                " UNION ALL SELECT seq, role FROM session_messages_archive WHERE session_id = $1 ORDER BY seq",
                session_id,
            )
            before = len(rows)
            first_system = next((r["seq"] for r in rows if r["role"] == "system"), None)
            kept = set()
            if first_system is not None:
                kept.add(first_system)
            for row in reversed(rows):
                if len(kept) >= keep:
                    break
                kept.add(row["seq"])
            # A tool result whose call was cut would be an orphan no chat template accepts: it goes too.
            for row in rows:
                if row["seq"] == first_system or row["seq"] not in kept:
                    continue
                if row["role"] != "tool":
                    break
                kept.discard(row["seq"])
            drop = [r["seq"] for r in rows if r["seq"] not in kept]
            if drop:
                for table in ("session_messages", "session_messages_archive"):
                    await conn.execute(
                        f"DELETE FROM {table} WHERE session_id = $1 AND seq = ANY($2::bigint[])", session_id, drop
                    )
                await self._recount(conn, session_id)
                # The last real prompt size described rows that are gone.
                await conn.execute("DELETE FROM session_baselines WHERE session_id = $1", session_id)
        self._forget_usage()
        return before, before - len(drop)

    @staticmethod
    async def _recount(conn: asyncpg.Connection, session_id: uuid.UUID) -> None:
        await conn.execute(
            f"""
            UPDATE sessions s SET revision = revision + 1, last_active = now(), context_token_count = 0,
                   display_count = (SELECT count(*) FROM ({_BOTH_TABLES.format(where="is_display")}) d),
                   hot_count = (SELECT count(*) FROM session_messages WHERE session_id = $1),
                   hot_bytes = (SELECT coalesce(sum({ROW_BYTES}), 0)
                                  FROM session_messages WHERE session_id = $1),
                   message_bytes = (SELECT coalesce(sum({ROW_BYTES}), 0) FROM (
                        SELECT content, thinking, tool_calls, images FROM session_messages WHERE session_id = $1
                        UNION ALL
                        SELECT content, thinking, tool_calls, images FROM session_messages_archive
                         WHERE session_id = $1) m),
                   preview = coalesce((SELECT left(content, {PREVIEW_CHARS}) FROM (
                        {_BOTH_TABLES.format(where="role = 'user' AND content <> ''")}) u ORDER BY seq LIMIT 1), '')
             WHERE id = $1
            """,
            session_id,
        )

    async def delete_session(self, identity: Identity, session_id: uuid.UUID) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            await self._lock_session(conn, session_id, identity, None)
            # Messages, archive, chunks, shares and baselines go with it (ON DELETE CASCADE).
            await conn.execute("DELETE FROM sessions WHERE id = $1", session_id)
        self._forget_usage()

    async def cleanup_sessions(self, identity: Identity, older_than_days: int) -> list[str]:
        params: list[Any] = [older_than_days]
        visible = self._visible(identity, params)
        rows = await self.pool.fetch(
            f"DELETE FROM sessions s WHERE s.last_active < now() - make_interval(days => $1) AND {visible}"
            " RETURNING s.id"
            if older_than_days > 0
            else f"DELETE FROM sessions s WHERE ($1::int = 0) AND {visible} RETURNING s.id",
            *params,
        )
        self._forget_usage()
        return [str(r["id"]) for r in rows]

    async def existing_ids(self, ids: list[str]) -> set[str]:
        rows = await self.pool.fetch("SELECT id FROM sessions WHERE id = ANY($1::uuid[])", ids)
        return {str(r["id"]) for r in rows}

    # -- shares ----------------------------------------------------------------------------
    async def create_share(self, identity: Identity, session_id: uuid.UUID) -> tuple[str, datetime]:
        """The session's one link, the same on every call (recomputed from the key and the row's
        nonce). A row from before tokens were derived has no nonce: it gets one, so a new link,
        and its old link keeps working through the hash kept aside."""
        async with self.pool.acquire() as conn, conn.transaction():
            row = await self._lock_session(conn, session_id, identity, None)
            if row["next_seq"] <= 1:
                raise FailedPrecondition(f"session {session_id} has no messages yet; share it after the first one")
            existing = await conn.fetchrow("SELECT nonce, created_at FROM session_shares WHERE session_id = $1",
                                           session_id)
            if existing is not None and existing["nonce"] is not None:
                return share_links.share_token(self.share_key, session_id, existing["nonce"]), existing["created_at"]
            nonce = share_links.new_nonce()
            token = share_links.share_token(self.share_key, session_id, nonce)
            created_at = await conn.fetchval(
                "INSERT INTO session_shares (session_id, nonce, token_hash) VALUES ($1, $2, $3)"
                " ON CONFLICT (session_id) DO UPDATE SET nonce = $2, token_hash = $3,"
                "     legacy_token_hash = session_shares.token_hash"
                " RETURNING created_at",
                session_id, nonce, share_links.token_hash(token),
            )
            return token, created_at

    async def shared_session(self, token: str) -> asyncpg.Record:
        # Looked up by hash; then the token must be the one this server's key makes for the row
        # (compared in constant time), so a link outlives neither its session nor the key.
        digest = share_links.token_hash(token)
        row = await self.pool.fetchrow(
            "SELECT sh.nonce, sh.token_hash = $1 AS current, s.id, s.name, s.profile_id, s.created_at, s.last_active"
            " FROM session_shares sh JOIN sessions s ON s.id = sh.session_id"
            " WHERE sh.token_hash = $1 OR sh.legacy_token_hash = $1",
            digest,
        )
        if row is None or not _share_matches(row, token, self.share_key):
            raise NotFound("share link not found (the session may have been deleted)")
        return row

    # -- raw chunks ------------------------------------------------------------------------
    @staticmethod
    async def _insert_chunks(conn: asyncpg.Connection, session_id: uuid.UUID,
                             chunks: Sequence[common_pb2.RawChunk]) -> int:
        indexed = 0
        for chunk in chunks:
            content_hash = chunk.content_hash or hashlib.sha256(chunk.content.encode()).hexdigest()
            status = await conn.execute(
                "INSERT INTO memory_chunks (session_id, content, content_hash, first_seq, last_seq, first_at, last_at,"
                " breadcrumbs) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (session_id, content_hash) DO NOTHING",
                session_id, chunk.content, content_hash, chunk.turn_range.first, chunk.turn_range.last,
                convert.to_datetime(chunk.first_at), convert.to_datetime(chunk.last_at), list(chunk.breadcrumbs),
            )
            indexed += int(status.split()[-1])
        return indexed

    async def index_chunks(self, identity: Identity, session_id: uuid.UUID,
                           chunks: Sequence[common_pb2.RawChunk]) -> int:
        async with self.pool.acquire() as conn, conn.transaction():
            await self._readable(conn, session_id, identity)
            return await self._insert_chunks(conn, session_id, chunks)

    async def search_memory(self, identity: Identity, session_id: uuid.UUID, query: str, limit: int,
                            min_similarity: float) -> list[dict[str, Any]]:
        """Chunks ranked by how much of the query they hold; a verbatim hit (an id, a path) first.

        A full-text index picks the candidates (any query word), so the cost does not grow with
        the session's history; the final score is computed over those few."""
        async with self.pool.acquire() as conn:
            await self._readable(conn, session_id, identity)
            rows = await conn.fetch(
                """
                WITH q AS (SELECT replace(plainto_tsquery('simple', $2)::text, ' & ', ' | ')::tsquery AS tsq)
                SELECT c.id, c.session_id, c.content, c.content_hash, c.first_seq, c.last_seq, c.first_at,
                       c.last_at, c.breadcrumbs
                  FROM memory_chunks c, q
                 WHERE c.session_id = $1 AND (c.tsv @@ q.tsq OR c.content ILIKE $3 OR $2 = ANY(c.breadcrumbs))
                 ORDER BY (c.content ~* $5) DESC, (c.content ILIKE $3) DESC, ts_rank_cd(c.tsv, q.tsq) DESC, c.id
                 LIMIT $4
                """,
                session_id, query[:MEMORY_QUERY_CHARS], like_pattern(query), limit * MEMORY_CANDIDATES_PER_RESULT,
                whole_token_pattern(query),
            )
        scored = [(memory_score(query, row["content"], row["breadcrumbs"]), row) for row in rows]
        scored = [(score, row) for score, row in scored if score > 0 and score >= min_similarity]
        scored.sort(key=lambda pair: (-pair[0], pair[1]["id"]))
        return [dict(row) | {"score": score} for score, row in scored[:limit]]

    # -- calibration and baselines -----------------------------------------------------------
    async def record_observation(self, model: str, chars: int, tokens: int, exact: dict[str, int] | None = None) -> None:
        exact = exact or {}
        await self.pool.execute(
            f"INSERT INTO calibration_observations (model, chars, tokens, {', '.join(EXACT_FIELDS)})"
            f" VALUES ($1, $2, $3, {', '.join(f'${i}' for i in range(4, 4 + len(EXACT_FIELDS)))})",
            model, chars, tokens, *(exact.get(name, 0) for name in EXACT_FIELDS),
        )

    async def list_observations(self, model: str, limit: int = CHAR_OBSERVATIONS,
                                exact_limit: int = EXACT_OBSERVATIONS, conn=None) -> list[asyncpg.Record]:
        """The newest observations of both kinds (chars for the calibrated line, exact shapes for
        the template fit), newest first."""
        return await (conn or self.pool).fetch(_OBSERVATIONS_SQL, model, limit, exact_limit)

    async def set_baseline(self, identity: Identity, session_id: uuid.UUID, baseline: dict[str, Any] | None,
                           only_truncated_flag: bool) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            await self._readable(conn, session_id, identity)
            if baseline is None:
                await conn.execute("DELETE FROM session_baselines WHERE session_id = $1", session_id)
            elif only_truncated_flag:
                # A session may be flagged before it ever had an honest baseline (tokens 0 = none).
                await conn.execute(
                    """
                    INSERT INTO session_baselines (session_id, tokens, through_seq, context_truncated)
                    VALUES ($1, 0, 0, $2)
                    ON CONFLICT (session_id) DO UPDATE SET context_truncated = $2
                    """,
                    session_id, baseline["context_truncated"],
                )
            else:
                # The truncated flag survives a later honest baseline: only the post-turn pass
                # (or a compression, which deletes the row) consumes it.
                await conn.execute(
                    """
                    INSERT INTO session_baselines (session_id, tokens, through_seq, model, context_truncated)
                    VALUES ($1, $2, $3, $4, $5)
                    ON CONFLICT (session_id) DO UPDATE SET tokens = $2, through_seq = $3, model = $4,
                        context_truncated = session_baselines.context_truncated OR $5, recorded_at = now()
                    """,
                    session_id, baseline["tokens"], baseline["through_seq"], baseline["model"],
                    baseline["context_truncated"],
                )

    async def get_baseline(self, identity: Identity, session_id: uuid.UUID, model: str = "", token_digest: str = "",
                           view_budget: int = 0) -> tuple[dict | None, list[asyncpg.Record], dict | None]:
        """The session's baseline and, when `model` is given, its newest observations; with a
        `token_digest`, the context's size from stored counts and the rows not counted yet. One
        round trip when every context row is counted (the usual case before a model call)."""
        async with self.pool.acquire() as conn:
            if token_digest:
                cap = min(view_budget + CUT_SEAM_TOKENS, 2**31 - 1) if view_budget > 0 else 2**31 - 1
                row = await conn.fetchrow(_COUNTED_CONTEXT_SQL, session_id, token_digest, cap)
            else:
                row = await conn.fetchrow(_SESSION_BASELINE_SQL, session_id)
            if row is None:
                raise NotFound(f"session {session_id} not found")
            identity.require_access(row["owner"], str(session_id))
            observations = await self.list_observations(model, conn=conn) if model else []
            tokens = None
            if token_digest:
                uncounted = []
                if row["uncounted_messages"]:
                    # The sum and the rows it left out, from one snapshot: a count written between
                    # two reads would leave its row out of both.
                    async with conn.transaction(isolation="repeatable_read", readonly=True):
                        row = await conn.fetchrow(_COUNTED_CONTEXT_SQL, session_id, token_digest, cap)
                        uncounted = await conn.fetch(_UNCOUNTED_CONTEXT_SQL, session_id, token_digest)
                tokens = {name: row[name] for name in
                          ("counted_tokens", "counted_messages", "counted_tool_results", "counted_tool_calls")}
                tokens |= {"uncounted": [convert.message_from_row(r, archived=r["archived"]) for r in uncounted],
                           "revision": row["revision"]}
        baseline = ({c: row[f"baseline_{c}"] for c in _BASELINE_COLUMNS} if row["has_baseline"] else None)
        return baseline, observations, tokens

    async def set_token_counts(self, identity: Identity, session_id: uuid.UUID, token_digest: str,
                               seqs: Sequence[int], tokens: Sequence[int], content_md5: Sequence[str]) -> int:
        """Store counts made by one tokenizer, each only on the row whose content it was made from
        (its md5): a size check counts what its caller sent, and a caller without access to a row
        could otherwise put any count on it. Counts are derived data, not content: the revision
        stays, so a count written beside a turn never makes that turn's next write ABORTED."""
        async with self.pool.acquire() as conn, conn.transaction():
            await self._readable(conn, session_id, identity)
            updated = 0
            for table in ("session_messages", "session_messages_archive"):
                status = await conn.execute(
                    f"""
                    UPDATE {table} m SET token_count = c.tokens, token_digest = $2
                      FROM unnest($3::bigint[], $4::int[], $5::text[]) AS c(seq, tokens, md5)
                     WHERE m.session_id = $1 AND m.seq = c.seq AND md5(m.content) = c.md5
                    """,
                    session_id, token_digest, list(seqs), list(tokens), list(content_md5),
                )
                updated += int(status.split()[-1])
        return updated


def whole_token_pattern(query: str) -> str:
    """A regex (Python's and PostgreSQL's alike) matching the query as a whole token: marker-1,
    not the marker-1 inside marker-10."""
    return rf"(^|[^[:alnum:]_-]){re.escape(query)}($|[^[:alnum:]_-])"


def memory_score(query: str, content: str, breadcrumbs: Sequence[str]) -> float:
    """The share of the query's words a chunk holds (0–1), plus 1 when it holds the query as a
    whole token (0.5 when only inside a longer one)."""
    text = (content + " " + " ".join(breadcrumbs)).lower()
    q = query.lower()
    words = {w for w in re.findall(r"[\w./:-]+", q) if len(w) > 1}
    coverage = sum(1 for w in words if w in text) / len(words) if words else 0.0
    if q not in text:
        return coverage
    whole = re.search(rf"(?<![\w-]){re.escape(q)}(?![\w-])", text) is not None
    return (1.0 if whole else 0.5) + coverage


def _share_matches(row: asyncpg.Record, token: str, key: bytes) -> bool:
    """A link made from the key and the row's nonce, or (rows from before keys) one whose stored
    hash matched: that hash was the only record of it."""
    if not row["current"] or row["nonce"] is None:
        return True
    expected = share_links.share_token(key, row["id"], row["nonce"])
    return hmac.compare_digest(expected.encode(), token.encode())


def _protected_seqs(rows: Sequence[asyncpg.Record]) -> set[int]:
    """The first system message and the first user message (the original task) always stay hot."""
    protected = set()
    system = next((r["seq"] for r in rows if r["role"] == "system"), None)
    user = next((r["seq"] for r in rows if r["role"] == "user" and not r["is_summary"]), None)
    for seq in (system, user):
        if seq is not None:
            protected.add(seq)
    return protected


def parse_session_id(value: str, field: str = "session_id") -> uuid.UUID:
    if not value:
        raise InvalidArgument(field, "required")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidArgument(field, f"{value!r} is not a session id (a UUID)") from None

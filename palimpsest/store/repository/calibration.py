"""Calibration: observations of real prompt sizes per model, and each session's baseline (the real
prompt size of its last model call), read together by the Compressor's size check.

The size check also needs the context's size from stored token counts; that sum reads the message
tables in the same round trip as the baseline, so its SQL lives here with the baseline's.
"""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg

from palimpsest.shared.auth import Identity
from palimpsest.shared.errors import NotFound
from palimpsest.store import convert
from palimpsest.store.db import Connection
from palimpsest.store.repository.access import readable
from palimpsest.store.repository.message_rows import BOTH_TABLES
from palimpsest.store.repository.token_counts import cut_from_json
from palimpsest.v1 import common_pb2

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
           {", ".join(f"b.{c} AS baseline_{c}" for c in _BASELINE_COLUMNS)}{{more}}
      FROM sessions s LEFT JOIN session_baselines b ON b.session_id = s.id{{join}}
     WHERE s.id = $1
"""
_SESSION_BASELINE_SQL = _SESSION_AND_BASELINE.format(more="", join="")
_COUNTED_CONTEXT_SQL = _SESSION_AND_BASELINE.format(
    more=", c.*",
    join=f"""
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
                 WHERE session_id = $1 AND is_context) ctx) c""",
)
_UNCOUNTED_CONTEXT_SQL = (
    f"SELECT * FROM ({BOTH_TABLES.format(where=f'is_context AND NOT ({_COUNTED})')}) rows ORDER BY seq"
)
_CONTEXT_COUNTS_SQL = f"""
    SELECT seq, token_count, md5(content) AS content_md5, token_cut FROM session_messages
     WHERE session_id = $1 AND is_context AND {_COUNTED}
    UNION ALL
    SELECT seq, token_count, md5(content) AS content_md5, token_cut FROM session_messages_archive
     WHERE session_id = $1 AND is_context AND {_COUNTED}
"""
_OBSERVATION_COLUMNS = f"id, model, chars, tokens, observed_at, {', '.join(EXACT_FIELDS)}"
_OBSERVATIONS_SQL = f"""
    (SELECT {_OBSERVATION_COLUMNS} FROM calibration_observations WHERE model = $1 AND content_tokens = 0
     ORDER BY id DESC LIMIT $2)
    UNION ALL
    (SELECT {_OBSERVATION_COLUMNS} FROM calibration_observations WHERE model = $1 AND content_tokens > 0
     ORDER BY id DESC LIMIT $3)
    ORDER BY id DESC
"""


async def forget_baseline(conn: Connection, session_id: uuid.UUID) -> None:
    """The context changed under the baseline (a compression, a trim): it no longer describes it."""
    await conn.execute("DELETE FROM session_baselines WHERE session_id = $1", session_id)


async def insert_observation(
    conn: Connection | asyncpg.Pool, model: str, chars: int, tokens: int, exact: dict[str, int] | None = None
) -> None:
    exact = exact or {}
    await conn.execute(
        f"INSERT INTO calibration_observations (model, chars, tokens, {', '.join(EXACT_FIELDS)})"
        f" VALUES ($1, $2, $3, {', '.join(f'${i}' for i in range(4, 4 + len(EXACT_FIELDS)))})",
        model,
        chars,
        tokens,
        *(exact.get(name, 0) for name in EXACT_FIELDS),
    )


async def write_baseline(
    conn: Connection, session_id: uuid.UUID, baseline: dict[str, Any] | None, only_truncated_flag: bool
) -> bool:
    """The session's baseline: cleared (None), only its truncated flag set, or a full write.
    Returns the session's truncated flag as it is now."""
    if baseline is None:
        await forget_baseline(conn, session_id)
        return False
    if only_truncated_flag:
        # A session may be flagged before it ever had an honest baseline (tokens 0 = none).
        return bool(
            await conn.fetchval(
                """
            INSERT INTO session_baselines (session_id, tokens, through_seq, context_truncated)
            VALUES ($1, 0, 0, $2)
            ON CONFLICT (session_id) DO UPDATE SET context_truncated = $2
            RETURNING context_truncated
            """,
                session_id,
                baseline["context_truncated"],
            )
        )
    # The truncated flag survives a later honest baseline: only the post-turn pass (or a
    # compression, which deletes the row) consumes it.
    return bool(
        await conn.fetchval(
            """
        INSERT INTO session_baselines (session_id, tokens, through_seq, model, context_truncated)
        VALUES ($1, $2, $3, $4, $5)
        ON CONFLICT (session_id) DO UPDATE SET tokens = $2, through_seq = $3, model = $4,
            context_truncated = session_baselines.context_truncated OR $5, recorded_at = now()
        RETURNING context_truncated
        """,
            session_id,
            baseline["tokens"],
            baseline["through_seq"],
            baseline["model"],
            baseline["context_truncated"],
        )
    )


class Calibration:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def record_observation(
        self, model: str, chars: int, tokens: int, exact: dict[str, int] | None = None
    ) -> None:
        await insert_observation(self.pool, model, chars, tokens, exact)

    async def list_observations(
        self,
        model: str,
        limit: int = CHAR_OBSERVATIONS,
        exact_limit: int = EXACT_OBSERVATIONS,
        conn: Connection | None = None,
    ) -> list[asyncpg.Record]:
        """The newest observations of both kinds (chars for the calibrated line, exact shapes for
        the template fit), newest first."""
        return await (conn or self.pool).fetch(_OBSERVATIONS_SQL, model, limit, exact_limit)

    async def set_baseline(
        self, identity: Identity, session_id: uuid.UUID, baseline: dict[str, Any] | None, only_truncated_flag: bool
    ) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            await readable(conn, session_id, identity)
            await write_baseline(conn, session_id, baseline, only_truncated_flag)

    async def get_baseline(
        self,
        identity: Identity,
        session_id: uuid.UUID,
        model: str = "",
        token_digest: str = "",
        view_budget: int = 0,
        with_counts: bool = False,
    ) -> tuple[dict | None, list[asyncpg.Record], dict | None]:
        """The session's baseline and, when `model` is given, its newest observations; with a
        `token_digest`, the context's size from stored counts and the rows not counted yet (and,
        `with_counts`, each counted row's count instead of the uncounted rows). One round trip when every context row is counted
        (the usual case before a model call)."""
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
                if row["uncounted_messages"] and not with_counts:  # with counts, the caller has the rows
                    # The sum and the rows it left out, from one snapshot: a count written between
                    # two reads would leave its row out of both.
                    async with conn.transaction(isolation="repeatable_read", readonly=True):
                        row = await conn.fetchrow(_COUNTED_CONTEXT_SQL, session_id, token_digest, cap)
                        uncounted = await conn.fetch(_UNCOUNTED_CONTEXT_SQL, session_id, token_digest)
                    if row is None:  # deleted since the first read
                        raise NotFound(f"session {session_id} not found")
                tokens = {
                    name: row[name]
                    for name in ("counted_tokens", "counted_messages", "counted_tool_results", "counted_tool_calls")
                }
                tokens |= {
                    "uncounted": [convert.message_from_row(r, archived=r["archived"]) for r in uncounted],
                    "revision": row["revision"],
                }
                if with_counts:
                    tokens["counts"] = [
                        common_pb2.TokenCount(
                            seq=r["seq"],
                            tokens=r["token_count"],
                            content_md5=r["content_md5"],
                            cut=cut_from_json(r["token_cut"], token_digest),
                        )
                        for r in await conn.fetch(_CONTEXT_COUNTS_SQL, session_id, token_digest)
                    ]
        baseline = {c: row[f"baseline_{c}"] for c in _BASELINE_COLUMNS} if row["has_baseline"] else None
        return baseline, observations, tokens

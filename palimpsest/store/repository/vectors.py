"""Memory vectors: the embeddings of memory chunks, one per (chunk, embedding model), on pgvector.

The tables exist only where migration 0011 could create pgvector (`available`); nothing here is
called otherwise. Vectors travel as pgvector's text form ('[0.1,0.2]'), so no client-side codec
is needed.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg

# A profile's embedding model that no search asked for in this long is dropped with its vectors.
PROFILE_SPACE_DAYS = 30

# The chunks of a space's sessions not embedded in it yet, newest first: what was just compressed
# away is what the next turns are likeliest to recall.
_PENDING_SQL = """
    SELECT c.id, c.session_id, c.content
      FROM memory_chunks c
     WHERE NOT EXISTS (SELECT 1 FROM memory_vectors v WHERE v.chunk_id = c.id AND v.model = $1)
       AND EXISTS (SELECT 1 FROM memory_vector_spaces s WHERE s.model = $1)  -- dropped meanwhile: none
     ORDER BY c.id DESC
     LIMIT $2
"""

# ON CONFLICT: another replica (or a retry) embedded the chunk meanwhile. The JOIN skips a chunk
# deleted (its session cleaned up) between reading and storing it; EXISTS, a space dropped
# meanwhile (the foreign key catches the last race, as an error the indexer retries after).
_STORE_SQL = """
    INSERT INTO memory_vectors (chunk_id, model, session_id, embedding)
    SELECT c.id, $1, c.session_id, v.embedding::vector
      FROM unnest($2::bigint[], $3::text[]) AS v(chunk_id, embedding)
      JOIN memory_chunks c ON c.id = v.chunk_id
     WHERE EXISTS (SELECT 1 FROM memory_vector_spaces s WHERE s.model = $1)
    ON CONFLICT (chunk_id, model) DO NOTHING
"""

# A session's chunks nearest the query in one space: an exact scan of the session's vectors
# (memory_vectors_session), cosine distance `<=>`. The dimension filter keeps a search that races a
# rebuild from comparing vectors of two sizes (pgvector would raise).
_NEAREST_SQL = """
    SELECT c.id, c.session_id, c.content, c.content_hash, c.first_seq, c.last_seq, c.first_at, c.last_at,
           c.breadcrumbs, n.similarity
      FROM (SELECT chunk_id, 1 - (embedding <=> $3::vector) AS similarity
              FROM memory_vectors
             WHERE session_id = $1 AND model = $2 AND vector_dims(embedding) = $4
             ORDER BY embedding <=> $3::vector, chunk_id
             LIMIT $5) n
      JOIN memory_chunks c ON c.id = n.chunk_id
     WHERE n.similarity >= $6
     ORDER BY n.similarity DESC, c.id
"""


# Summaries (hot or archived) without a vector in the space; keyed by (session, seq).
_PENDING_SUMMARIES_SQL = """
    SELECT m.session_id, m.seq, m.content
      FROM (SELECT session_id, seq, content FROM session_messages WHERE is_summary
            UNION ALL
            SELECT session_id, seq, content FROM session_messages_archive WHERE is_summary) m
     WHERE NOT EXISTS (SELECT 1 FROM summary_vectors v
                        WHERE v.session_id = m.session_id AND v.seq = m.seq AND v.model = $1)
       AND EXISTS (SELECT 1 FROM memory_vector_spaces s WHERE s.model = $1)
     ORDER BY m.session_id, m.seq
     LIMIT $2
"""

_STORE_SUMMARIES_SQL = """
    INSERT INTO summary_vectors (session_id, seq, model, embedding)
    SELECT v.session_id, v.seq, $1, v.embedding::vector
      FROM unnest($2::uuid[], $3::bigint[], $4::text[]) AS v(session_id, seq, embedding)
     WHERE EXISTS (SELECT 1 FROM memory_vector_spaces s WHERE s.model = $1)
       AND EXISTS (SELECT 1 FROM sessions WHERE id = v.session_id)
    ON CONFLICT (session_id, seq, model) DO NOTHING
"""

# ListSessions' meaning branch ($m model, $v the query's vector, $d its dimensions, $f the floor):
# each session one of whose summaries or messages is near the query, with its best similarity; the
# caller's visibility filter applies after, as to the lexical branches. An exact scan: a vector
# index would need one fixed dimension, and the space's is a setting (bench/store_search.py
# measures the scan at 10,000 sessions).
SESSIONS_NEAR_SQL = (
    "SELECT session_id, max(similarity) AS similarity FROM ("
    "SELECT session_id, 1 - (embedding <=> {v}::vector) AS similarity FROM summary_vectors"
    " WHERE model = {m} AND vector_dims(embedding) = {d}"
    " UNION ALL SELECT session_id, 1 - (embedding <=> {v}::vector) FROM message_vectors"
    " WHERE model = {m} AND vector_dims(embedding) = {d}) near"
    # The floor on each vector before grouping: grouped first (min distance, then HAVING), the
    # same scan took 1.0 s instead of 0.09 s over 100,000 vectors of 256 dimensions.
    " WHERE similarity >= {f} GROUP BY session_id"
)

# The sessions whose messages are not all embedded in the space yet ($1 the model, $2 at most this
# many sessions, and this many messages each) and quiet for $3 seconds (not in a turn), recently
# active first (likeliest to be searched
# for), with their embeddable messages past the mark: displayed user and assistant text. `last` is
# where the mark moves once these are stored (rows appended meanwhile are past it).
_PENDING_MESSAGES_SQL = """
    WITH due AS (
        SELECT s.id, coalesce(k.through_seq, 0) AS after, s.next_seq - 1 AS last, s.last_active
          FROM sessions s
          LEFT JOIN message_vector_marks k ON k.session_id = s.id AND k.model = $1
         WHERE s.next_seq - 1 > coalesce(k.through_seq, 0)
           AND s.last_active <= now() - make_interval(secs => $3)
           AND EXISTS (SELECT 1 FROM memory_vector_spaces WHERE model = $1)
         ORDER BY s.last_active DESC, s.id
         LIMIT $2
    )
    SELECT d.id AS session_id, d.last, m.seq, m.content
      FROM due d
      LEFT JOIN LATERAL (
          SELECT seq, content FROM (
              SELECT seq, content FROM session_messages
               WHERE session_id = d.id AND seq > d.after AND is_display AND role IN ('user', 'assistant')
                 AND content <> ''
              UNION ALL
              SELECT seq, content FROM session_messages_archive
               WHERE session_id = d.id AND seq > d.after AND is_display AND role IN ('user', 'assistant')
                 AND content <> '') rows
           ORDER BY seq LIMIT $2) m ON true
     ORDER BY d.last_active DESC, d.id, m.seq
"""

_STORE_MESSAGES_SQL = """
    INSERT INTO message_vectors (session_id, seq, model, embedding)
    SELECT v.session_id, v.seq, $1, v.embedding::vector
      FROM unnest($2::uuid[], $3::bigint[], $4::text[]) AS v(session_id, seq, embedding)
     WHERE EXISTS (SELECT 1 FROM memory_vector_spaces s WHERE s.model = $1)
       AND EXISTS (SELECT 1 FROM sessions WHERE id = v.session_id)
    ON CONFLICT (session_id, model, seq) DO NOTHING
"""

# GREATEST: a mark never moves back (another replica got further meanwhile).
_STORE_MARKS_SQL = """
    INSERT INTO message_vector_marks (session_id, model, through_seq)
    SELECT m.session_id, $1, m.through_seq
      FROM unnest($2::uuid[], $3::bigint[]) AS m(session_id, through_seq)
     WHERE EXISTS (SELECT 1 FROM memory_vector_spaces s WHERE s.model = $1)
       AND EXISTS (SELECT 1 FROM sessions WHERE id = m.session_id)
    ON CONFLICT (session_id, model) DO UPDATE
       SET through_seq = greatest(message_vector_marks.through_seq, EXCLUDED.through_seq)
"""


def vector_text(vector: Sequence[float]) -> str:
    """pgvector's input form."""
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


class MemoryVectors:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def available(self) -> bool:
        """Whether migration 0011 found pgvector (and so made the tables)."""
        return await self.pool.fetchval("SELECT to_regclass('memory_vectors') IS NOT NULL")

    async def keep_space(self, model: str, *, from_settings: bool) -> list[str]:
        """Record that the index is kept in `model`. For the settings' model, drop the spaces of
        settings models it replaced and of profile models long unsearched; returns what was dropped."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO memory_vector_spaces (model, from_settings) VALUES ($1, $2)"
                " ON CONFLICT (model) DO UPDATE SET searched_at = now(),"
                " from_settings = memory_vector_spaces.from_settings OR EXCLUDED.from_settings",
                model,
                from_settings,
            )
            if not from_settings:
                return []
            dropped = [
                r["model"]
                for r in await conn.fetch(
                    "DELETE FROM memory_vector_spaces WHERE model <> $1"
                    " AND (from_settings OR searched_at < now() - make_interval(days => $2)) RETURNING model",
                    model,
                    PROFILE_SPACE_DAYS,
                )
            ]
            return dropped  # their vectors went with them (ON DELETE CASCADE)

    async def spaces(self) -> list[str]:
        return [r["model"] for r in await self.pool.fetch("SELECT model FROM memory_vector_spaces ORDER BY model")]

    async def settle_dimensions(self, model: str, dimensions: int) -> bool:
        """Record the dimensions `model` answers with; when they differ from those recorded, drop
        the model's vectors of the old size (they are rebuilt by the indexer). True on a change."""
        async with self.pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                "UPDATE memory_vector_spaces s SET dimensions = $2"
                "  FROM (SELECT dimensions AS old FROM memory_vector_spaces WHERE model = $1 FOR UPDATE) o"
                " WHERE s.model = $1 AND s.dimensions IS DISTINCT FROM $2 RETURNING o.old",
                model,
                dimensions,
            )
            if row is None:
                return False
            for table in ("memory_vectors", "summary_vectors", "message_vectors"):
                await conn.execute(
                    f"DELETE FROM {table} WHERE model = $1 AND vector_dims(embedding) <> $2", model, dimensions
                )
            # The messages whose vectors went are embedded again from the start.
            await conn.execute("DELETE FROM message_vector_marks WHERE model = $1", model)
            return row["old"] is not None

    async def dimensions(self, model: str) -> int | None:
        return await self.pool.fetchval("SELECT dimensions FROM memory_vector_spaces WHERE model = $1", model)

    async def pending(self, model: str, limit: int) -> list[asyncpg.Record]:
        return await self.pool.fetch(_PENDING_SQL, model, limit)

    async def store(self, model: str, chunk_ids: Sequence[int], vectors: Sequence[Sequence[float]]) -> None:
        await self.pool.execute(_STORE_SQL, model, list(chunk_ids), [vector_text(v) for v in vectors])

    async def pending_summaries(self, model: str, limit: int) -> list[asyncpg.Record]:
        return await self.pool.fetch(_PENDING_SUMMARIES_SQL, model, limit)

    async def store_summaries(
        self, model: str, keys: Sequence[tuple[uuid.UUID, int]], vectors: Sequence[Sequence[float]]
    ) -> None:
        await self.pool.execute(
            _STORE_SUMMARIES_SQL, model, [k[0] for k in keys], [k[1] for k in keys], [vector_text(v) for v in vectors]
        )

    async def pending_messages(self, model: str, limit: int, quiet_s: float = 0.0) -> list[asyncpg.Record]:
        return await self.pool.fetch(_PENDING_MESSAGES_SQL, model, limit, quiet_s)

    async def store_messages(
        self,
        model: str,
        keys: Sequence[tuple[uuid.UUID, int]],
        vectors: Sequence[Sequence[float]],
        marks: Sequence[tuple[uuid.UUID, int]],
    ) -> None:
        """The messages' vectors and how far each session is now embedded, together."""
        async with self.pool.acquire() as conn, conn.transaction():
            if keys:
                await conn.execute(
                    _STORE_MESSAGES_SQL,
                    model,
                    [k[0] for k in keys],
                    [k[1] for k in keys],
                    [vector_text(v) for v in vectors],
                )
            await conn.execute(_STORE_MARKS_SQL, model, [m[0] for m in marks], [m[1] for m in marks])

    async def nearest(
        self, session_id: uuid.UUID, model: str, vector: Sequence[float], limit: int, min_similarity: float
    ) -> list[dict[str, Any]]:
        rows = await self.pool.fetch(
            _NEAREST_SQL, session_id, model, vector_text(vector), len(vector), limit, min_similarity
        )
        return [dict(row) for row in rows]

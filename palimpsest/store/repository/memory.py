"""Memory chunks: verbatim raw history a compression dropped from the context, searched on recall.

Append-only; one row per distinct content per session (UNIQUE (session_id, content_hash)).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import asyncpg

from palimpsest.shared.auth import Identity
from palimpsest.store import convert
from palimpsest.store.db import Connection
from palimpsest.store.repository.access import like_pattern, readable, rows_affected
from palimpsest.v1 import common_pb2

# A recall query is the user's whole message; its first words carry enough to find candidates.
MEMORY_QUERY_CHARS = 500
MEMORY_CANDIDATES_PER_RESULT = 10

# A recall's candidates ($1 the session, then candidate_arguments()): chunks holding any of the
# query's words ($2, full text), the whole query as a substring ($3) or as a breadcrumb.
#
# Each arm is its own SELECT, so each uses its own index (tsv GIN, content trigram GIN, breadcrumbs
# GIN): one WHERE with the three OR'ed together could use none of them and read every chunk of the
# session. The order is the OR form's: a whole-token hit, then a substring hit, then by text rank.
# A whole-token hit is always a substring hit, so the regex runs on the substring arm's few rows
# rather than on every candidate. What remains costly is the rank of every word hit, when the
# query's words are common ones (a long message): the top candidates need all of them ranked.
CANDIDATES_SQL = """
    WITH q AS (SELECT replace(plainto_tsquery('simple', $2)::text, ' & ', ' | ')::tsquery AS tsq),
    arms AS (
        SELECT c.id, false AS substring FROM memory_chunks c, q WHERE c.session_id = $1 AND c.tsv @@ q.tsq
        UNION ALL
        SELECT id, true FROM memory_chunks WHERE session_id = $1 AND content ILIKE $3
        UNION ALL
        SELECT id, false FROM memory_chunks WHERE session_id = $1 AND breadcrumbs @> ARRAY[$2]
    ),
    hits AS (SELECT id, bool_or(substring) AS substring FROM arms GROUP BY id),
    ranked AS (
        SELECT c.id, row_number() OVER (
                   ORDER BY CASE WHEN h.substring THEN c.content ~* $5 ELSE false END DESC, h.substring DESC,
                            ts_rank_cd(c.tsv, q.tsq) DESC, c.id) AS place
          FROM hits h JOIN memory_chunks c ON c.id = h.id, q
         ORDER BY place
         LIMIT $4
    )
    SELECT c.id, c.session_id, c.content, c.content_hash, c.first_seq, c.last_seq, c.first_at,
           c.last_at, c.breadcrumbs
      FROM ranked r JOIN memory_chunks c ON c.id = r.id
     ORDER BY r.place
"""


def candidate_arguments(query: str, limit: int) -> tuple[str, str, int, str]:
    """CANDIDATES_SQL's arguments after the session: the query's words, the query as a substring,
    how many candidates, the query as a whole token."""
    return (
        query[:MEMORY_QUERY_CHARS],
        like_pattern(query),
        limit * MEMORY_CANDIDATES_PER_RESULT,
        whole_token_pattern(query),
    )


# All of a batch's chunks in one statement (one round trip), rather than one INSERT each. Not
# executemany: IndexChunks answers how many chunks were new, and only a single statement's status
# counts the rows ON CONFLICT skipped. Breadcrumbs are a list per chunk, and PostgreSQL arrays
# cannot be ragged: each chunk's list travels as a JSON array.
_INSERT_CHUNKS_SQL = """
    INSERT INTO memory_chunks (session_id, content, content_hash, first_seq, last_seq, first_at, last_at,
                               breadcrumbs)
    SELECT $1, c.content, c.content_hash, c.first_seq, c.last_seq, c.first_at, c.last_at,
           ARRAY(SELECT jsonb_array_elements_text(c.breadcrumbs::jsonb))
      FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::timestamptz[], $7::timestamptz[],
                  $8::text[]) WITH ORDINALITY
           AS c(content, content_hash, first_seq, last_seq, first_at, last_at, breadcrumbs, place)
     ORDER BY c.place
    ON CONFLICT (session_id, content_hash) DO NOTHING
"""


def chunk_columns(chunks: Sequence[common_pb2.RawChunk]) -> list[list[Any]]:
    """_INSERT_CHUNKS_SQL's arrays after the session, one per column, in the chunks' order."""
    return [
        [chunk.content for chunk in chunks],
        [chunk.content_hash or hashlib.sha256(chunk.content.encode()).hexdigest() for chunk in chunks],
        [chunk.turn_range.first for chunk in chunks],
        [chunk.turn_range.last for chunk in chunks],
        [convert.to_datetime(chunk.first_at) for chunk in chunks],
        [convert.to_datetime(chunk.last_at) for chunk in chunks],
        [json.dumps(list(chunk.breadcrumbs)) for chunk in chunks],
    ]


async def insert_chunks(conn: Connection, session_id: uuid.UUID, chunks: Sequence[common_pb2.RawChunk]) -> int:
    """Store the chunks not stored yet (by content hash); returns how many were new."""
    return rows_affected(await conn.execute(_INSERT_CHUNKS_SQL, session_id, *chunk_columns(chunks)))


class MemoryChunks:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def index_chunks(
        self, identity: Identity, session_id: uuid.UUID, chunks: Sequence[common_pb2.RawChunk]
    ) -> int:
        async with self.pool.acquire() as conn, conn.transaction():
            await readable(conn, session_id, identity)
            return await insert_chunks(conn, session_id, chunks)

    async def search_memory(
        self,
        identity: Identity,
        session_id: uuid.UUID,
        query: str,
        limit: int,
        min_similarity: float,
        semantic: SemanticTier | None = None,
        embed_model: str = "",
    ) -> tuple[list[dict[str, Any]], bool]:
        """Chunks ranked by how much of the query they hold, and by meaning when the semantic tier
        answers; a verbatim hit (an id, a path) first. Also whether the semantic tier ranked them.

        Indexes pick the lexical candidates (CANDIDATES_SQL: any query word, the query as a
        substring or a breadcrumb), at most MEMORY_CANDIDATES_PER_RESULT per result; the final
        score is computed over those few. The query is embedded while they are read."""
        async with self.pool.acquire() as conn:
            await readable(conn, session_id, identity)
            embedding = (
                asyncio.create_task(semantic.embed_query(query[:MEMORY_QUERY_CHARS], embed_model))
                if semantic is not None
                else None
            )
            try:
                rows = await conn.fetch(CANDIDATES_SQL, session_id, *candidate_arguments(query, limit))
            except BaseException:
                if embedding is not None:
                    embedding.cancel()
                raise
        lexical = {row["id"]: memory_score(query, row["content"], row["breadcrumbs"]) for row in rows}
        near: list[dict[str, Any]] | None = None
        vector = await embedding if embedding is not None else None
        if semantic is not None and vector is not None:
            near = await semantic.nearest(session_id, embed_model, vector, limit * MEMORY_CANDIDATES_PER_RESULT)
        similarity = {row["id"]: row["similarity"] for row in near or ()}
        chunks = {row["id"]: dict(row) for row in [*rows, *(near or ())]}
        ranked = rank_together(
            lexical, meaning_scores(similarity, semantic.min_similarity if semantic else 0.0), limit, min_similarity
        )
        return (
            [
                {k: v for k, v in chunks[i].items() if k != "similarity"}
                | {"score": score, "similarity": similarity.get(i, 0.0)}
                for i, score in ranked
            ],
            near is not None,
        )


class SemanticTier(Protocol):
    """What memory search needs of the semantic tier (palimpsest.store.semantic.MemoryIndex)."""

    min_similarity: float

    async def embed_query(self, query: str, model: str) -> list[float] | None: ...

    async def nearest(
        self, session_id: uuid.UUID, model: str, vector: Sequence[float], limit: int
    ) -> list[dict[str, Any]] | None: ...


def meaning_scores(similarity: Mapping[int, float], floor: float) -> dict[int, float]:
    """Cosine similarities rescaled to what they add to a chunk's score: 0 at the floor (the
    similarity unrelated texts reach with the embedding model), 1 for the same meaning. Raw cosines
    would lift every chunk by about the floor and drown the lexical evidence."""
    span = 1.0 - floor
    return {i: (s - floor) / span if span > 0 else 1.0 for i, s in similarity.items() if s >= floor}


def rank_together(
    lexical: Mapping[int, float], meaning: Mapping[int, float], limit: int, min_score: float
) -> list[tuple[int, float]]:
    """(chunk id, score), best first: the lexical score (memory_score, 0–2) plus the meaning
    score (0–1). Without meaning scores this is the lexical tier's own order. A whole-token
    verbatim hit scores at least 2, which meaning alone (at most 1 plus a partial word share
    below 1) never reaches: an exact id or path stays first."""
    scores = {i: lexical.get(i, 0.0) + meaning.get(i, 0.0) for i in lexical.keys() | meaning.keys()}
    kept = sorted(((s, i) for i, s in scores.items() if s > 0 and s >= min_score), key=lambda p: (-p[0], p[1]))
    return [(i, s) for s, i in kept[:limit]]


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

"""Memory search finds what the single OR predicate found, in the same order, now that each arm
(words, substring, breadcrumb) is a query of its own on an index of its own."""

from __future__ import annotations

import uuid

import asyncpg

from palimpsest.store.repository.memory import CANDIDATES_SQL, candidate_arguments, memory_score
from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as pb

# The candidate query before the arms were split: one WHERE, the specification the split must meet.
OR_PREDICATE_SQL = """
    WITH q AS (SELECT replace(plainto_tsquery('simple', $2)::text, ' & ', ' | ')::tsquery AS tsq)
    SELECT c.id, c.session_id, c.content, c.content_hash, c.first_seq, c.last_seq, c.first_at,
           c.last_at, c.breadcrumbs
      FROM memory_chunks c, q
     WHERE c.session_id = $1 AND (c.tsv @@ q.tsq OR c.content ILIKE $3 OR $2 = ANY(c.breadcrumbs))
     ORDER BY (c.content ~* $5) DESC, (c.content ILIKE $3) DESC, ts_rank_cd(c.tsv, q.tsq) DESC, c.id
     LIMIT $4
"""

LONG_CHUNK = " ".join(f"line {i} of the build log: compiled module_{i}.o in {i % 7} ms" for i in range(40))


def mixed_corpus() -> list[common_pb2.RawChunk]:
    """Chunks only one arm finds for some query, chunks several find, and more of them than a
    small limit's candidates, so the order and the cut both matter."""
    chunks = [
        common_pb2.RawChunk(content="The nginx proxy listens on port 8080", breadcrumbs=["nginx"]),
        common_pb2.RawChunk(content="We restarted NGINX after the config change"),
        common_pb2.RawChunk(content="marker-10 was set before the deploy"),  # 'arker-1' only as a substring
        common_pb2.RawChunk(content="marker-1 is the first checkpoint"),
        common_pb2.RawChunk(content="see the handler for details", breadcrumbs=["src/api/handler.py"]),
        common_pb2.RawChunk(content="the handler in src/api/handler.py raised KeyError"),
        common_pb2.RawChunk(content="?? was all the tool printed"),
        common_pb2.RawChunk(content=LONG_CHUNK),
    ]
    chunks += [
        common_pb2.RawChunk(content=f"deploy step {i}: the proxy reloaded its config ({'ok' * (i % 4)})")
        for i in range(60)
    ]
    return chunks


QUERIES = [
    "nginx",
    "NGINX proxy",
    "arker-1",
    "marker-1",
    "src/api/handler.py",
    "handler",
    "proxy config reloaded",
    "??",
    "deploy",
    "nothing like this",
    LONG_CHUNK[:620],
    "8080",
]


async def test_split_arms_find_what_the_or_predicate_found(store, profile, database_url):
    session_id = (await store.CreateSession(pb.CreateSessionRequest(profile_id=profile))).session.id
    assert (await store.IndexChunks(pb.IndexChunksRequest(session_id=session_id, chunks=mixed_corpus()))).indexed == 68
    conn = await asyncpg.connect(database_url)
    try:
        for query in QUERIES:
            for limit in (1, 2, 5, 50):
                args = (uuid.UUID(session_id), *candidate_arguments(query, limit))
                expected = [dict(r) for r in await conn.fetch(OR_PREDICATE_SQL, *args)]
                assert [dict(r) for r in await conn.fetch(CANDIDATES_SQL, *args)] == expected, (query, limit)
            # And through the RPC: the rows the OR form picks, scored and cut as the store does.
            expected = await conn.fetch(OR_PREDICATE_SQL, uuid.UUID(session_id), *candidate_arguments(query, 5))
            found = await store.SearchMemory(pb.SearchMemoryRequest(session_id=session_id, query=query, limit=5))
            scored = sorted(
                ((memory_score(query, r["content"], r["breadcrumbs"]), r["id"]) for r in expected),
                key=lambda pair: (-pair[0], pair[1]),
            )
            assert [c.id for c in found.chunks] == [i for score, i in scored if score > 0][:5], query
    finally:
        await conn.close()
    assert (await store.SearchMemory(pb.SearchMemoryRequest(session_id=session_id, query="arker-1"))).chunks


async def test_a_batch_of_chunks_is_stored_in_its_order_once_each(store, profile, database_url):
    session_id = (await store.CreateSession(pb.CreateSessionRequest(profile_id=profile))).session.id
    first = common_pb2.RawChunk(
        content="first", breadcrumbs=["src/ä.py", 'a "quoted", comma'], turn_range=common_pb2.SeqRange(first=3, last=4)
    )
    first.first_at.FromSeconds(1_700_000_000)
    batch = [
        first,
        common_pb2.RawChunk(content="second"),
        common_pb2.RawChunk(content="first"),  # same hash
        common_pb2.RawChunk(content="third", breadcrumbs=[]),
    ]
    assert (await store.IndexChunks(pb.IndexChunksRequest(session_id=session_id, chunks=batch))).indexed == 3
    more = [common_pb2.RawChunk(content="third"), common_pb2.RawChunk(content="fourth")]
    assert (await store.IndexChunks(pb.IndexChunksRequest(session_id=session_id, chunks=more))).indexed == 1
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT content, breadcrumbs, first_seq, last_seq, extract(epoch FROM first_at) AS at,"
            " last_at FROM memory_chunks WHERE session_id = $1 ORDER BY id",
            uuid.UUID(session_id),
        )
    finally:
        await conn.close()
    assert [r["content"] for r in rows] == ["first", "second", "third", "fourth"]
    assert list(rows[0]["breadcrumbs"]) == ["src/ä.py", 'a "quoted", comma'] and list(rows[1]["breadcrumbs"]) == []
    assert (rows[0]["first_seq"], rows[0]["last_seq"], rows[0]["at"], rows[0]["last_at"]) == (3, 4, 1_700_000_000, None)

"""Memory recall over one session's 4,000 chunks: IndexChunks, then SearchMemory through the
SessionStore's gRPC server, and the plan of its candidate query (EXPLAIN ANALYZE); then the same
searches with the semantic tier on (the simulator's /api/embed at nomic-embed-text's 768
dimensions, pgvector), after the background indexer has embedded every chunk.

The chunks are compressed turns of realistic chat (1–2 KB each), some with an identifier or a path
in their text or breadcrumbs, as recall finds them; other sessions' chunks share the table.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import uuid

import asyncpg

from bench._common import Chatter, fresh_database, ms, p50, percentile, running_store, table
from palimpsest.store.repository.memory import CANDIDATES_SQL, candidate_arguments
from palimpsest.store.repository.vectors import _NEAREST_SQL, vector_text
from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as pb

log = logging.getLogger("bench.store_memory")

NEEDS_POSTGRES = True
CHUNKS, QUICK_CHUNKS = 4_000, 400
OTHER_SESSIONS = 4  # sessions whose chunks share the table (and its indexes) with the measured one
BATCH = 100  # chunks per IndexChunks call (a compression commits a few; a backfill many)
CALLS, QUICK_CALLS = 30, 10
LIMIT = 5  # SearchMemory's default

# What recall is asked: the user's whole message (words), an identifier, a path only a breadcrumb
# holds, and something the session never said.
QUERY_KINDS = ("a user message", "an identifier", "a breadcrumb path", "absent")


def chunk(chatter: Chatter, rng: random.Random, index: int) -> common_pb2.RawChunk:
    user, assistant = chatter.turn(500, 1000)
    content = f"user: {user}\nassistant: {assistant}"
    breadcrumbs = [f"services/api/handler_{index}.py"] if index % 7 == 0 else []
    if index % 5 == 0:
        content += f" The failing request was ticket-{index}."
    return common_pb2.RawChunk(
        content=content,
        breadcrumbs=breadcrumbs,
        turn_range=common_pb2.SeqRange(first=2 * index + 1, last=2 * index + 2),
    )


def queries(chatter: Chatter, rng: random.Random, chunks: int, calls: int) -> dict[str, list[str]]:
    return {
        "a user message": [chatter.message("user", 80, 200) for _ in range(calls)],
        "an identifier": [f"ticket-{5 * rng.randrange(chunks // 5)}" for _ in range(calls)],
        "a breadcrumb path": [f"services/api/handler_{7 * rng.randrange(chunks // 7)}.py" for _ in range(calls)],
        "absent": [f"zyzzyva-{rng.randrange(10**6)}" for _ in range(calls)],
    }


async def index(stub, session_id: str, chatter: Chatter, rng: random.Random, chunks: int) -> list[float]:
    seconds = []
    for first in range(0, chunks, BATCH):
        batch = [chunk(chatter, rng, i) for i in range(first, min(first + BATCH, chunks))]
        started = time.perf_counter()
        await stub.IndexChunks(pb.IndexChunksRequest(session_id=session_id, chunks=batch))
        seconds.append(time.perf_counter() - started)
    return seconds


async def explained_ms(conn: asyncpg.Connection, session_id: str, query: str) -> float:
    """The candidate query's execution time as EXPLAIN ANALYZE reports it (server side only)."""
    plan = await conn.fetchval(
        f"EXPLAIN (ANALYZE, FORMAT JSON) {CANDIDATES_SQL}", uuid.UUID(session_id), *candidate_arguments(query, LIMIT)
    )
    return json.loads(plan)[0]["Execution Time"] / 1e3


async def nearest_ms(conn: asyncpg.Connection, session_id: str, vector: list[float]) -> float:
    """The semantic tier's query, EXPLAIN ANALYZE's execution time (server side only)."""
    plan = await conn.fetchval(
        f"EXPLAIN (ANALYZE, FORMAT JSON) {_NEAREST_SQL}",
        uuid.UUID(session_id),
        EMBED_MODEL,
        vector_text(vector),
        len(vector),
        LIMIT * 10,
        0.5,
    )
    return json.loads(plan)[0]["Execution Time"] / 1e3


EMBED_MODEL = "nomic-embed-text"
EMBED_DIMENSIONS = 768  # nomic-embed-text's


async def semantic_rows(
    dsn: str, session_id: str, asked: dict[str, list[str]], total: int
) -> tuple[list[list[str]], float]:
    """The same searches with the semantic tier on; and the seconds the indexer took for every chunk."""
    from dataclasses import replace

    from ollama_sim import OllamaSimulator
    from ollama_sim.embed import embed_text
    from ollama_sim.models import default_models

    models = default_models()
    models[EMBED_MODEL] = replace(models[EMBED_MODEL], embedding_length=EMBED_DIMENSIONS)
    rows = []
    with OllamaSimulator(models) as sim:
        conn = await asyncpg.connect(dsn)
        try:
            started = time.perf_counter()
            async with running_store(dsn, ollama_host=sim.url, embed_model=EMBED_MODEL) as (_, stub):
                while await conn.fetchval("SELECT count(*) FROM memory_vectors") < total:
                    await asyncio.sleep(0.2)  # polling the indexer's progress, not synchronising with it
                indexing = time.perf_counter() - started
                await conn.execute("VACUUM ANALYZE memory_vectors")
                for kind in QUERY_KINDS:
                    rpc, server, found, semantic = [], [], [], 0
                    for query in asked[kind]:
                        started = time.perf_counter()
                        answer = await stub.SearchMemory(pb.SearchMemoryRequest(session_id=session_id, query=query))
                        rpc.append(time.perf_counter() - started)
                        found.append(len(answer.chunks))
                        semantic += answer.semantic
                        server.append(await nearest_ms(conn, session_id, embed_text(query, EMBED_DIMENSIONS)))
                    assert semantic == len(asked[kind]), "the semantic tier did not answer every search"
                    rows.append(
                        [
                            f"SearchMemory by words and meaning, {kind}",
                            ms(p50(rpc)),
                            ms(percentile(rpc, 95)),
                            ms(p50(server)),
                            ms(percentile(server, 95)),
                            f"{sorted(found)[len(found) // 2]}",
                        ]
                    )
        finally:
            await conn.close()
    return rows, indexing


async def run(args) -> str:
    chunks, calls = (QUICK_CHUNKS, QUICK_CALLS) if args.quick else (CHUNKS, CALLS)
    rng, chatter = random.Random(11), Chatter(seed=11)
    asked = queries(chatter, rng, chunks, calls)
    async with fresh_database(args.server, "memory") as dsn:
        async with running_store(dsn) as (_, stub):  # the lexical tier alone
            for _ in range(OTHER_SESSIONS):
                other = (await stub.CreateSession(pb.CreateSessionRequest(profile_id="bench"))).session.id
                await index(stub, other, chatter, rng, chunks // 4)
            session_id = (await stub.CreateSession(pb.CreateSessionRequest(profile_id="bench"))).session.id
            indexing = await index(stub, session_id, chatter, rng, chunks)
            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute("VACUUM ANALYZE memory_chunks")
                await stub.SearchMemory(pb.SearchMemoryRequest(session_id=session_id, query="warm up"))
                rows = []
                for kind in QUERY_KINDS:
                    rpc, server, found = [], [], []
                    for query in asked[kind]:
                        started = time.perf_counter()
                        answer = await stub.SearchMemory(pb.SearchMemoryRequest(session_id=session_id, query=query))
                        rpc.append(time.perf_counter() - started)
                        found.append(len(answer.chunks))
                        server.append(await explained_ms(conn, session_id, query))
                    log.info("%s: p50 %.2f ms", kind, p50(rpc) * 1e3)
                    rows.append(
                        [
                            f"SearchMemory, {kind}",
                            ms(p50(rpc)),
                            ms(percentile(rpc, 95)),
                            ms(p50(server)),
                            ms(percentile(server, 95)),
                            f"{sorted(found)[len(found) // 2]}",
                        ]
                    )
                total = await conn.fetchval("SELECT count(*) FROM memory_chunks")
            finally:
                await conn.close()
        semantic, embedding = await semantic_rows(dsn, session_id, asked, total)
    rows.append([f"IndexChunks, {BATCH} chunks", ms(p50(indexing)), ms(percentile(indexing, 95)), "", "", ""])
    rows += semantic
    headers = ["operation", "p50", "p95", "candidate query p50", "candidate query p95", "chunks found (median)"]
    notes = [
        f"ms per call through the gRPC server, {calls} calls per kind of query, each a different one; limit {LIMIT}.",
        (
            f"The session holds {chunks:,} chunks of 1–2 KB (a fifth name a ticket, a seventh carry a path breadcrumb); "
            f"{total - chunks:,} chunks of {OTHER_SESSIONS} other sessions share the table."
        ),
        "Candidate query = the store's SQL alone, EXPLAIN ANALYZE's execution time on the server; for the rows "
        "by words and meaning, the semantic tier's query (an exact cosine scan of the session's vectors).",
        (
            f"By words and meaning: a second store on the same database with the simulator's /api/embed "
            f"({EMBED_DIMENSIONS} dimensions); its background indexer embedded all {total:,} chunks in "
            f"{embedding:.1f} s (batches of 16, the simulator's HTTP and hashing included) before the searches ran."
        ),
    ]
    return table(headers, rows) + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"


if __name__ == "__main__":
    import sys

    from bench.__main__ import main

    sys.exit(asyncio.run(main(["store_memory", *sys.argv[1:]])))

"""Writers of a session's rows take the session's row lock first, counts included: a count written
beside a compression's commit waits for it rather than deadlocking with it (PostgreSQL aborting one
of the two, the commit failing INTERNAL, was seen on bench compaction at a 4,096 window)."""

from __future__ import annotations

import asyncio
import hashlib
import uuid

import asyncpg

from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as pb
from tests.helpers.calls import append, conversation, new_session
from tests.helpers.waiting import until


async def _waiting_on_a_lock(conn: asyncpg.Connection) -> bool:
    waiting = await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
    )
    return bool(waiting)


async def test_counts_written_during_a_commit_wait_for_it_rather_than_deadlock(store, profile, database_url) -> None:
    session = await new_session(store, profile)
    messages = conversation(2)
    seqs = list((await append(store, session.id, *messages)).seqs)
    counts = [
        common_pb2.TokenCount(seq=seq, tokens=5, content_md5=hashlib.md5(m.content.encode()).hexdigest())
        for seq, m in zip(seqs, messages)
    ]
    sid = uuid.UUID(session.id)
    commit = await asyncpg.connect(database_url)
    try:
        # What CommitCompression does: the session's row locked, then its message rows updated.
        tx = commit.transaction()
        await tx.start()
        await commit.execute("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE", sid)
        touch = "UPDATE session_messages SET is_context = is_context WHERE session_id = $1 AND seq = $2"
        await commit.execute(touch, sid, seqs[-1])
        write = asyncio.ensure_future(
            store.SetTokenCounts(
                pb.SetTokenCountsRequest(session_id=session.id, token_digest="test-digest", counts=counts), timeout=30
            )
        )
        assert await until(lambda: _waiting_on_a_lock(commit)), "the count write never reached PostgreSQL"
        # The commit goes on to the rows the count writer would hold, had it not waited.
        for seq in seqs[:-1]:
            await commit.execute(touch, sid, seq)
        await tx.commit()
    finally:
        await commit.close()
    assert (await write).updated == len(counts)

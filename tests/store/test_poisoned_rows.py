"""Rows an older store let in, before times were checked: a message dated year 1 (asyncpg stored it
as '-infinity'), one past year 9999 ('infinity'), a ref and a memory chunk the same. Every read of
such a session works, reads the bad time as the nearest end of the range the store takes (the
earliest being the epoch: unset), and says so once in the log."""

from __future__ import annotations

import logging
import uuid

import asyncpg
import pytest

from ollama_sim import Reply
from palimpsest.shared.validation import LATEST
from palimpsest.store import convert
from palimpsest.v1 import agent_pb2 as apb
from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as pb
from tests.helpers.calls import conversation, full, new_session

Message = common_pb2.Message
LATEST_S = int(LATEST.timestamp())
WRITTEN_BY_AN_OLD_STORE = {  # seq → the created_at an old database holds for it
    3: "-infinity",  # what asyncpg made of datetime(1, 1, 1)
    4: "infinity",  # … and of datetime.max
    5: "0001-01-01 00:00:00+00",  # year 1 itself, as another writer would have put it
}


@pytest.fixture
async def poisoned(store, profile, database_url) -> str:
    """A session of six turns (its first three archived), with bad times in its messages (hot and
    archived), in a memory chunk of its and in a ref of its, written straight into the tables."""
    session = await new_session(
        store,
        profile,
        external_refs=[common_pb2.ExternalRef(kind="ci-run", uri="https://ci.example.test/runs/1", created_by="ci")],
    )
    await store.AppendMessages(
        pb.AppendMessagesRequest(
            session_id=session.id, messages=[Message(role="system", content="You are terse."), *conversation(6)]
        )
    )
    await store.IndexChunks(
        pb.IndexChunksRequest(
            session_id=session.id, chunks=[common_pb2.RawChunk(content="the deploy key rotation happened on tuesday")]
        )
    )
    conn = await asyncpg.connect(database_url)
    try:
        for seq, value in {**WRITTEN_BY_AN_OLD_STORE, 9: "-infinity"}.items():
            await conn.execute(
                "UPDATE session_messages SET created_at = $2::text::timestamptz WHERE session_id = $1 AND seq = $3",
                uuid.UUID(session.id),
                value,
                seq,
            )
        await conn.execute(
            "UPDATE memory_chunks SET first_at = '-infinity', last_at = 'infinity' WHERE session_id = $1",
            uuid.UUID(session.id),
        )
        await conn.execute(
            "UPDATE sessions SET external_refs = jsonb_set(external_refs, '{0,created_at}',"
            " '\"0001-01-01T00:00:00+00:00\"') WHERE id = $1",
            uuid.UUID(session.id),
        )
    finally:
        await conn.close()
    await store.ArchiveOldMessages(pb.ArchiveOldMessagesRequest(session_id=session.id, below_seq=8))
    return session.id


def times(messages) -> dict[int, int]:
    return {m.seq: m.created_at.seconds for m in messages}


def check_read_safely(by_seq: dict[int, int]) -> None:
    """Bad times read as the ends of the range; the others as written."""
    for seq, seconds in by_seq.items():
        if seq in (3, 5, 9):
            assert seconds == 0, (seq, seconds)
        elif seq == 4:
            assert seconds == LATEST_S
        else:
            assert 1_700_000_000 < seconds < LATEST_S, (seq, seconds)


async def test_every_store_read_of_a_poisoned_session_works(store, poisoned, profile, caplog, monkeypatch):
    monkeypatch.setattr(convert, "_said_out_of_range", False)
    caplog.set_level(logging.WARNING, logger="palimpsest.store")
    for view in (pb.SESSION_VIEW_SUMMARY, pb.SESSION_VIEW_DISPLAY, pb.SESSION_VIEW_CONTEXT, pb.SESSION_VIEW_FULL):
        session = (await store.GetSession(pb.GetSessionRequest(session_id=poisoned, view=view))).session
        check_read_safely(times([*session.messages, *session.context]))
    assert session.external_refs[0].created_at.seconds == 0 and len(session.messages) == 13
    page = await store.GetHistoryPage(pb.GetHistoryPageRequest(session_id=poisoned, limit=500))
    check_read_safely(times(page.messages))
    assert len(page.messages) == 13
    archived = await store.GetArchivedMessages(pb.GetArchivedMessagesRequest(session_id=poisoned))
    assert {3, 4, 5} <= {m.seq for m in archived.messages if m.archived}
    check_read_safely(times(archived.messages))
    share = await store.CreateShare(pb.CreateShareRequest(session_id=poisoned))
    shared = await store.GetShared(pb.GetSharedRequest(token=share.token, limit=500))
    check_read_safely(times(shared.messages))
    chunks = (await store.SearchMemory(pb.SearchMemoryRequest(session_id=poisoned, query="deploy key"))).chunks
    assert [(c.first_at.seconds, c.last_at.seconds) for c in chunks] == [(0, LATEST_S)]
    counted = await store.GetBaseline(pb.GetBaselineRequest(session_id=poisoned, token_digest="never-counted"))
    check_read_safely(times(counted.context_tokens.uncounted))
    listed = await store.ListSessions(pb.ListSessionsRequest(profile_id=profile))
    assert [s.id for s in listed.sessions] == [poisoned]
    # said once, not once a row
    said = [r for r in caplog.records if "outside what the store takes" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]


async def test_a_poisoned_session_can_be_trimmed_and_written_again(store, poisoned):
    trimmed = await store.TrimSession(pb.TrimSessionRequest(session_id=poisoned, keep=8))
    assert trimmed.dropped > 0
    session = await full(store, poisoned)
    check_read_safely(times(session.messages))  # seq 9 (kept) still reads as the epoch
    # What a read gave back, the store takes again (the range it reads into is the range it takes).
    copy = [Message(role=m.role, content=m.content, created_at=m.created_at) for m in session.messages[-2:]]
    await store.AppendMessages(pb.AppendMessagesRequest(session_id=poisoned, messages=copy))


async def test_a_turn_and_a_compaction_on_a_poisoned_session_work(agent, store, poisoned, ollama_sim):
    await store.UpdateSession(pb.UpdateSessionRequest(session_id=poisoned, profile_id="small"))
    ollama_sim.script(Reply(text="Still here."))
    events = [e async for e in agent.RunStream(apb.RunStreamRequest(session_id=poisoned, text="are you there?"))]
    ends = [e.stream_end for e in events if e.HasField("stream_end")]
    assert [end.reason for end in ends] == [apb.STREAM_END_REASON_COMPLETED], events[-3:]
    assert ends[0].text == "Still here."
    compacted = [e async for e in agent.Compact(apb.CompactRequest(session_id=poisoned))]
    assert any(e.HasField("context_compressed") for e in compacted), [e.WhichOneof("event") for e in compacted]
    session = await full(store, poisoned)
    check_read_safely(times(m for m in session.messages if m.seq in WRITTEN_BY_AN_OLD_STORE))

"""Sessions past the gRPC message limit stay readable: every read pages under a byte budget, and one
message has a size cap of its own (real appends, 75 MB in all, through the real server)."""

from __future__ import annotations

import grpc
import pytest

from palimpsest.shared.settings import Settings
from palimpsest.store.repository.session_reads import rows_within
from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as pb
from tests.helpers.calls import append, expect_status, new_session

Message = common_pb2.Message
MB = 1024 * 1024
BIG = 15 * MB  # five of them pass the 64 MB gRPC limit; each is under the 16 MB message cap


def big(i: int) -> Message:
    # Repetitive text: PostgreSQL compresses it, so the test spends its time on the paths under test.
    return Message(role="user" if i % 2 == 0 else "assistant", content=f"<{i}>" + "x" * (BIG - 7) + f"</{i}>")


@pytest.fixture(scope="module")
async def store(base_settings, database_url):
    """The store as the services reach it: a channel with their message limit (64 MB), not 4 MB.
    Its hot window holds the whole session: moving 15 MB rows to the archive (and through its
    trigram index) would double the test's work on a machine shared with the rest of the suite."""
    from dataclasses import replace

    from palimpsest.shared.channels import open_channel
    from palimpsest.store.app import start_store
    from palimpsest.v1 import session_store_pb2_grpc

    running = await start_store(replace(base_settings, hot_window_bytes=256 * MB), port=0, dsn=database_url)
    async with open_channel(running.address, Settings()) as channel:
        yield session_store_pb2_grpc.SessionStoreStub(channel)
    await running.stop(0)


@pytest.fixture(scope="module")
async def huge_session(store):
    s = await new_session(store, "large")
    for i in range(5):
        await append(store, s.id, big(i))
    yield s.id
    await store.DeleteSession(pb.DeleteSessionRequest(session_id=s.id))  # the test database persists


def test_a_page_takes_rows_while_they_fit_and_always_one():
    assert rows_within([10, 10, 10], 25) == 2
    assert rows_within([10, 10, 10], 30) == 3
    assert rows_within([40, 1], 25) == 1  # a row over the budget still moves the reader on
    assert rows_within([], 25) == 0


async def test_the_display_history_of_a_huge_session_pages_back_in_time(store, huge_session):
    budget = Settings().read_budget_bytes
    reply = await store.GetSession(pb.GetSessionRequest(session_id=huge_session, view=pb.SESSION_VIEW_DISPLAY))
    assert reply.has_more_messages and reply.session.display_message_count >= 5
    seen = list(reply.session.messages)
    assert sum(m.ByteSize() for m in seen) <= budget
    before, more = seen[0].seq, True
    while more:
        page = await store.GetHistoryPage(pb.GetHistoryPageRequest(session_id=huge_session, before_seq=before))
        assert page.messages and sum(m.ByteSize() for m in page.messages) <= budget
        seen = list(page.messages) + seen
        before, more = page.messages[0].seq, page.has_more
    assert [m.content[:3] for m in seen[:5]] == ["<0>", "<1>", "<2>", "<3>", "<4>"]
    assert all(len(m.content) == BIG for m in seen[:5])


async def test_the_context_of_a_huge_session_reads_in_parts(store, huge_session):
    context, revisions, more = [], set(), True
    while more:
        reply = await store.GetSession(
            pb.GetSessionRequest(session_id=huge_session, view=pb.SESSION_VIEW_CONTEXT, context_offset=len(context))
        )
        context += reply.session.context
        revisions.add(reply.session.revision)
        more = reply.has_more_context
    assert [m.content[-4:] for m in context[:5]] == ["</0>", "</1>", "</2>", "</3>", "</4>"] and len(revisions) == 1
    full = await store.GetSession(pb.GetSessionRequest(session_id=huge_session, view=pb.SESSION_VIEW_FULL))
    assert full.has_more_messages and full.has_more_context and full.session.messages and full.session.context


async def test_a_message_over_the_cap_is_refused_naming_it_and_changes_nothing(store, huge_session):
    before = (await store.GetSession(pb.GetSessionRequest(session_id=huge_session))).session.revision
    too_big = Message(role="user", content="y" * (16 * MB + 1))
    details = await expect_status(
        append(store, huge_session, Message(role="user", content="fine"), too_big),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "messages[1]",
        "PALIMPSEST_MESSAGE_MAX_MB",
    )
    assert "16,777,216" in details
    assert (await store.GetSession(pb.GetSessionRequest(session_id=huge_session))).session.revision == before
    await expect_status(
        store.GetSession(pb.GetSessionRequest(session_id=huge_session, context_offset=-1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "context_offset",
    )


async def test_the_services_read_a_huge_context_whole_and_of_one_revision(store, huge_session):
    from palimpsest.shared.session_reads import whole_context

    session = await whole_context(store.GetSession, huge_session)
    assert sum(len(m.content) for m in session.context[:5]) == 5 * BIG
    before = len(session.context)

    written = []

    async def a_writer_between_parts(request):
        reply = await store.GetSession(request)
        if request.context_offset and not written:  # a real append lands between two parts
            written.append(await append(store, huge_session, Message(role="user", content="meanwhile")))
        return reply

    session = await whole_context(a_writer_between_parts, huge_session)
    assert session.revision == written[0].revision  # started over: no part from before the write
    assert [m.content for m in session.context][-1] == "meanwhile" and len(session.context) == before + 1

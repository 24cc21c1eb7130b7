"""Per-owner quotas: sessions and stored bytes (messages and files); past either, RESOURCE_EXHAUSTED
names the quota and its setting, and nothing is written."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import grpc
import pytest

from palimpsest.v1 import common_pb2, session_store_pb2_grpc
from palimpsest.v1 import session_store_pb2 as pb
from tests.conftest import bearer
from tests.helpers.calls import expect_status

Message = common_pb2.Message
KB = 1024


@pytest.fixture(scope="module")
async def quota_store(base_settings, database_url):
    """Auth on (quotas are per owner) with two sessions and 100 KB per owner."""
    from palimpsest.store.app import start_store

    running = await start_store(
        replace(base_settings, auth_enabled=True, owner_max_sessions=2, owner_max_bytes=100 * KB),
        port=0,
        dsn=database_url,
    )
    async with grpc.aio.insecure_channel(running.address) as channel:
        yield session_store_pb2_grpc.SessionStoreStub(channel)
    await running.stop(0)


async def test_an_owner_keeps_at_most_the_quota_of_sessions(quota_store, user):
    me = bearer(user)
    create = lambda: quota_store.CreateSession(pb.CreateSessionRequest(profile_id="p"), metadata=me)  # noqa: E731
    first, _ = await asyncio.gather(create(), create())
    await expect_status(create(), grpc.StatusCode.RESOURCE_EXHAUSTED, "session quota", "PALIMPSEST_OWNER_MAX_SESSIONS")
    assert (await quota_store.ListSessions(pb.ListSessionsRequest(), metadata=me)).total == 2
    await quota_store.CreateSession(pb.CreateSessionRequest(profile_id="p"), metadata=bearer(user + "-other"))
    await quota_store.DeleteSession(pb.DeleteSessionRequest(session_id=first.session.id), metadata=me)
    await create()  # a deleted session frees its place


async def put_as(store, metadata, session_id, data: bytes, filename: str):
    async def parts():
        yield pb.PutFileRequest(header=pb.PutFileHeader(session_id=session_id, filename=filename))
        for i in range(0, len(data), 16 * KB):
            yield pb.PutFileRequest(chunk=data[i : i + 16 * KB])

    return await store.PutFile(parts(), metadata=metadata)


async def test_stored_bytes_past_the_quota_are_refused_and_nothing_is_written(quota_store, user):
    me = bearer(user)
    s = (await quota_store.CreateSession(pb.CreateSessionRequest(profile_id="p"), metadata=me)).session

    def append(*contents: str):
        return quota_store.AppendMessages(
            pb.AppendMessagesRequest(session_id=s.id, messages=[Message(role="user", content=c) for c in contents]),
            metadata=me,
        )

    ok = await append("a" * 30 * KB, "b" * 30 * KB)
    await expect_status(
        append("c" * 50 * KB), grpc.StatusCode.RESOURCE_EXHAUSTED, "storage quota", "PALIMPSEST_OWNER_MAX_MB", "102,400"
    )
    await expect_status(
        put_as(quota_store, me, s.id, b"d" * 50 * KB, "notes.txt"), grpc.StatusCode.RESOURCE_EXHAUSTED, "storage quota"
    )
    assert not (await quota_store.ListFiles(pb.ListFilesRequest(session_id=s.id), metadata=me)).files
    got = (
        await quota_store.GetSession(pb.GetSessionRequest(session_id=s.id, view=pb.SESSION_VIEW_DISPLAY), metadata=me)
    ).session
    assert got.revision == ok.revision and len(got.messages) == 2
    # Files count as messages do.
    await put_as(quota_store, me, s.id, b"e" * 20 * KB, "small.txt")
    await expect_status(append("f" * 25 * KB), grpc.StatusCode.RESOURCE_EXHAUSTED, "storage quota")
    # Another owner is not charged; trimming frees what it drops.
    other = bearer(user + "-other")
    theirs = (await quota_store.CreateSession(pb.CreateSessionRequest(profile_id="p"), metadata=other)).session
    await quota_store.AppendMessages(
        pb.AppendMessagesRequest(session_id=theirs.id, messages=[Message(role="user", content="g" * 90 * KB)]),
        metadata=other,
    )
    await quota_store.TrimSession(pb.TrimSessionRequest(session_id=s.id, keep=1), metadata=me)
    await append("h" * 25 * KB)


async def test_an_admin_writing_to_an_owners_session_is_held_to_that_owners_quota(quota_store, user):
    """The append learns the session's owner only under its lock (one round trip): an admin's write
    to someone else's session is checked against that owner's bytes, not the admin's."""
    me, admin = bearer(user), bearer(user + "-admin", role="admin")
    s = (await quota_store.CreateSession(pb.CreateSessionRequest(profile_id="p"), metadata=me)).session
    await quota_store.AppendMessages(
        pb.AppendMessagesRequest(session_id=s.id, messages=[Message(role="user", content="a" * 60 * KB)]), metadata=me
    )
    too_much = pb.AppendMessagesRequest(session_id=s.id, messages=[Message(role="assistant", content="b" * 50 * KB)])
    await expect_status(
        quota_store.AppendMessages(too_much, metadata=admin), grpc.StatusCode.RESOURCE_EXHAUSTED, "storage quota", user
    )
    fits = pb.AppendMessagesRequest(session_id=s.id, messages=[Message(role="assistant", content="c" * 20 * KB)])
    done = await quota_store.AppendMessages(fits, metadata=admin)
    # What the admin wrote counts against the owner: their next 30 KB no longer fits.
    await expect_status(
        quota_store.AppendMessages(
            pb.AppendMessagesRequest(session_id=s.id, messages=[Message(role="user", content="d" * 30 * KB)]),
            metadata=me,
        ),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "storage quota",
    )
    got = (
        await quota_store.GetSession(pb.GetSessionRequest(session_id=s.id, view=pb.SESSION_VIEW_DISPLAY), metadata=me)
    ).session
    assert got.revision == done.revision and [len(m.content) for m in got.messages] == [60 * KB, 20 * KB]

"""Who may see and change which session: owner, another user, admin, legacy, auth off."""

from __future__ import annotations

import uuid

import asyncpg
import grpc
import pytest

from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as pb
from tests.conftest import JWT_SECRET, bearer
from tests.helpers.calls import expect_status

Message = common_pb2.Message


async def create_as(store, sub, profile, role="user"):
    return (await store.CreateSession(pb.CreateSessionRequest(profile_id=profile), metadata=bearer(sub, role))).session


async def legacy_session(database_url, profile) -> str:
    """A session written before owners existed: owner NULL."""
    session_id = uuid.uuid4()
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("INSERT INTO sessions (id, owner, profile_id) VALUES ($1, NULL, $2)", session_id, profile)
    finally:
        await conn.close()
    return str(session_id)


async def test_owner_reads_and_writes_own_session(store_auth, user, profile):
    s = await create_as(store_auth, user, profile)
    assert s.owner == user
    await store_auth.AppendMessages(
        pb.AppendMessagesRequest(session_id=s.id, messages=[Message(role="user", content="x")]), metadata=bearer(user)
    )
    got = await store_auth.GetSession(
        pb.GetSessionRequest(session_id=s.id, view=pb.SESSION_VIEW_FULL), metadata=bearer(user)
    )
    assert len(got.session.messages) == 1


async def test_another_user_is_denied_and_changes_nothing(store_auth, user, profile):
    s = await create_as(store_auth, user, profile)
    intruder = bearer(f"other-{uuid.uuid4().hex[:6]}")
    for call in (
        store_auth.GetSession(pb.GetSessionRequest(session_id=s.id), metadata=intruder),
        store_auth.AppendMessages(
            pb.AppendMessagesRequest(session_id=s.id, messages=[Message(role="user", content="x")]), metadata=intruder
        ),
        store_auth.DeleteSession(pb.DeleteSessionRequest(session_id=s.id), metadata=intruder),
        store_auth.CreateShare(pb.CreateShareRequest(session_id=s.id), metadata=intruder),
        store_auth.TrimSession(pb.TrimSessionRequest(session_id=s.id, keep=1), metadata=intruder),
    ):
        await expect_status(call, grpc.StatusCode.PERMISSION_DENIED)
    listed = await store_auth.ListSessions(pb.ListSessionsRequest(profile_id=profile), metadata=intruder)
    assert listed.total == 0
    got = await store_auth.GetSession(
        pb.GetSessionRequest(session_id=s.id, view=pb.SESSION_VIEW_FULL), metadata=bearer(user)
    )
    assert not got.session.messages and got.session.revision == s.revision


async def test_admin_sees_everything_including_legacy(store_auth, user, profile, database_url):
    s = await create_as(store_auth, user, profile)
    legacy = await legacy_session(database_url, profile)
    admin = bearer("root-admin", "admin")
    listed = await store_auth.ListSessions(pb.ListSessionsRequest(profile_id=profile), metadata=admin)
    assert {x.id for x in listed.sessions} == {s.id, legacy}
    got = await store_auth.GetSession(pb.GetSessionRequest(session_id=legacy), metadata=admin)
    assert got.session.owner == ""


async def test_legacy_sessions_are_admin_only(store_auth, user, profile, database_url):
    legacy = await legacy_session(database_url, profile)
    await expect_status(
        store_auth.GetSession(pb.GetSessionRequest(session_id=legacy), metadata=bearer(user)),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    listed = await store_auth.ListSessions(pb.ListSessionsRequest(profile_id=profile), metadata=bearer(user))
    assert listed.total == 0


async def test_auth_off_every_session_is_anonymous_and_open(store, profile, database_url):
    s = (await store.CreateSession(pb.CreateSessionRequest(profile_id=profile))).session
    assert s.owner == "anonymous"
    legacy = await legacy_session(database_url, profile)
    # Checks are off: even a legacy session is readable, with no credentials at all.
    assert (await store.GetSession(pb.GetSessionRequest(session_id=legacy))).session.id == legacy


@pytest.mark.parametrize(
    "metadata, words",
    [
        ((), "missing authorization"),
        ((("authorization", "Basic abc"),), "Bearer"),
        ((("authorization", "Bearer not-a-jwt"),), "invalid token"),
    ],
)
async def test_bad_credentials_are_unauthenticated(store_auth, profile, metadata, words):
    await expect_status(
        store_auth.CreateSession(pb.CreateSessionRequest(profile_id=profile), metadata=metadata),
        grpc.StatusCode.UNAUTHENTICATED,
        words,
    )


async def test_a_token_signed_with_another_secret_is_refused(store_auth, profile):
    from palimpsest.shared.auth import make_token

    forged = make_token("mallory", JWT_SECRET + "-not", "admin")
    await expect_status(
        store_auth.ListSessions(
            pb.ListSessionsRequest(profile_id=profile), metadata=(("authorization", f"Bearer {forged}"),)
        ),
        grpc.StatusCode.UNAUTHENTICATED,
    )


async def test_cleanup_deletes_only_the_callers_idle_sessions(store_auth, user, profile, database_url):
    mine_old = await create_as(store_auth, user, profile)
    mine_new = await create_as(store_auth, user, profile)
    theirs = await create_as(store_auth, f"other-{uuid.uuid4().hex[:6]}", profile)
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "UPDATE sessions SET last_active = now() - interval '40 days' WHERE id = ANY($1::uuid[])",
            [mine_old.id, theirs.id],
        )
    finally:
        await conn.close()
    result = await store_auth.CleanupSessions(pb.CleanupSessionsRequest(older_than_days=30), metadata=bearer(user))
    assert list(result.session_ids) == [mine_old.id]
    everything = await store_auth.CleanupSessions(pb.CleanupSessionsRequest(older_than_days=0), metadata=bearer(user))
    assert list(everything.session_ids) == [mine_new.id]
    await expect_status(
        store_auth.CleanupSessions(pb.CleanupSessionsRequest(older_than_days=-1), metadata=bearer(user)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "older_than_days",
    )
    admin = bearer("root-admin", "admin")
    assert (await store_auth.GetSession(pb.GetSessionRequest(session_id=theirs.id), metadata=admin)).session.id

"""Share links: derived from the server's key, stored only as a hash, stable, and gone with their
session; a database from before (plaintext tokens) keeps its links."""

from __future__ import annotations

import os
import stat
import uuid
from dataclasses import replace

import asyncpg
import grpc
import pytest

from palimpsest.store import db
from palimpsest.store.share_links import load_key, token_hash
from palimpsest.v1 import session_store_pb2 as pb
from palimpsest.v1 import session_store_pb2_grpc
from tests.helpers.calls import append, conversation, expect_status, new_session


async def test_the_database_holds_no_token_only_its_hash(store, profile, database_url):
    s = await new_session(store, profile)
    await append(store, s.id, *conversation(1))
    token = (await store.CreateShare(pb.CreateShareRequest(session_id=s.id))).token
    conn = await asyncpg.connect(database_url)
    try:
        row = await conn.fetchrow("SELECT * FROM session_shares WHERE session_id = $1", uuid.UUID(s.id))
    finally:
        await conn.close()
    assert "token" not in row.keys()
    assert row["token_hash"] == token_hash(token)
    stored = b"".join(bytes(v) if isinstance(v, (bytes, memoryview)) else str(v).encode() for v in row.values())
    assert token.encode() not in stored


async def test_asking_again_gives_the_same_link(store, profile):
    s = await new_session(store, profile, name="again")
    await append(store, s.id, *conversation(1))
    tokens = {(await store.CreateShare(pb.CreateShareRequest(session_id=s.id))).token for _ in range(3)}
    assert len(tokens) == 1
    assert (await store.GetShared(pb.GetSharedRequest(token=tokens.pop()))).name == "again"


async def test_a_store_with_another_key_opens_no_link(store, profile, base_settings, database_url):
    from palimpsest.store.app import start_store

    s = await new_session(store, profile)
    await append(store, s.id, *conversation(1))
    token = (await store.CreateShare(pb.CreateShareRequest(session_id=s.id))).token
    other = await start_store(replace(base_settings, share_key="k" * 64), port=0, dsn=database_url)
    try:
        async with grpc.aio.insecure_channel(other.address) as channel:
            elsewhere = session_store_pb2_grpc.SessionStoreStub(channel)
            await expect_status(elsewhere.GetShared(pb.GetSharedRequest(token=token)), grpc.StatusCode.NOT_FOUND)
            assert (await elsewhere.CreateShare(pb.CreateShareRequest(session_id=s.id))).token != token
    finally:
        await other.stop(0)
    assert (await store.GetShared(pb.GetSharedRequest(token=token))).messages


async def test_a_deleted_session_takes_its_link_with_it(store, profile):
    s = await new_session(store, profile)
    await append(store, s.id, *conversation(1))
    token = (await store.CreateShare(pb.CreateShareRequest(session_id=s.id))).token
    await store.DeleteSession(pb.DeleteSessionRequest(session_id=s.id))
    await expect_status(store.GetShared(pb.GetSharedRequest(token=token)), grpc.StatusCode.NOT_FOUND)


def test_the_key_file_is_made_once_and_private(tmp_path):
    first = load_key("", tmp_path)
    assert load_key("", tmp_path) == first
    assert stat.S_IMODE(os.stat(tmp_path / "share.key").st_mode) == 0o600
    assert load_key("x" * 40, tmp_path) == b"x" * 40
    with pytest.raises(SystemExit, match="PALIMPSEST_SHARE_KEY"):
        load_key("short", tmp_path)


@pytest.fixture
async def schema_0004(database_url):
    """A database of its own at migration 0004 (tokens in plaintext), dropped afterwards."""
    name = f"pal_upgrade_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(database_url)
    await admin.execute(f"CREATE DATABASE {name}")
    dsn = database_url.rsplit("/", 1)[0] + f"/{name}"
    pool = await db.create_pool(dsn)
    try:
        await db.migrate(pool, through=4)
        yield dsn, pool
    finally:
        await pool.close()
        await admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
        await admin.close()


async def test_links_made_before_the_upgrade_keep_working(schema_0004, base_settings):
    from palimpsest.store.app import start_store

    dsn, pool = schema_0004
    session_id, old_token = uuid.uuid4(), "legacy-plaintext-token-of-an-old-share-link-0123"
    await pool.execute(
        "INSERT INTO sessions (id, owner, profile_id, name, next_seq) VALUES ($1, 'anonymous', 'p', 'from before', 2)",
        session_id,
    )
    await pool.execute(
        "INSERT INTO session_messages (session_id, seq, role, content) VALUES ($1, 1, 'user', 'hi')", session_id
    )
    await pool.execute(
        "INSERT INTO session_shares (session_id, token, token_hash) VALUES ($1, $2, $3)",
        session_id,
        old_token,
        token_hash(old_token),
    )
    running = await start_store(base_settings, port=0, dsn=dsn)  # applies 0005
    try:
        async with grpc.aio.insecure_channel(running.address) as channel:
            store = session_store_pb2_grpc.SessionStoreStub(channel)
            assert (await store.GetShared(pb.GetSharedRequest(token=old_token))).name == "from before"
            new_token = (await store.CreateShare(pb.CreateShareRequest(session_id=str(session_id)))).token
            assert new_token != old_token
            assert (await store.CreateShare(pb.CreateShareRequest(session_id=str(session_id)))).token == new_token
            for token in (old_token, new_token):
                assert [m.content for m in (await store.GetShared(pb.GetSharedRequest(token=token))).messages] == ["hi"]
    finally:
        await running.stop(0)
    columns = {
        r["column_name"]
        for r in await pool.fetch(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'session_shares'"
        )
    }
    assert "token" not in columns


def test_no_new_link_begins_with_a_dash():
    """One URL-safe token in 64 began with '-', which a command line reads as an option."""
    from palimpsest.store.share_links import new_nonce, new_share, share_token

    key = b"k" * 32
    ids = [uuid.uuid4() for _ in range(2_000)]
    assert any(share_token(key, i, new_nonce()).startswith("-") for i in ids)  # the raw derivation does
    for i in ids:
        nonce, token = new_share(key, i)
        assert not token.startswith("-") and token == share_token(key, i, nonce)

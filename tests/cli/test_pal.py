"""`pal` end to end, run as a user types it: a real subprocess against real servers.

The helpers here (running `pal`, its environment, the Agent fixture) are shared by test_pal_agent.py
and test_node_client.py. Commands run through asyncio subprocesses because the servers live on this
process's event loop: a blocking subprocess call would freeze the very servers it talks to.
"""

from __future__ import annotations

import uuid

import grpc
import pytest

# `conftest`, not `tests.conftest`: plain `pytest` puts tests/ (not the repository) on sys.path.
from conftest import JWT_SECRET, bearer

from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as pb
from tests.helpers.pal_cli import (  # noqa: F401 — importing registers the fixtures
    CLOSED,
    Message,
    agent_server_fixture,
    chat_messages,
    new_session,
    pal,
    pal_env,
    pal_profiles_fixture,
)


@pytest.fixture
def env(store_server) -> dict[str, str]:
    return pal_env(store=store_server.address)


# -- sessions list ------------------------------------------------------------------------------
async def test_list_shows_the_newest_twenty_with_pinned_first(store, profile, env):
    ids = [(await new_session(store, profile, name=f"trip {i:02d}")).id for i in range(23)]
    await store.UpdateSession(pb.UpdateSessionRequest(session_id=ids[0], pinned=True))

    shown = await pal("sessions", "list", "--profile", profile, env=env)
    assert shown.code == 0, shown.stderr
    rows = [line for line in shown.stdout.splitlines() if "trip " in line]
    assert len(rows) == 20
    assert "trip 00" in rows[0] and rows[0].lstrip().startswith("*")
    assert [r.split("trip ")[1][:2] for r in rows[1:4]] == ["22", "21", "20"]
    assert "more with" in shown.stdout + shown.stderr

    listed = (await pal("sessions", "list", "--profile", profile, "--json", env=env)).json()
    assert len(listed["sessions"]) == 20 and listed["total"] == "23" and listed["has_more"]
    assert listed["sessions"][0]["id"] == ids[0] and listed["sessions"][0]["pinned"]
    everything = (await pal("--json", "sessions", "list", "--profile", profile, "-n", "50", env=env)).json()
    assert {s["id"] for s in everything["sessions"]} == set(ids)


async def test_list_of_an_unused_profile_says_so(profile, env):
    ran = await pal("sessions", "list", "--profile", profile, env=env)
    assert ran.code == 0 and "no sessions yet" in ran.stdout


# -- show, rename, pin, share ---------------------------------------------------------------------
async def test_show_prints_the_display_history(store, profile, env):
    s = await new_session(
        store, profile, *chat_messages(("What is the capital of France?", "Paris.")), name="geography"
    )
    ran = await pal("sessions", "show", s.id, env=env)
    assert ran.code == 0, ran.stderr
    assert "geography" in ran.stdout and s.id in ran.stdout
    assert ran.stdout.index("What is the capital of France?") < ran.stdout.index("Paris.")

    last = await pal("sessions", "show", s.id, "--last", "1", env=env)
    assert "Paris." in last.stdout and "capital of France" not in last.stdout

    data = (await pal("sessions", "show", s.id, "--json", env=env)).json()
    assert [m["content"] for m in data["messages"]] == ["What is the capital of France?", "Paris."]


async def test_show_without_an_id_prints_the_most_recent_session(store, profile, env):
    older = await new_session(store, profile, *chat_messages(("first question", "first answer")))
    newer = await new_session(store, profile, *chat_messages(("second question", "second answer")))
    await store.UpdateSession(pb.UpdateSessionRequest(session_id=older.id, pinned=True))  # pinned is not newer
    ran = await pal("sessions", "show", "--profile", profile, env=env)
    assert ran.code == 0, ran.stderr
    assert newer.id in ran.stdout and "second answer" in ran.stdout and "first answer" not in ran.stdout
    none = await pal("sessions", "show", "--profile", f"{profile}-unused", env=env)
    none.assert_one_line_error("no sessions of profile")


async def test_rename_and_pin_change_what_list_shows(store, profile, env):
    s = await new_session(store, profile)
    await new_session(store, profile, name="newer")

    renamed = await pal("sessions", "rename", s.id, "Quarterly", "report", env=env)
    assert renamed.code == 0 and "Quarterly report" in renamed.stdout
    assert (await pal("sessions", "pin", s.id, "--json", env=env)).json() == {"session_id": s.id, "pinned": True}

    listed = (await pal("sessions", "list", "--profile", profile, "--json", env=env)).json()["sessions"]
    assert (listed[0]["name"], listed[0]["pinned"]) == ("Quarterly report", True)

    assert (await pal("sessions", "pin", s.id, "--off", env=env)).stdout.startswith("unpinned")
    listed = (await pal("sessions", "list", "--profile", profile, "--json", env=env)).json()["sessions"]
    assert listed[0]["name"] == "newer"


async def test_share_prints_a_token_that_reads_the_session(store, profile, env):
    s = await new_session(store, profile, *chat_messages(("hello", "hi there")), name="shared one")
    ran = await pal("sessions", "share", s.id, env=env)
    assert ran.code == 0, ran.stderr
    token = ran.stdout.strip()
    shared = await store.GetShared(pb.GetSharedRequest(token=token))
    assert shared.name == "shared one" and [m.content for m in shared.messages] == ["hello", "hi there"]
    assert (await pal("sessions", "share", s.id, "--json", env=env)).json()["token"] == token


# -- trim, delete, cleanup --------------------------------------------------------------------------
async def test_trim_keeps_the_newest_messages(store, profile, env):
    s = await new_session(store, profile, *chat_messages(*[(f"q{i}", f"a{i}") for i in range(5)]))
    ran = await pal("sessions", "trim", s.id, "--keep", "4", env=env)
    assert ran.code == 0 and "kept 4 of 10" in ran.stdout
    got = await store.GetSession(pb.GetSessionRequest(session_id=s.id, view=pb.SESSION_VIEW_DISPLAY))
    assert [m.content for m in got.session.messages] == ["q3", "a3", "q4", "a4"]
    (await pal("sessions", "trim", s.id, "--keep", "0", env=env)).assert_one_line_error("--keep")


async def test_delete_removes_the_session(store, profile, env):
    s = await new_session(store, profile, *chat_messages(("a", "b")))
    ran = await pal("sessions", "delete", s.id, env=env)
    assert ran.code == 0 and f"deleted {s.id}" in ran.stdout
    gone = await pal("sessions", "show", s.id, env=env)
    gone.assert_one_line_error(s.id)


async def test_cleanup_deletes_only_the_callers_sessions_and_asks_before_deleting_all(
    store_server_auth, store_auth, user, profile
):
    from palimpsest.shared.auth import make_token

    mine = [await new_session_as(store_auth, user, profile) for _ in range(2)]
    theirs = await new_session_as(store_auth, f"other-{uuid.uuid4().hex[:6]}", profile)
    env = pal_env(store=store_server_auth.address, PALIMPSEST_TOKEN=make_token(user, JWT_SECRET))

    (await pal("sessions", "cleanup", "--older-than", "0", env=env)).assert_one_line_error("--yes")
    # Nothing of the caller's is idle for 30 days; int64 counts are strings in proto3 JSON.
    assert (await pal("sessions", "cleanup", "--older-than", "30", "--json", env=env)).json()["deleted"] == "0"
    done = (await pal("sessions", "cleanup", "--older-than", "0", "--yes", "--json", env=env)).json()
    assert sorted(done["session_ids"]) == sorted(s.id for s in mine)
    admin = bearer("root-admin", "admin")
    assert (await store_auth.GetSession(pb.GetSessionRequest(session_id=theirs.id), metadata=admin)).session.id


async def new_session_as(store_auth, user: str, profile: str) -> common_pb2.Session:
    return (await store_auth.CreateSession(pb.CreateSessionRequest(profile_id=profile), metadata=bearer(user))).session


async def test_credentials_come_from_palimpsest_token(store_server_auth, store_auth, user, profile):
    from palimpsest.shared.auth import make_token

    s = await new_session_as(store_auth, user, profile)
    ok = await pal(
        "sessions",
        "list",
        "--profile",
        profile,
        "--json",
        env=pal_env(store=store_server_auth.address, PALIMPSEST_TOKEN=make_token(user, JWT_SECRET)),
    )
    assert [x["id"] for x in ok.json()["sessions"]] == [s.id]
    missing = await pal("sessions", "list", env=pal_env(store=store_server_auth.address))
    missing.assert_one_line_error("PALIMPSEST_TOKEN")
    stranger = await pal(
        "sessions",
        "show",
        s.id,
        env=pal_env(store=store_server_auth.address, PALIMPSEST_TOKEN=make_token("someone-else", JWT_SECRET)),
    )
    stranger.assert_one_line_error("another owner")


# -- search -------------------------------------------------------------------------------------
async def test_search_finds_sessions_with_snippets_and_positions(store, profile, env):
    word = f"zanzibar{uuid.uuid4().hex[:6]}"
    hit = await new_session(
        store,
        profile,
        *chat_messages(("plan a trip", f"Consider {word} in June."), (f"why {word}?", "The weather.")),
        name="travel",
    )
    await new_session(store, profile, *chat_messages(("plan a budget", "Spreadsheet.")))
    ran = await pal("sessions", "search", word, env=env)
    assert ran.code == 0, ran.stderr
    assert hit.id in ran.stdout and "travel" in ran.stdout and "2×" in ran.stdout
    found = (await pal("sessions", "search", word, "--json", env=env)).json()
    assert [s["id"] for s in found["sessions"]] == [hit.id]
    assert found["sessions"][0]["matches"]["display_indices"] == ["1", "2"]
    assert word in found["sessions"][0]["matches"]["snippet"]
    nothing = await pal("sessions", "search", f"absent{uuid.uuid4().hex}", env=env)
    assert nothing.code == 0 and "no session mentions" in nothing.stdout


async def test_search_ranks_the_best_match_first(store, profile, env):
    tag = uuid.uuid4().hex[:8]
    three = await new_session(store, profile, *chat_messages((f"zebra{tag} okapi{tag} giraffe{tag}", "ok")))
    two = await new_session(store, profile, *chat_messages((f"zebra{tag} and okapi{tag} notes", "ok")))
    found = (await pal("sessions", "search", f"okapi{tag}", f"giraffe{tag}", f"zebra{tag}", "--json", env=env)).json()
    # All three words first, though the other is newer; two of three still match, after it.
    assert [s["id"] for s in found["sessions"]] == [three.id, two.id]


# -- context --------------------------------------------------------------------------------------
async def test_context_shows_what_the_model_sees_after_compression(store, profile, env):
    s = await new_session(
        store, profile, *chat_messages(("old question", "old answer"), ("recent question", "recent answer"))
    )
    await store.CommitCompression(
        pb.CommitCompressionRequest(
            session_id=s.id,
            demote_seqs=[1, 2],
            summary=Message(
                role="user",
                content="Summary: the user asked an old question.",
                replaces=common_pb2.SeqRange(first=1, last=2),
            ),
            marker=Message(role="assistant", content="Compressed 2 messages"),
            context_token_count=42,
        )
    )

    ran = await pal("context", s.id, env=env)
    assert ran.code == 0, ran.stderr
    assert "Summary: the user asked an old question." in ran.stdout and "summary" in ran.stdout
    assert "recent question" in ran.stdout and "old answer" not in ran.stdout
    assert "42 tokens" in ran.stdout
    data = (await pal("context", s.id, "--json", env=env)).json()
    assert data["context"][0]["content"].startswith("Summary:")
    assert data["messages"] == []  # the CONTEXT view carries no display history

    shown = await pal("sessions", "show", s.id, env=env)
    assert "old answer" in shown.stdout and "context compressed here" in shown.stdout


# -- errors -------------------------------------------------------------------------------------
async def test_store_down_is_one_line_naming_the_address():
    for args in (("sessions", "list"), ("sessions", "show", str(uuid.uuid4())), ("context", str(uuid.uuid4()))):
        ran = await pal(*args, env=pal_env())
        ran.assert_one_line_error("cannot reach the SessionStore at 127.0.0.1:1", "make run")


async def test_unknown_and_malformed_session_ids_are_one_line(env):
    unknown = str(uuid.uuid4())
    for args in (
        ("sessions", "show", unknown),
        ("context", unknown),
        ("sessions", "delete", unknown),
        ("sessions", "rename", unknown, "x"),
        ("sessions", "share", unknown),
    ):
        (await pal(*args, env=env)).assert_one_line_error(unknown)
    (await pal("sessions", "show", "not-an-id", env=env)).assert_one_line_error("not-an-id", "session id")


async def test_usage_errors_exit_with_two():
    ran = await pal("sessions", "frobnicate", env=pal_env())
    assert ran.code == 2 and "Traceback" not in ran.stderr


# -- health -------------------------------------------------------------------------------------
async def test_health_reports_each_service_and_fails_when_one_is_down(store_server, compressor_server):
    env = pal_env(store=store_server.address, compressor=compressor_server.address)
    ran = await pal("health", env=env)
    assert ran.code == 1 and "Traceback" not in ran.stderr
    data = (await pal("health", "--json", env=env)).json()
    status = {row["service"]: row["status"] for row in data["services"]}
    assert status == {"SessionStore": "SERVING", "Compressor": "SERVING", "Agent": "UNREACHABLE"}
    assert data["healthy"] is False
    agent_row = next(row for row in data["services"] if row["service"] == "Agent")
    assert "cannot reach the Agent at 127.0.0.1:1" in agent_row["error"]


async def test_every_compressor_replica_is_checked(store_server, compressor_server):
    env = pal_env(store=store_server.address, compressor=f"{compressor_server.address},{CLOSED}")
    rows = (await pal("health", "--json", env=env)).json()["services"]
    assert [(r["address"], r["status"]) for r in rows if r["service"] == "Compressor"] == [
        (compressor_server.address, "SERVING"),
        (CLOSED, "UNREACHABLE"),
    ]


def test_grpc_status_codes_read_as_one_line():
    from palimpsest.cli.errors import describe_rpc_error

    class Failed(grpc.RpcError):
        def __init__(self, code: grpc.StatusCode, details: str) -> None:
            self._code, self._details = code, details

        def code(self) -> grpc.StatusCode:
            return self._code

        def details(self) -> str:
            return self._details

    refused = Failed(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; last error: Connection refused")
    assert (
        str(describe_rpc_error(refused, "Agent", "h:1")) == "cannot reach the Agent at h:1: is it running? (make run)"
    )
    ollama = Failed(grpc.StatusCode.UNAVAILABLE, "Ollama is not running at http://127.0.0.1:11434")
    assert str(describe_rpc_error(ollama, "Agent", "h:1")) == "Ollama is not running at http://127.0.0.1:11434"
    # The Agent answered; it is *its* store that is down, and its message says so.
    store_down = Failed(grpc.StatusCode.UNAVAILABLE, "SessionStore at s:1 is not answering: failed to connect")
    assert str(describe_rpc_error(store_down, "Agent", "h:1")) == store_down.details()
    assert (
        str(describe_rpc_error(Failed(grpc.StatusCode.NOT_FOUND, "session x not found"), "S", "a"))
        == "session x not found"
    )
    assert "PALIMPSEST_TOKEN" in str(describe_rpc_error(Failed(grpc.StatusCode.UNAUTHENTICATED, "bad"), "S", "a"))
    assert "did not answer in time" in str(describe_rpc_error(Failed(grpc.StatusCode.DEADLINE_EXCEEDED, ""), "S", "a"))

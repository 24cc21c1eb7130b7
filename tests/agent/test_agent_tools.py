"""The agent's built-in tools against a real SessionStore (gRPC + PostgreSQL) and the Ollama simulator."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from dataclasses import replace
from typing import Any

import pytest
from PIL import Image

from ollama_sim import Reply
from palimpsest.agent.conversation import StoredConversation
from palimpsest.agent.profiles import Profile
from palimpsest.agent.tools.base import SpawnRequest, ToolContext, ToolResult, TurnState, schema
from palimpsest.agent.tools.plan import (
    MAX_STEPS,
    analysis_prompt,
    cap_steps,
    follow_up,
    parse_analysis,
    parse_steps,
    run_subagent_planning,
    windowed_request,
)
from palimpsest.agent.tools.registry import BUILTIN, execute, tools_for
from palimpsest.shared.auth import serve_caller
from palimpsest.shared.channels import open_channel
from palimpsest.shared.errors import InvalidArgument
from palimpsest.shared.ollama import OllamaClient
from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as store_pb
from palimpsest.v1.session_store_pb2_grpc import SessionStoreStub
from tests.conftest import bearer
from tests.helpers.calls import append, full, new_session
from tests.helpers.event_sinks import drained, recording_sink

# Each test starts from the simulator's deterministic echo.
pytestmark = pytest.mark.usefixtures("fresh_sim")

Message = common_pb2.Message


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture
async def ollama(ollama_sim):
    client = OllamaClient(ollama_sim.url)
    yield client
    await client.aclose()


@pytest.fixture
async def agent_store(store_server, base_settings):
    """The store as the Agent reaches it: errors as PalimpsestErrors, the served caller's credentials."""
    async with open_channel(store_server.address, base_settings, service="SessionStore") as channel:
        yield SessionStoreStub(channel)


@pytest.fixture
async def agent_store_auth(store_server_auth, base_settings):
    async with open_channel(store_server_auth.address, base_settings, service="SessionStore") as channel:
        yield SessionStoreStub(channel)


@pytest.fixture
def make_ctx(agent_store, ollama, base_settings):
    """A ToolContext as the loop builds one, with a fresh sink and turn state unless given;
    ``metadata``: the credentials of the request being served (what the Agent's server sets)."""

    def make(
        session_id: str = "",
        *,
        profile: Profile | None = None,
        state: TurnState | None = None,
        metadata: tuple[tuple[str, str], ...] = (),
        **kw: Any,
    ) -> ToolContext:
        serve_caller(metadata)
        kw.setdefault("store", agent_store)
        kw.setdefault("settings", base_settings)
        kw.setdefault("window", 8192)
        if session_id:  # the loop's writer: the turn's own conversation, revision and all
            kw.setdefault("update_session", StoredConversation(kw["store"], session_id).update)
        return ToolContext(
            session_id=session_id,
            ollama=ollama,
            profile=profile or Profile(),
            events=recording_sink(session_id),
            state=state or TurnState(),
            **kw,
        )

    return make


async def call(name: str, ctx: ToolContext, **args: Any) -> ToolResult:
    return await execute(BUILTIN[name], args, ctx)


# -- todo --------------------------------------------------------------------------------------
async def test_todo_survives_into_the_next_turn_through_session_metadata(make_ctx, store, profile):
    s = await new_session(store, profile)
    ctx = make_ctx(s.id)
    await call("todo", ctx, action="set", items=["read the spec", "write the parser"])
    added = await call("todo", ctx, action="add", items=["ship it"])
    assert not added.is_error and [i.id for i in ctx.state.todo] == ["1", "2", "3"]
    await call("todo", ctx, action="update", id="1", status="done")
    await call("todo", ctx, action="update", id="2", status="in_progress")

    next_turn = make_ctx(s.id)  # a fresh TurnState, as a new turn gets
    listed = await call("todo", next_turn, action="list")
    assert listed.content.splitlines() == [
        "Todo (1/3 done):",
        "[x] 1. read the spec",
        "[~] 2. write the parser",
        "[ ] 3. ship it",
    ]
    assert not listed.untrusted and not next_turn.state.todo_changed
    stored = (await full(store, s.id)).metadata["todo"]
    assert [(i["text"], i["status"]) for i in stored] == [
        ("read the spec", "done"),
        ("write the parser", "in_progress"),
        ("ship it", "pending"),
    ]


async def test_forward_moves_count_as_progress_and_every_change_is_flagged(make_ctx, store, profile):
    s = await new_session(store, profile)
    ctx = make_ctx(s.id)
    await call("todo", ctx, action="set", items=["one", "two"])
    assert ctx.state.todo_changed and ctx.state.todo_progress == 0
    ctx.state.todo_changed = False
    await call("todo", ctx, action="update", id="1", status="in_progress")
    await call("todo", ctx, action="update", id="1", status="done")
    assert ctx.state.todo_progress == 2 and ctx.state.todo_changed
    await call("todo", ctx, action="update", id="1", status="pending")  # reopening is a change, not progress
    await call("todo", ctx, action="update", id="2", status="done")  # skipping ahead is one move
    assert ctx.state.todo_progress == 3
    ctx.state.todo_changed = False
    await call("todo", ctx, action="list")
    assert not ctx.state.todo_changed


async def test_done_needs_a_validation_only_when_the_profile_asks(make_ctx, store, profile):
    s = await new_session(store, profile)
    strict = make_ctx(s.id, profile=Profile(step_validation_enabled=True))
    await call("todo", strict, action="set", items=["migrate"])
    refused = await call("todo", strict, action="update", id="1", status="done")
    assert refused.is_error and "validation" in refused.content
    assert strict.state.todo[0].status == "pending" and strict.state.todo_progress == 0
    accepted = await call("todo", strict, action="update", id="1", status="done", validation="tests pass")
    assert not accepted.is_error and "(validated: tests pass)" in accepted.content

    relaxed = make_ctx(s.id)
    await call("todo", relaxed, action="set", items=["migrate"])
    assert not (await call("todo", relaxed, action="update", id="1", status="done")).is_error


async def test_todo_mistakes_come_back_as_readable_errors(make_ctx):
    ctx = make_ctx()
    unknown = await call("todo", ctx, action="update", id="9", status="done")
    assert unknown.is_error and "no item with id '9'" in unknown.content
    bad_status = await call("todo", ctx, action="update", id="1", status="finished")
    assert bad_status.is_error and "status" in bad_status.content
    empty = await call("todo", ctx, action="set", items=[])
    assert empty.is_error and "items" in empty.content


async def test_a_subagents_todo_never_overwrites_the_parents(make_ctx, store, profile):
    s = await new_session(store, profile)
    parent = make_ctx(s.id)
    await call("todo", parent, action="set", items=["parent step"])
    child = make_ctx(s.id, is_subagent=True)
    await call("todo", child, action="set", items=["child step"])
    assert [i.text for i in child.state.todo] == ["child step"]
    assert [i["text"] for i in (await full(store, s.id)).metadata["todo"]] == ["parent step"]


# -- plan: parsing -----------------------------------------------------------------------------
ANALYSIS_COMPLEX = """**TASK:** Move the billing service to the new database
GOAL: billing reads and writes only the new database
UNKNOWNS:
- none
RESOURCES:
- session_search
- the migration runbook
COMPLEXITY: **complex** (many dependent steps)
SUBTASKS:
1. back up
2. migrate
- goal: keep downtime short
COMMITMENTS: - a report of what moved
"""


def steps_text(n: int) -> str:
    return "\n".join(f"{i}. Step number {i} — SELF" for i in range(1, n + 1))


def test_analysis_reads_fields_through_markdown_bullets_and_none():
    a = parse_analysis(ANALYSIS_COMPLEX)
    assert a.task == "Move the billing service to the new database"
    assert a.goal == "billing reads and writes only the new database"
    assert a.complexity == "complex" and a.unknowns == []
    assert a.resources == ["session_search", "the migration runbook"]
    # a lower-case "goal:" inside a list stays a list item
    assert a.subtasks == ["back up", "migrate", "goal: keep downtime short"]
    assert a.commitments == ["a report of what moved"] and not a.direct


def test_analysis_without_a_complexity_is_medium():
    assert parse_analysis("TASK: something").complexity == "medium"
    assert parse_analysis("COMPLEXITY: Simple.").complexity == "simple"


def test_direct_is_read_but_only_offered_to_subagents():
    assert parse_analysis("DIRECT").direct and parse_analysis("**DIRECT**\n").direct
    assert parse_analysis("COMPLEXITY: DIRECT").direct
    assert not parse_analysis("TASK: go direct to the source").direct
    assert "DIRECT" in analysis_prompt(is_subagent=True)
    assert "DIRECT" not in analysis_prompt(is_subagent=False)


def test_steps_carry_their_executor_and_milestone():
    steps = parse_steps("""Here is the plan.
MILESTONE: Prepare
1. Back up the database — TOOL: run_shell
2. **Read** the runbook [TOOL: read_file]
## Milestone 2: Execute
3) Run the migration (AGENT: dba)
Step 4: Check the self-check output — SELF
5. Report to the user
""")
    assert [(s.number, s.text, s.executor_label, s.milestone) for s in steps] == [
        (1, "Back up the database", "TOOL: run_shell", "Prepare"),
        (2, "Read the runbook", "TOOL: read_file", "Prepare"),
        (3, "Run the migration", "AGENT: dba", "Execute"),
        (4, "Check the self-check output", "SELF", "Execute"),
        (5, "Report to the user", "SELF", "Execute"),
    ]


def test_a_numbered_overview_before_the_steps_is_not_taken_for_steps():
    steps = parse_steps("MILESTONES:\n1. Ready\n2. Done\nSTEPS:\n1. Do it — SELF\n2. Report — SELF")
    assert [s.text for s in steps] == ["Do it", "Report"]


def test_plans_are_cut_to_their_complexitys_depth_and_never_past_twenty():
    steps = parse_steps(steps_text(25))
    assert len(cap_steps(steps, "complex")) == MAX_STEPS == 20
    assert len(cap_steps(steps, "medium")) == 9
    assert [s.number for s in cap_steps(steps, "simple")] == [1, 2, 3]
    assert len(cap_steps(steps, "unknown")) == 20
    assert len(cap_steps(steps[:2], "complex")) == 2


def test_the_planner_sees_recent_history_with_the_original_task_pinned():
    conversation = [Message(role="system", content="persona"), Message(role="user", content="ORIGINAL: build a CLI")]
    conversation += [Message(role="assistant", content="x" * 3000) for _ in range(10)]
    conversation.append({"role": "user", "content": "now add tests"})
    text = windowed_request(conversation, limit=8000)
    assert len(text) <= 8000 + 100
    assert text.startswith("ORIGINAL TASK (pinned): ORIGINAL: build a CLI")
    assert text.endswith("USER: now add tests") and "persona" not in text
    short = windowed_request([Message(role="user", content="hi")], task="plan a trip")
    assert short == "USER: hi\n\nUSER: plan a trip"


def test_follow_up_waits_for_the_user_only_on_complex_main_agent_plans():
    assert "WAIT for the user's confirmation" in follow_up("complex", is_subagent=False)
    assert "Proceed" in follow_up("medium", is_subagent=False)
    assert follow_up("complex", is_subagent=True) == "Plan is ready. Execute it now."


# -- plan: the pipeline ------------------------------------------------------------------------
PLAN_REPLY = """MILESTONE: Safety first
1. Find the earlier migration session — TOOL: session_search
2. Back up the billing tables — AGENT: default
MILESTONE: Move
3. Copy the data — SELF
4. Switch the connection string — SELF
5. Verify row counts — SELF
6. Report to the user — SELF
"""


def plan_ctx(make_ctx, session_id: str, **kw) -> ToolContext:
    ctx = make_ctx(session_id, conversation=[Message(role="user", content="Move billing to the new database")], **kw)
    ctx.tool_schemas = [schema(t) for t in BUILTIN.values()]
    return ctx


async def test_a_complex_plan_fills_the_todo_logs_itself_and_waits_for_the_user(make_ctx, store, profile, ollama_sim):
    s = await new_session(store, profile)
    ollama_sim.script(Reply(text=ANALYSIS_COMPLEX, thinking="hidden"), Reply(text=PLAN_REPLY, thinking="hidden"))
    ctx = plan_ctx(make_ctx, s.id)
    result = await call("plan", ctx)

    assert not result.is_error and not result.untrusted
    assert "WAIT for the user's confirmation" in result.content
    bodies = ollama_sim.bodies()
    assert len(bodies) == 2
    assert all(b["think"] is False and b["stream"] is False for b in bodies)  # qwen3.6 can think
    assert "DIRECT" not in bodies[0]["messages"][0]["content"]
    assert "Move billing to the new database" in bodies[0]["messages"][1]["content"]
    assert "session_search" in bodies[1]["messages"][0]["content"]  # the tools a step may use
    assert "AGENT: <profile id>" in bodies[1]["messages"][0]["content"]

    events = drained(ctx.events)
    assert [e.WhichOneof("event") for e in events] == ["planning_status", "planning_status", "plan_ready"]
    ready = events[-1].plan_ready
    assert ready.complexity == "complex" and len(ready.steps) == 6
    assert ready.steps[0] == "Find the earlier migration session — TOOL: session_search"
    assert result.metadata["plan"] == ready.plan and "Milestone: Safety first" in ready.plan

    assert ctx.state.todo_changed
    assert ctx.state.goal == "billing reads and writes only the new database"
    assert [i.text for i in ctx.state.todo] == list(ready.steps)
    session = await full(store, s.id)
    assert [i["status"] for i in session.metadata["todo"]] == ["pending"] * 6
    log_entry = session.planning_logs[-1]
    assert log_entry["complexity"] == "complex" and log_entry["kind"] == "plan" and len(log_entry["steps"]) == 6


async def test_a_medium_plan_says_proceed_and_a_model_without_thinking_gets_no_think(
    make_ctx, store, profile, ollama_sim
):
    s = await new_session(store, profile)
    ollama_sim.script(Reply(text="TASK: tidy\nCOMPLEXITY: medium"), Reply(text=steps_text(12)))
    ctx = plan_ctx(make_ctx, s.id, profile=Profile(model="tiny"))
    result = await call("plan", ctx)
    assert "Proceed" in result.content and "WAIT" not in result.content
    assert all("think" not in b for b in ollama_sim.bodies())
    assert len(ctx.state.todo) == 9  # medium: at most 9 steps


async def test_replanning_frames_a_revision_with_the_current_todo(make_ctx, store, profile, ollama_sim):
    s = await new_session(store, profile)
    ctx = plan_ctx(make_ctx, s.id)
    await call("todo", ctx, action="set", items=["old step A", "old step B"])
    await call("todo", ctx, action="update", id="1", status="done")
    ollama_sim.script(Reply(text="TASK: t\nCOMPLEXITY: simple"), Reply(text="1. New approach — SELF"))
    result = await call("plan", ctx, reason="the API was removed", updated_goal="use the v2 API")
    analysis_body = ollama_sim.bodies()[0]["messages"]
    assert "REVISION" in analysis_body[0]["content"]
    packed = analysis_body[1]["content"]
    assert "the API was removed" in packed and "use the v2 API" in packed and "[x] 1. old step A" in packed
    assert result.metadata["plan"].startswith("Revised plan")
    assert [i.text for i in ctx.state.todo] == ["New approach — SELF"]
    assert (await full(store, s.id)).planning_logs[-1]["kind"] == "replan"


async def test_a_subagent_may_skip_planning_with_direct_but_the_main_agent_may_not(
    make_ctx, store, profile, ollama_sim
):
    s = await new_session(store, profile)
    planner = Profile(subagent_planning_enabled=True)
    child = make_ctx(s.id, profile=planner, is_subagent=True)
    ollama_sim.script(Reply(text="DIRECT"))
    assert await run_subagent_planning(child, "print the date") is None
    assert len(ollama_sim.bodies()) == 1 and "DIRECT" in ollama_sim.bodies()[0]["messages"][0]["content"]
    assert not child.state.todo

    ollama_sim.script(Reply(text="TASK: t\nCOMPLEXITY: simple"), Reply(text="1. Look it up — SELF\n2. Answer — SELF"))
    plan = await run_subagent_planning(child, "find the release date")
    assert plan and "1. Look it up — SELF" in plan and len(child.state.todo) == 2
    assert "todo" not in (await full(store, s.id)).metadata  # the parent's todo is untouched

    main = plan_ctx(make_ctx, s.id)
    ollama_sim.script(Reply(text="DIRECT"), Reply(text="1. Do it — SELF"))
    result = await call("plan", main)
    assert not result.is_error and [i.text for i in main.state.todo] == ["Do it — SELF"]


async def test_a_subagent_calling_plan_is_told_to_execute_not_to_wait(make_ctx, store, profile, ollama_sim):
    s = await new_session(store, profile)
    ollama_sim.script(Reply(text=ANALYSIS_COMPLEX), Reply(text=PLAN_REPLY))
    result = await call("plan", plan_ctx(make_ctx, s.id, is_subagent=True))
    assert result.content.startswith("Plan is ready. Execute it now.") and "WAIT" not in result.content
    assert "Copy the data" not in result.content  # the plan itself travels once, in metadata["plan"]
    assert "Copy the data" in result.metadata["plan"]


async def test_subagent_planning_is_off_unless_the_profile_enables_it(make_ctx, ollama_sim):
    assert await run_subagent_planning(make_ctx(is_subagent=True), "anything") is None
    assert ollama_sim.bodies() == []


async def test_a_failing_planner_model_is_an_error_result_not_a_crash(make_ctx, store, profile, ollama_sim):
    s = await new_session(store, profile)
    ollama_sim.script(Reply(http_status=500, error="out of memory"))
    result = await call("plan", plan_ctx(make_ctx, s.id))
    assert result.is_error and "plan failed" in result.content and "out of memory" in result.content


# -- memory_search -----------------------------------------------------------------------------
def chunk(content: str, first: int, last: int, *crumbs: str) -> common_pb2.RawChunk:
    raw = common_pb2.RawChunk(
        content=content, turn_range=common_pb2.SeqRange(first=first, last=last), breadcrumbs=list(crumbs)
    )
    raw.first_at.FromSeconds(1_780_000_000)
    raw.last_at.FromSeconds(1_780_000_600)
    return raw


async def test_memory_search_returns_compressed_passages_with_their_place(make_ctx, store, profile):
    s = await new_session(store, profile)
    await store.IndexChunks(
        store_pb.IndexChunksRequest(
            session_id=s.id,
            chunks=[
                chunk("user: the postgres migration failed on the invoices table lock", 4, 9, "postgres migration"),
                chunk("user: what is a good pizza dough hydration? assistant: about 65 percent", 10, 13, "pizza"),
            ],
        )
    )
    ctx = make_ctx(s.id)
    found = await call("memory_search", ctx, query="postgres migration", limit=3)
    assert not found.is_error and not found.untrusted  # as trusted as the (clean) session
    first = found.content.split("\n\n")[1]
    assert "messages 4–9" in first and "topics: postgres migration" in first and "invoices table lock" in first
    assert "2026-05-28 20:26 UTC → 2026-05-28 20:36 UTC" in first

    nothing = await call("memory_search", ctx, query="zebra quantum")
    assert not nothing.is_error and nothing.content.startswith("No matches for 'zebra quantum'")
    tainted = await call("memory_search", make_ctx(s.id, untrusted=True), query="pizza")
    assert tainted.untrusted
    too_many = await call("memory_search", ctx, query="pizza", limit=11)
    assert too_many.is_error and "limit" in too_many.content


# -- session_search ----------------------------------------------------------------------------
@pytest.fixture
async def my_sessions(store_auth, user, profile):
    """Three sessions of one user, plus one of a stranger with the same words."""
    me = bearer(user)
    made = {}
    for name, words in (
        ("Trip to Lisbon", "book a hotel near the river"),
        ("Cluster upgrade", "upgrade kubernetes to 1.31 and drain the nodes"),
        ("", "kubernetes ingress keeps returning 502"),
    ):
        s = (
            await store_auth.CreateSession(
                store_pb.CreateSessionRequest(profile_id=profile, name=name, model="m1"), metadata=me
            )
        ).session
        await store_auth.AppendMessages(
            store_pb.AppendMessagesRequest(
                session_id=s.id,
                messages=[
                    Message(role="user", content=words),
                    Message(role="assistant", content="On it."),
                    Message(role="tool", name="run_shell", content="output " * 400),
                    Message(role="user", content="later: check the disk quota too"),
                ],
            ),
            metadata=me,
        )
        made[name or "untitled"] = s.id
    stranger = bearer(f"{user}-other")
    other = (
        await store_auth.CreateSession(
            store_pb.CreateSessionRequest(profile_id=profile, name="Kubernetes secrets"), metadata=stranger
        )
    ).session
    made["stranger"] = other.id
    return me, made


async def test_session_search_lists_only_the_callers_sessions(make_ctx, agent_store_auth, my_sessions):
    me, made = my_sessions
    ctx = make_ctx(made["Trip to Lisbon"], store=agent_store_auth, metadata=me)
    listed = await call("session_search", ctx, action="list")
    assert listed.untrusted and "3 most recent of 3 sessions" in listed.content
    assert f"{made['Trip to Lisbon']} (this session) · Trip to Lisbon · 4 messages" in listed.content
    assert made["stranger"] not in listed.content and "model m1" in listed.content


async def test_session_search_finds_messages_and_names(make_ctx, agent_store_auth, my_sessions):
    me, made = my_sessions
    ctx = make_ctx(store=agent_store_auth, metadata=me)
    searched = await call("session_search", ctx, action="search", query="kubernetes")
    assert "2 sessions match 'kubernetes', best first" in searched.content
    assert made["Cluster upgrade"] in searched.content and made["untitled"] in searched.content
    assert "1 matching messages (at 0): upgrade kubernetes" in searched.content
    assert made["stranger"] not in searched.content

    found = await call("session_search", ctx, action="find", query="lisbon")
    assert made["Trip to Lisbon"] in found.content and made["Cluster upgrade"] not in found.content
    by_task = await call("session_search", ctx, action="find", query="ingress")  # the task of an unnamed one
    assert made["untitled"] in by_task.content and made["Cluster upgrade"] not in by_task.content
    later_words = await call("session_search", ctx, action="find", query="disk quota")  # in messages only
    assert later_words.content.startswith("No session's name or task contains 'disk quota'")
    assert (
        "3 sessions match 'disk quota'"
        in (await call("session_search", ctx, action="search", query="disk quota")).content
    )


async def test_session_search_finds_a_session_by_two_of_the_querys_words(
    make_ctx, agent_store_auth, my_sessions, profile
):
    me, made = my_sessions
    fixed = (
        await agent_store_auth.CreateSession(
            store_pb.CreateSessionRequest(profile_id=profile, name="pool"), metadata=me
        )
    ).session
    await agent_store_auth.AppendMessages(
        store_pb.AppendMessagesRequest(
            session_id=fixed.id,
            messages=[Message(role="user", content="We fixed the OOM bug in the default worker pool")],
        ),
        metadata=me,
    )
    ctx = make_ctx(made["Trip to Lisbon"], store=agent_store_auth, metadata=me)
    searched = await call("session_search", ctx, action="search", query="OOM worker")
    assert "1 session match 'OOM worker'" in searched.content and fixed.id in searched.content
    assert "1 matching messages (at 0): We fixed the OOM bug" in searched.content
    # The best match comes first: all of the query's words before two of three.
    ranked = await call("session_search", ctx, action="search", query="upgrade kubernetes ingress 502")
    assert ranked.content.index(made["untitled"]) < ranked.content.index(made["Cluster upgrade"])


async def test_session_search_get_reads_a_history_compactly_and_refuses_others(make_ctx, agent_store_auth, my_sessions):
    me, made = my_sessions
    ctx = make_ctx(store=agent_store_auth, metadata=me)
    got = await call("session_search", ctx, action="get", session_id=made["Cluster upgrade"])
    lines = got.content.splitlines()
    assert lines[0].startswith(f"Session {made['Cluster upgrade']} · Cluster upgrade · 4 messages")
    assert lines[1] == "[0] user: upgrade kubernetes to 1.31 and drain the nodes"
    assert lines[3].startswith("[2] tool run_shell → output") and "more chars]" in lines[3]
    later = await call("session_search", ctx, action="get", session_id=made["Cluster upgrade"], start=2)
    assert "[0] user" not in later.content and "[2] tool" in later.content

    refused = await call("session_search", ctx, action="get", session_id=made["stranger"])
    assert refused.is_error and "no session" in refused.content
    missing = await call("session_search", ctx, action="get", session_id="not-an-id")
    assert missing.is_error
    no_query = await call("session_search", ctx, action="search")
    assert no_query.is_error and "'query' is required" in no_query.content


async def test_a_long_history_is_capped_with_a_note_to_read_on(make_ctx, store, profile):
    s = await new_session(store, profile, name="long")
    await append(store, s.id, *[Message(role="user", content=f"message {i} " + "y" * 1500) for i in range(30)])
    got = await call("session_search", make_ctx(), action="get", session_id=s.id)
    assert len(got.content) < 21_000
    assert "later messages not shown" in got.content and "start=" in got.content


# -- image_view --------------------------------------------------------------------------------
def png(width: int = 12, height: int = 7) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (10, 200, 30)).save(out, "PNG")
    return out.getvalue()


async def put(store, session_id: str, data: bytes, filename: str = "", kind=store_pb.FILE_KIND_IMAGE):
    async def parts():
        yield store_pb.PutFileRequest(
            header=store_pb.PutFileHeader(session_id=session_id, filename=filename, kind=kind)
        )
        yield store_pb.PutFileRequest(chunk=data)

    return (await store.PutFile(parts())).file


async def test_image_view_attaches_a_stored_image_by_name_or_path(make_ctx, store, profile):
    s = await new_session(store, profile)
    data = png()
    stored = await put(store, s.id, data)
    assert stored.name == "image_1.png"
    ctx = make_ctx(s.id)
    for path in ("image_1.png", f"session_files/{s.id}/image_1.png", stored.path):
        result = await call("image_view", ctx, path=path)
        assert result.content == "Image image_1.png (12×7) is attached.", path
        assert result.images == [data] and result.untrusted and not result.is_error


async def test_image_view_refuses_missing_files_non_images_and_other_sessions(make_ctx, store, profile):
    s = await new_session(store, profile)
    await put(store, s.id, png())
    await put(store, s.id, b"just text", filename="notes.txt", kind=store_pb.FILE_KIND_UNSPECIFIED)
    ctx = make_ctx(s.id)
    missing = await call("image_view", ctx, path="image_7.png")
    assert missing.is_error and "Images in this session: image_1.png" in missing.content
    text = await call("image_view", ctx, path="notes.txt")
    assert text.is_error and "not an image" in text.content
    other = await call("image_view", ctx, path="session_files/0b0e7a52-5b6f-4c53-a3c1-0d1f2e3a4b5c/image_1.png")
    assert other.is_error and "another session" in other.content
    blind = await call("image_view", make_ctx(s.id, profile=Profile(model="tiny")), path="image_1.png")
    assert blind.is_error and "cannot see images" in blind.content


# -- spawn_agent -------------------------------------------------------------------------------
class RecordingSpawn:
    """Stands in for the Agent's sub-agent runner (tested end to end elsewhere)."""

    def __init__(self, text: str = "done: 3 files", completed: bool = True):
        self.requests: list[SpawnRequest] = []
        self.reply = (text, completed)

    async def __call__(self, request: SpawnRequest) -> tuple[str, bool]:
        self.requests.append(request)
        return self.reply


async def test_spawn_agent_passes_every_field_and_reports_how_it_ended(make_ctx):
    spawn = RecordingSpawn()
    ctx = make_ctx("1b9d6bcd-bbfd-4b2d-9b5d-ab8dfbbd4bed", spawn=spawn)
    result = await call(
        "spawn_agent",
        ctx,
        task="count the files",
        profile_id="researcher",
        exclude_tools=["spawn_agent"],
        briefing="be quick",
        custom_system_prompt="You count.",
        inherit_system_prompt=True,
        context_transfer="the repo is /src",
        timeout_seconds=60,
        max_iterations="12",
    )
    assert spawn.requests == [
        SpawnRequest(
            text="count the files",
            profile_id="researcher",
            max_iterations=12,
            exclude_tools=("spawn_agent",),
            briefing="be quick",
            custom_system_prompt="You count.",
            inherit_system_prompt=True,
            context_transfer="the repo is /src",
            parent_session_id="1b9d6bcd-bbfd-4b2d-9b5d-ab8dfbbd4bed",
            timeout_seconds=60.0,
        )
    ]
    assert result.content.startswith("Sub-agent (researcher) finished normally.") and "done: 3 files" in result.content
    assert result.untrusted and result.metadata["completed_normally"] is True

    spawn.reply = ("half way", False)
    partial = await call("spawn_agent", ctx, task="again")
    assert "did NOT finish" in partial.content and spawn.requests[-1].max_iterations == 40
    assert spawn.requests[-1].profile_id == ""  # the Agent resolves the parent's profile


async def test_spawn_agent_refuses_without_a_runner_and_with_bad_limits(make_ctx):
    no_spawn = await call("spawn_agent", make_ctx(), task="x")
    assert no_spawn.is_error and "not available" in no_spawn.content
    ctx = make_ctx(spawn=RecordingSpawn())
    assert "max_iterations" in (await call("spawn_agent", ctx, task="x", max_iterations=0)).content
    assert "timeout_seconds" in (await call("spawn_agent", ctx, task="x", timeout_seconds=-1)).content
    assert "'task' is required" in (await call("spawn_agent", ctx)).content


# -- switch_profile ----------------------------------------------------------------------------
@pytest.fixture
def profiles_path(tmp_path) -> str:
    path = tmp_path / "profiles.json"
    path.write_text(
        json.dumps(
            {
                "default": "default",
                "profiles": [
                    {"id": "default"},
                    {"id": "coder", "name": "Coder", "description": "writes code", "model": "tiny"},
                ],
            }
        )
    )
    return str(path)


async def test_switch_profile_records_the_switch_for_the_loop(make_ctx, store, profile, base_settings, profiles_path):
    s = await new_session(store, profile)
    ctx = make_ctx(s.id, settings=replace(base_settings, profiles_path=profiles_path))
    result = await call("switch_profile", ctx, profile_id="coder")
    assert not result.is_error and "Switched to profile coder (Coder: writes code)" in result.content
    assert ctx.state.switched_profile == "coder"
    stored = await full(store, s.id)
    assert (stored.profile_id, stored.provider, stored.model) == ("coder", "ollama", "tiny")  # with its model

    unknown = await call("switch_profile", ctx, profile_id="poet")
    assert unknown.is_error and "Configured: default, coder" in unknown.content
    assert (await call("switch_profile", ctx, profile_id="../etc")).is_error
    child = make_ctx(s.id, is_subagent=True, settings=ctx.settings)
    assert (await call("switch_profile", child, profile_id="default")).is_error


# -- registry and execute ----------------------------------------------------------------------
class EchoTool:
    name = "echo"
    description = "Repeat the text."
    parameters = {
        "type": "object",
        "properties": {"text": {"type": "string"}, "times": {"type": "integer"}},
        "required": ["text"],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult(content=args["text"] * args.get("times", 1), untrusted=False)


class BrokenTool(EchoTool):
    name = "broken"

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        raise RuntimeError("disk on fire")


ECHO = EchoTool()


def test_tools_for_keeps_the_profiles_order_and_drops_exclusions():
    tools = tools_for(["todo", "plan", "spawn_agent"], exclude=["spawn_agent", "not-there"])
    assert list(tools) == ["todo", "plan"] and tools["plan"] is BUILTIN["plan"]


def test_unknown_tool_names_are_a_configuration_error_naming_the_field():
    with pytest.raises(InvalidArgument) as err:
        tools_for(["todo", "telepathy"])
    assert err.value.field == "tools" and "telepathy" in str(err.value)


def test_custom_tools_load_from_module_attribute_paths():
    tools = tools_for(["todo", "echo"], custom=[f"{__name__}:EchoTool", f"{__name__}:BrokenTool"])
    assert list(tools) == ["todo", "echo", "broken"] and isinstance(tools["echo"], EchoTool)
    assert tools_for([], custom=[f"{__name__}:ECHO"])["echo"] is ECHO
    for bad in ("no_colon", f"{__name__}:Missing", "no.such.module:Tool", f"{__name__}:png"):
        with pytest.raises(InvalidArgument) as err:
            tools_for([], custom=[bad])
        assert err.value.field == "custom_tools"


async def test_execute_turns_bad_arguments_and_failures_into_error_results(make_ctx, caplog):
    ctx = make_ctx()
    assert (await execute(ECHO, {"text": "ab", "times": "2"}, ctx)).content == "abab"  # "2" is forgiven
    missing = await execute(ECHO, {}, ctx)
    assert missing.is_error and "'text' is required" in missing.content and "Parameters: text, times" in missing.content
    wrong = await execute(ECHO, {"text": "a", "times": "many"}, ctx)
    assert wrong.is_error and "'times' must be a whole number" in wrong.content
    assert (await execute(ECHO, "not json", ctx)).is_error
    assert (await execute(ECHO, ["a"], ctx)).is_error
    bad_enum = await execute(BUILTIN["todo"], {"action": "explode"}, ctx)
    assert bad_enum.is_error and "must be one of set, add, update, list" in bad_enum.content
    with caplog.at_level(logging.ERROR, logger="palimpsest.agent.tools"):
        broken = await execute(BrokenTool(), {"text": "a"}, ctx)
    assert broken.is_error and broken.content == "broken failed: RuntimeError: disk on fire"
    assert any("broken" in r.getMessage() for r in caplog.records)


async def test_execute_lets_a_stop_through(make_ctx):
    running = asyncio.Event()

    class Slow(EchoTool):
        async def run(self, args, ctx):
            running.set()
            await asyncio.Event().wait()  # until cancelled

    task = asyncio.create_task(execute(Slow(), {"text": "a"}, make_ctx()))
    await running.wait()  # the stop comes while the tool runs, not before it started
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

"""MCP servers per profile: real servers made with the SDK's MCPServer (tests/helpers/mcp_server.py), run as
processes — stdio ones spawned by the Agent, an HTTP one by the test — that the tests kill, hang and
flood, against the real Agent, the SessionStore on PostgreSQL and the Ollama simulator scripting the
model's tool calls."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from typing import Any

import grpc
import pytest

from ollama_sim import Reply
from palimpsest.agent.mcp_servers.config import McpServerConfig, parse_servers
from palimpsest.agent.mcp_servers.results import MAX_TEXT_CHARS, convert
from palimpsest.agent.mcp_servers.schemas import Malformed, parameters
from palimpsest.agent.profiles import ProfileRegistry, ProfilesFileError, profile_from_dict
from palimpsest.agent.tools.base import Reach, reach_of
from palimpsest.agent.tools.registry import tools_for
from palimpsest.shared.errors import InvalidArgument
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import session_store_pb2 as store_pb
from tests.conftest import CHECKOUT
from tests.helpers.calls import END, end_of, run
from tests.helpers.mcp_agents import FAILED, READY, agent_with, profile, servers_settled, statuses, stdio_server
from tests.helpers.pal_cli import pal, pal_env
from tests.helpers.waiting import until

# Each test starts from the simulator's deterministic echo.
pytestmark = pytest.mark.usefixtures("fresh_sim")


def start_http_server(port: int = 0) -> tuple[subprocess.Popen, int]:
    """The test server over streamable HTTP, a process of the test's own, and its port."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.mcp_server", "http", str(port)],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(CHECKOUT)},
        text=True,
    )
    return proc, int(proc.stdout.readline())  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def http_server():
    proc, port = start_http_server()
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
async def mcp_agent(base_settings, store_server, compressor_server, ollama_sim, tmp_path_factory, http_server):
    """One Agent with the profiles most tests use: servers shared, filtered, missing, over HTTP."""
    tmp = tmp_path_factory.mktemp("mcp")
    profiles = [
        profile(
            "tools",
            [stdio_server("echo", tmp)],
            critical_tools=["mcp__echo"],
            tools={"agent": ["todo", "spawn_agent"], "subagent": ["todo", "mcp__echo__lookup"]},
        ),
        profile("filtered", [stdio_server("echo", tmp, tools=["lookup", "picture"])]),
        profile("ghost", [{"name": "ghost", "command": [str(tmp / "no-such-server")]}]),
        profile("web", [{"name": "web", "url": http_server, "headers": {"X-Palimpsest-Test": "1"}}]),
        profile("hasty", [stdio_server("hasty", tmp, timeout_s=1)]),
        profile("frozen", [stdio_server("frozen", tmp, timeout_s=1)]),
        profile("collide", [stdio_server("echo", tmp)], custom_tools=["tests.agent.test_mcp_servers:Impostor"]),
    ]
    async with agent_with(base_settings, store_server, compressor_server, ollama_sim, tmp, profiles) as (stub, running):
        assert await until(lambda: servers_settled(stub), timeout=60)
        yield stub, running, tmp


async def server_state(agent, profile_id: str, name: str) -> pb.McpServerStatus:
    return (await statuses(agent))[profile_id][name]


def calls(*tool_calls: tuple[str, dict[str, Any]]) -> Reply:
    return Reply(tool_calls=list(tool_calls))


def finished(events) -> list[pb.ToolFinished]:
    return [e.tool_finished for e in events if e.HasField("tool_finished")]


def tool_names(body: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in body.get("tools") or []]


def tool_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body["messages"] if m["role"] == "tool"]


async def session_of(store, events) -> Any:
    return (
        await store.GetSession(
            store_pb.GetSessionRequest(session_id=events[0].session_id, view=store_pb.SESSION_VIEW_FULL)
        )
    ).session


class Impostor:
    """A custom tool that takes a name from the MCP servers' namespace."""

    name = "mcp__echo__lookup"
    description = "Not the server's."
    parameters = {"type": "object", "properties": {}}

    async def run(self, args, ctx):
        return "impostor"


# -- a real turn --------------------------------------------------------------------------------
async def test_the_model_calls_an_mcp_tool_and_reads_its_text_and_image(mcp_agent, ollama_sim, store):
    agent, _, _ = mcp_agent
    ollama_sim.script(calls(("mcp__echo__picture", {"caption": "sunset"})), Reply(text="a red square"))
    events = await run(agent, "show me", profile_id="tools")
    assert end_of(events).reason == END.STREAM_END_REASON_COMPLETED
    [done] = finished(events)
    assert done.name == "mcp__echo__picture" and not done.is_error and "caption: sunset" in done.preview
    first, second = ollama_sim.bodies()
    offered = {t["function"]["name"]: t["function"] for t in first["tools"]}
    assert offered["mcp__echo__picture"]["parameters"] == {
        "type": "object",
        "properties": {"caption": {"type": "string"}},
        "required": ["caption"],
    }
    assert offered["mcp__echo__picture"]["description"] == "A picture with a caption."
    [result] = tool_messages(second)
    assert result["tool_name"] == "mcp__echo__picture" and "caption: sunset" in result["content"]
    [image] = result["images"]
    assert base64.b64decode(image).startswith(b"\x89PNG")
    session = await session_of(store, events)
    stored = next(m for m in session.messages if m.role == "tool")
    assert len(stored.images) == 1 and stored.metadata["mcp_server"] == "echo"
    assert stored.is_compression_critical  # critical_tools names the whole server: mcp__echo
    # Outside content: it taints the conversation and the episode.
    assert session.untrusted_ingested and session.episode_untrusted


async def test_an_http_servers_tools_are_called_in_a_turn(mcp_agent, ollama_sim):
    agent, _, _ = mcp_agent
    ollama_sim.script(
        calls(("mcp__web__lookup", {"query": "tides"}), ("mcp__web__header", {"name": "X-Palimpsest-Test"})),
        Reply(text="ok"),
    )
    events = await run(agent, "look it up", profile_id="web")
    done, header = finished(events)
    assert not done.is_error and done.preview == "found: tides"
    assert header.preview == "1"  # the entry's headers go with every request
    web = await server_state(agent, "web", "web")
    assert web.state == READY and web.target.startswith("http: http://127.0.0.1:") and web.target.endswith("/mcp")


async def test_an_entrys_tools_list_offers_only_those(mcp_agent, ollama_sim):
    agent, _, _ = mcp_agent
    await run(agent, "hello", profile_id="filtered")
    mcp_offered = [n for n in tool_names(ollama_sim.bodies()[-1]) if n.startswith("mcp__")]
    assert mcp_offered == ["mcp__echo__lookup", "mcp__echo__picture"]
    assert list((await server_state(agent, "filtered", "echo")).tools) == mcp_offered


async def test_a_malformed_schema_leaves_out_that_tool_not_the_server(mcp_agent, ollama_sim):
    agent, _, _ = mcp_agent
    echo = await server_state(agent, "tools", "echo")
    assert echo.state == READY and "mcp__echo__lookup" in echo.tools
    assert "mcp__echo__weird" not in echo.tools
    assert list(echo.skipped_tools) == ["weird: type 5 is not a JSON Schema type"]
    await run(agent, "hello", profile_id="tools")
    assert "mcp__echo__weird" not in tool_names(ollama_sim.bodies()[-1])


async def test_a_stdio_server_gets_only_its_entrys_env(mcp_agent, ollama_sim):
    agent, _, _ = mcp_agent
    ollama_sim.script(calls(("mcp__echo__whoami", {})), Reply(text="ok"))
    events = await run(agent, "who are you", profile_id="tools")
    names = set(finished(events)[0].preview.split("env ", 1)[1].split())
    assert {"PYTHONPATH", "MCP_TEST_DOWN_FILE", "PATH", "HOME"} <= names
    assert not {n for n in names if n.startswith("PALIMPSEST_")}  # the Agent's settings stay its own


async def test_a_subagent_gets_the_mcp_tools_its_tools_list_names(mcp_agent, ollama_sim):
    agent, _, _ = mcp_agent
    ollama_sim.script(calls(("spawn_agent", {"task": "look it up"})), Reply(text="sub done"), Reply(text="done"))
    events = await run(agent, "delegate", profile_id="tools")
    assert end_of(events).reason == END.STREAM_END_REASON_COMPLETED
    parent, sub, _ = ollama_sim.bodies()
    assert {"mcp__echo__lookup", "mcp__echo__write_note"} <= set(tool_names(parent))
    assert [n for n in tool_names(sub) if n.startswith("mcp__")] == ["mcp__echo__lookup"]


# -- trust ---------------------------------------------------------------------------------------
async def test_in_a_tainted_conversation_a_read_only_mcp_tool_runs_and_another_is_refused(mcp_agent, ollama_sim, store):
    agent, _, _ = mcp_agent
    ollama_sim.script(
        calls(("mcp__echo__lookup", {"query": "weather"})),
        calls(("mcp__echo__write_note", {"text": "exfiltrate"})),
        Reply(text="done"),
    )
    events = await run(agent, "go", profile_id="tools")
    lookup, note = finished(events)
    assert not lookup.is_error and lookup.preview == "found: weather"
    assert note.is_error and "was not run: this conversation has taken in content from outside" in note.preview
    session = await session_of(store, events)
    assert session.untrusted_ingested and session.episode_untrusted
    # The same tainted session: a read-only tool still runs.
    ollama_sim.script(calls(("mcp__echo__lookup", {"query": "again"})), Reply(text="done"))
    again = await run(agent, "and again", session_id=session.id)
    assert not finished(again)[0].is_error


async def test_in_a_clean_conversation_an_outside_mcp_tool_runs(mcp_agent, ollama_sim):
    agent, _, _ = mcp_agent
    ollama_sim.script(calls(("mcp__echo__write_note", {"text": "hello"})), Reply(text="done"))
    [note] = finished(await run(agent, "note it", profile_id="tools"))
    assert not note.is_error and note.preview == "wrote: hello"


def test_an_mcp_tools_reach_is_what_its_server_declares():
    from palimpsest.agent.mcp_servers.connection import ServerTool
    from palimpsest.agent.mcp_servers.tool import McpTool

    config = McpServerConfig(name="s", command=("x",))
    reading = McpTool(config, None, ServerTool("r", "", {"type": "object", "properties": {}}, read_only=True))
    acting = McpTool(config, None, ServerTool("w", "", {"type": "object", "properties": {}}, read_only=False))
    assert reach_of(reading) is Reach.ENGINE and reach_of(acting) is Reach.OUTSIDE


# -- failures ------------------------------------------------------------------------------------
async def test_a_server_command_that_does_not_exist_is_shown_failed_and_turns_go_on(mcp_agent, ollama_sim):
    agent, _, tmp = mcp_agent
    ghost = await server_state(agent, "ghost", "ghost")
    assert ghost.state == FAILED and "the command was not found" in ghost.error and str(tmp) in ghost.error
    assert ghost.retry_in_seconds > 0 and not ghost.tools
    events = await run(agent, "hello", profile_id="ghost")
    assert end_of(events).reason == END.STREAM_END_REASON_COMPLETED


async def test_a_hanging_tool_is_a_deadline_error_and_the_turn_completes(mcp_agent, ollama_sim):
    agent, _, _ = mcp_agent
    ollama_sim.script(calls(("mcp__hasty__hang", {})), Reply(text="it hung"))
    events = await run(agent, "wait for it", profile_id="hasty")
    assert end_of(events).reason == END.STREAM_END_REASON_COMPLETED
    [hung] = finished(events)
    assert hung.is_error and "no answer from MCP server hasty within 1 s" in hung.preview
    # One tool hung, not the server: the same connection answers the next call.
    ollama_sim.script(calls(("mcp__hasty__lookup", {"query": "still there"})), Reply(text="ok"))
    assert finished(await run(agent, "and now", profile_id="hasty"))[0].preview == "found: still there"
    assert (await server_state(agent, "hasty", "hasty")).state == READY


async def test_a_server_that_stops_answering_is_restarted(mcp_agent, ollama_sim):
    agent, _, _ = mcp_agent
    ollama_sim.script(calls(("mcp__frozen__whoami", {})), calls(("mcp__frozen__freeze", {})), Reply(text="frozen"))
    events = await run(agent, "freeze it", profile_id="frozen")
    assert end_of(events).reason == END.STREAM_END_REASON_COMPLETED
    who, frozen = finished(events)
    pid = int(who.preview.split()[1])
    assert frozen.is_error and "no answer from MCP server frozen within 1 s" in frozen.preview
    # Not a tool that hangs: the server lists nothing either, so it is taken for lost and started anew.
    assert await until(lambda: _pid_changed(agent, ollama_sim, pid), timeout=90)


async def _pid_changed(agent, ollama_sim, pid: int) -> bool:
    if (await server_state(agent, "frozen", "frozen")).state != READY:
        return False
    ollama_sim.script(calls(("mcp__frozen__whoami", {})), Reply(text="ok"))
    [who] = finished(await run(agent, "who now", profile_id="frozen"))
    return not who.is_error and int(who.preview.split()[1]) != pid


async def test_a_call_in_flight_blocks_neither_the_agent_nor_other_calls(mcp_agent, ollama_sim):
    agent, _, tmp = mcp_agent
    first_asked = threading.Event()  # set in the simulator's thread

    def model(body: dict[str, Any]) -> Reply:
        if tool_messages(body):
            return Reply(text="done")
        if "wait" in body["messages"][-1]["content"]:
            first_asked.set()
            return calls(("mcp__echo__block", {}))
        return calls(("mcp__echo__lookup", {"query": "meanwhile"}))

    ollama_sim.set_responder(model)
    blocked = asyncio.create_task(run(agent, "wait for the release", profile_id="tools"))
    assert await until(first_asked.is_set)
    meanwhile = await run(agent, "look something up", profile_id="tools")
    assert finished(meanwhile)[0].preview == "found: meanwhile"
    assert (await statuses(agent))["tools"]["echo"].state == READY  # the Agent answers too
    assert not blocked.done()  # the first call is still waiting on the server
    (tmp / "echo.release").write_text("go")
    [released] = finished(await blocked)
    assert released.preview == "released"


async def test_a_killed_server_is_a_tool_error_then_restarted(mcp_agent, ollama_sim):
    agent, _, tmp = mcp_agent
    ollama_sim.script(calls(("mcp__echo__whoami", {})), Reply(text="ok"))
    pid = int(finished(await run(agent, "who", profile_id="tools"))[0].preview.split()[1])
    down = tmp / "echo.down"
    down.write_text("keep it down")  # its restarts fail until the test lets it up
    try:
        os.kill(pid, signal.SIGKILL)
        assert await until(lambda: _state_is(agent, "tools", "echo", FAILED))
        ollama_sim.script(calls(("mcp__echo__lookup", {"query": "x"})), Reply(text="it is down"))
        events = await run(agent, "look", profile_id="tools")
        assert end_of(events).reason == END.STREAM_END_REASON_COMPLETED
        [failed] = finished(events)
        assert failed.is_error and "MCP server echo is not available" in failed.preview
        assert "tried again in" in failed.preview
    finally:
        down.unlink()
    assert await until(lambda: _state_is(agent, "tools", "echo", READY), timeout=90)
    ollama_sim.script(calls(("mcp__echo__whoami", {})), Reply(text="back"))
    [back] = finished(await run(agent, "who now", profile_id="tools"))
    assert not back.is_error and int(back.preview.split()[1]) != pid


async def test_an_http_server_that_goes_away_is_a_tool_error_then_reached_again(
    base_settings, store_server, compressor_server, ollama_sim, tmp_path
):
    proc, port = start_http_server()
    web = {"name": "web", "url": f"http://127.0.0.1:{port}/mcp"}
    try:
        async with agent_with(
            base_settings, store_server, compressor_server, ollama_sim, tmp_path, [profile("web", [web])]
        ) as (agent, _):
            assert await until(lambda: _state_is(agent, "web", "web", READY))
            proc.kill()
            proc.wait()
            assert await until(lambda: _state_is(agent, "web", "web", FAILED))
            ollama_sim.script(calls(("mcp__web__lookup", {"query": "x"})), Reply(text="it is away"))
            events = await run(agent, "look")
            assert end_of(events).reason == END.STREAM_END_REASON_COMPLETED
            assert "MCP server web is not available" in finished(events)[0].preview
            proc, _ = start_http_server(port)  # back on its address
            assert await until(lambda: _state_is(agent, "web", "web", READY), timeout=90)
            ollama_sim.script(calls(("mcp__web__lookup", {"query": "y"})), Reply(text="back"))
            assert finished(await run(agent, "look again"))[0].preview == "found: y"
    finally:
        proc.kill()
        proc.wait()


async def _state_is(agent, profile_id: str, name: str, state: int) -> bool:
    return (await server_state(agent, profile_id, name)).state == state


async def test_a_name_collision_with_a_custom_tool_is_a_configuration_error(mcp_agent):
    agent, _, _ = mcp_agent
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await run(agent, "hello", profile_id="collide")
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "custom_tools" in refused.value.details() and "mcp__echo__lookup" in refused.value.details()
    with pytest.raises(InvalidArgument) as err:
        tools_for([], custom=["tests.agent.test_mcp_servers:Impostor"])
    assert err.value.field == "custom_tools"


# -- the tool list changes -----------------------------------------------------------------------
@pytest.mark.parametrize("era", ["2026-07-28", "2025-11-25"])
async def test_list_changed_adds_a_tool_for_the_next_turn_not_the_running_one(
    era, base_settings, store_server, compressor_server, ollama_sim, tmp_path, monkeypatch
):
    if era != "2026-07-28":  # the handshake of older servers: the notification comes on the connection itself
        from mcp import Client

        from palimpsest.agent.mcp_servers import connection

        monkeypatch.setattr(connection, "Client", lambda *a, **kw: Client(*a, **{**kw, "mode": "legacy"}))
    async with agent_with(
        base_settings,
        store_server,
        compressor_server,
        ollama_sim,
        tmp_path,
        [profile("grow", [stdio_server("echo", tmp_path)])],
    ) as (agent, _):
        ollama_sim.script(calls(("mcp__echo__grow", {})), Reply(text="grown"))
        events = await run(agent, "grow")
        assert end_of(events).reason == END.STREAM_END_REASON_COMPLETED
        assert await until(lambda: _offers(agent, "grow", "echo", "mcp__echo__added"))
        first, second = ollama_sim.bodies()
        assert tool_names(first) == tool_names(second)  # the running turn's tool block did not move
        ollama_sim.script(calls(("mcp__echo__added", {"n": 4})), Reply(text="ok"))
        events = await run(agent, "use it", session_id=events[0].session_id)
        assert "mcp__echo__added" in tool_names(ollama_sim.bodies()[2])
        assert finished(events)[0].preview == "added 4"


async def _offers(agent, profile_id: str, name: str, tool: str) -> bool:
    return tool in (await server_state(agent, profile_id, name)).tools


async def test_a_flood_of_list_changed_notifications_is_read_a_few_times(
    base_settings, store_server, compressor_server, ollama_sim, tmp_path
):
    async with agent_with(
        base_settings,
        store_server,
        compressor_server,
        ollama_sim,
        tmp_path,
        [profile("flood", [stdio_server("echo", tmp_path)])],
    ) as (agent, running):
        connection = next(iter(running.servicer.deps.mcp._connections.values()))
        before = connection.listings
        # 200 notifications, one every 5 ms: a listing for each would be 200 round trips.
        ollama_sim.script(calls(("mcp__echo__flood", {"count": 200, "every_ms": 5})), Reply(text="flooded"))
        events = await run(agent, "flood")
        assert finished(events)[0].preview == "flooded 200"
        assert await until(lambda: _offers(agent, "flood", "echo", "mcp__echo__flooded"))
        assert (await server_state(agent, "flood", "echo")).state == READY
        assert connection.listings - before <= 6


async def test_the_agents_stop_leaves_no_server_process(
    base_settings, store_server, compressor_server, ollama_sim, tmp_path
):
    mute = tmp_path / "mute.pid"  # a server that starts and never says a word
    silent = {
        "name": "mute",
        "command": [
            sys.executable,
            "-c",
            f"import os, time; open({str(mute)!r}, 'w').write(str(os.getpid())); time.sleep(3600)",
        ],
    }
    async with agent_with(
        base_settings,
        store_server,
        compressor_server,
        ollama_sim,
        tmp_path,
        [profile("one", [stdio_server("echo", tmp_path)]), profile("mute", [silent])],
    ) as (agent, _):
        assert await until(lambda: _state_is(agent, "one", "echo", READY))
        ollama_sim.script(calls(("mcp__echo__whoami", {})), Reply(text="ok"))
        pid = int(finished(await run(agent, "who"))[0].preview.split()[1])
        assert await until(mute.exists)
        assert (await server_state(agent, "mute", "mute")).state == pb.MCP_SERVER_STATE_CONNECTING
    for gone in (pid, int(mute.read_text())):
        with pytest.raises(ProcessLookupError):
            os.kill(gone, 0)


async def test_an_edit_of_the_profiles_file_starts_and_stops_servers(
    base_settings, store_server, compressor_server, ollama_sim, tmp_path
):
    async with agent_with(
        base_settings, store_server, compressor_server, ollama_sim, tmp_path, [profile("plain", [])]
    ) as (agent, _):
        assert (await statuses(agent))["plain"] == {}
        path = tmp_path / "profiles.json"
        path.write_text(json.dumps({"profiles": [profile("plain", [stdio_server("echo", tmp_path)])]}))
        assert await until(lambda: _state_is(agent, "plain", "echo", READY))  # ListProfiles reads the edit
        ollama_sim.script(calls(("mcp__echo__whoami", {})), Reply(text="ok"))
        pid = int(finished(await run(agent, "who"))[0].preview.split()[1])
        path.write_text(json.dumps({"profiles": [profile("plain", [], name="Plain again")]}))
        assert (await statuses(agent))["plain"] == {}
        assert await until(lambda: not _alive(pid))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# -- visibility ----------------------------------------------------------------------------------
async def test_pal_profiles_and_health_show_each_servers_state_and_tools(mcp_agent, store_server, compressor_server):
    agent, running, _ = mcp_agent
    env = pal_env(store=store_server.address, agent=running.address, compressor=compressor_server.address)
    shown = await pal("profiles", env=env)
    assert shown.code == 0, shown.stderr
    assert "tools · echo (stdio: python): ready" in shown.stdout
    assert "mcp__echo__lookup" in shown.stdout and "left out: weird: type 5 is not a JSON Schema type" in shown.stdout
    assert "ghost · ghost (stdio: no-such-server): failed: the command was not found" in shown.stdout
    assert "restarting in" in shown.stdout
    listed = (await pal("profiles", "--json", env=env)).json()
    ghost = next(p for p in listed["profiles"] if p["id"] == "ghost")["mcp_servers"][0]
    assert ghost["state"] == "MCP_SERVER_STATE_FAILED"
    health = await pal("health", "--json", env=env)
    assert health.code == 0, health.stdout  # a server down costs its tools, not the Agent's health
    mcp = next(row for row in health.json()["services"] if row["service"] == "MCP")
    assert mcp["status"] == "NOT_SERVING" and "ghost: failed: the command was not found" in mcp["error"]


# -- configuration, schemas and results (pure) ---------------------------------------------------
@pytest.mark.parametrize(
    "entry, key",
    [
        ({"command": ["x"]}, "name"),
        ({"name": "Echo", "command": ["x"]}, "name"),
        ({"name": "a__b", "command": ["x"]}, "name"),
        ({"name": "a_", "command": ["x"]}, "name"),
        ({"name": "a", "command": []}, "command"),
        ({"name": "a", "command": ["x"], "url": "http://h/mcp"}, "command"),
        ({"name": "a"}, "url"),
        ({"name": "a", "url": "file:///etc/passwd"}, "url"),
        ({"name": "a", "url": "http://h/mcp", "env": {"A": "b"}}, "env"),
        ({"name": "a", "command": ["x"], "headers": {"A": "b"}}, "headers"),
        ({"name": "a", "command": ["x"], "env": {"A=B": "c"}}, "env"),
        ({"name": "a", "url": "http://h/mcp", "headers": {"X": "a\r\nInjected: 1"}}, "headers"),
        ({"name": "a", "command": ["x"], "tools": "lookup"}, "tools"),
        ({"name": "a", "command": ["x"], "timeout_s": 0}, "timeout_s"),
        ({"name": "a", "command": ["x"], "timeout_s": True}, "timeout_s"),
        ({"name": "a", "command": ["x"], "cwd": "/"}, "cwd"),
    ],
)
def test_a_bad_entry_is_refused_naming_its_key(entry, key):
    with pytest.raises(InvalidArgument) as refused:
        parse_servers([{"name": "ok", "command": ["y"]}, entry], "p")
    assert refused.value.field == f"mcp_servers[1].{key}" and "(profile 'p')" in str(refused.value)


def test_names_are_unique_per_profile_and_tools_lists_must_name_a_server():
    with pytest.raises(InvalidArgument) as twice:
        parse_servers([{"name": "a", "command": ["x"]}, {"name": "a", "url": "https://h/mcp"}], "p")
    assert twice.value.field == "mcp_servers[1].name"
    with pytest.raises(InvalidArgument) as stray:
        profile_from_dict(
            {
                "id": "p",
                "mcp_servers": [{"name": "a", "command": ["x"]}],
                "tools": {"agent": ["todo"], "subagent": ["mcp__b__lookup"]},
            }
        )
    assert stray.value.field == "tools.subagent"
    with pytest.raises(InvalidArgument) as critical:
        profile_from_dict({"id": "p", "critical_tools": ["mcp__nowhere"]})
    assert critical.value.field == "critical_tools"
    fine = profile_from_dict(
        {
            "id": "p",
            "mcp_servers": [{"name": "a", "command": ["x"], "tools": ["t"]}],
            "tools": {"agent": ["todo"], "subagent": ["mcp__a", "mcp__a__t"]},
            "critical_tools": ["mcp__a__t"],
        }
    )
    assert fine.mcp_servers[0].tools == ("t",) and fine.mcp_servers[0].timeout_s == 60.0


def test_a_profiles_file_with_a_bad_server_is_refused_naming_the_entry(tmp_path):
    path = tmp_path / "profiles.json"
    path.write_text(json.dumps({"profiles": [{"id": "p", "mcp_servers": [{"name": "x", "command": "python"}]}]}))
    with pytest.raises(ProfilesFileError) as refused:
        ProfileRegistry.load(str(path))
    assert "mcp_servers[0].command" in str(refused.value) and str(path) in str(refused.value)


def test_profiles_naming_a_server_alike_share_its_connection_whatever_tools_they_offer():
    a, b = parse_servers([{"name": "s", "command": ["x"], "tools": ["t"]}], "p") + parse_servers(
        [{"name": "s", "command": ["x"]}], "q"
    )
    assert a.connection_key == b.connection_key
    assert a.target == "stdio: x"
    [secret] = parse_servers(
        [{"name": "s", "url": "https://u:pw@h.example:8443/mcp?token=abc", "headers": {"Authorization": "Bearer zzz"}}],
        "p",
    )
    assert secret.target == "http: https://h.example:8443/mcp"  # no credentials, no query


def test_schemas_are_projected_onto_what_ollama_takes():
    schema = {
        "type": "object",
        "title": "args",
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "additionalProperties": False,
        "$defs": {"Unit": {"type": "string", "enum": ["c", "f"], "title": "Unit"}},
        "properties": {
            "city": {"type": "string", "description": "Where", "minLength": 1, "format": "hostname"},
            "unit": {"$ref": "#/$defs/Unit", "description": "Which scale"},
            "days": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},
            "mode": {"oneOf": [{"const": "fast"}, {"const": "slow"}]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "where": {"allOf": [{"type": "object", "properties": {"lat": {"type": "number"}}}]},
        },
        "required": ["city"],
    }
    assert parameters(schema) == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "Where"},
            "unit": {"type": "string", "description": "Which scale", "enum": ["c", "f"]},
            "days": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            "mode": {"anyOf": [{"enum": ["fast"]}, {"enum": ["slow"]}]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
        },
        "required": ["city"],
    }
    assert parameters({"type": "object"}) == {"type": "object", "properties": {}}


@pytest.mark.parametrize(
    "schema",
    [
        [],
        {"type": "string"},
        {"type": "object", "properties": []},
        {"type": "object", "required": "city"},
        {"type": "object", "properties": {"x": {"type": 5}}},
        {"type": "object", "properties": {"x": "string"}},
        {"type": "object", "properties": {"x": {"enum": "a"}}},
        {"type": "object", "properties": {"x": {"$ref": "#/$defs/Nope"}}},
        {"type": "object", "properties": {"x": {"$ref": "https://example.test/schema"}}},
        {
            "type": "object",
            "$defs": {"L": {"type": "object", "properties": {"next": {"$ref": "#/$defs/L"}}}},
            "properties": {"x": {"$ref": "#/$defs/L"}},
        },
    ],
)
def test_a_schema_ollama_would_refuse_is_malformed(schema):
    with pytest.raises(Malformed):
        parameters(schema)


def test_a_malformed_tool_is_warned_about_once_not_at_every_listing(caplog):
    import mcp.types as types

    from palimpsest.agent.mcp_servers.connection import McpConnection

    connection = McpConnection(McpServerConfig(name="s", command=("x",)), lambda: None)
    bad = types.Tool(name="bad", input_schema={"type": "object", "properties": {"x": {"type": 5}}})
    good = types.Tool(name="good", input_schema={"type": "object"})
    with caplog.at_level(logging.WARNING, logger="palimpsest.agent.mcp"):
        connection._apply([bad, good])
        connection._apply([bad, good])
    assert [t.name for t in connection.tools] == ["good"] and list(connection.skipped) == ["bad"]
    assert len([r for r in caplog.records if "left out" in r.getMessage()]) == 1


def test_results_keep_text_images_and_resource_text_within_caps():
    import mcp.types as types

    from tests.helpers.mcp_server import png

    picture = base64.b64encode(png()).decode()
    result = types.CallToolResult(
        content=[
            types.TextContent(type="text", text="hello"),
            types.ImageContent(type="image", data=picture, mime_type="image/png"),
            types.ImageContent(type="image", data=base64.b64encode(b"not an image").decode(), mime_type="image/png"),
            types.EmbeddedResource(type="resource", resource=types.TextResourceContents(uri="file:///a.txt", text="A")),
            types.EmbeddedResource(
                type="resource", resource=types.BlobResourceContents(uri="file:///b.bin", blob="AAAA")
            ),
            types.AudioContent(type="audio", data="AAAA", mime_type="audio/wav"),
        ],
        is_error=True,
    )
    converted = convert(result)
    assert converted.is_error and converted.images == [base64.b64decode(picture)]
    assert converted.text.splitlines() == [
        "hello",
        "[image 1 attached: 6×4 image/png]",
        "[an image (image/png) that could not be read was left out]",
        "[resource file:///a.txt]",
        "A",
        "[resource file:///b.bin (binary) is binary: left out]",
        "[audio (audio/wav) left out: the model cannot hear]",
    ]
    image = types.ImageContent(type="image", data=picture, mime_type="image/png")
    long_text = types.TextContent(type="text", text="x" * (MAX_TEXT_CHARS + 10))
    many = convert(types.CallToolResult(content=[image] * 6 + [long_text]))
    assert len(many.images) == 4 and many.text.count("[an image left out: at most 4 images and 8 MB per result]") == 2
    assert len(many.text) < MAX_TEXT_CHARS + 100 and many.metadata["cut_from_chars"] > MAX_TEXT_CHARS
    structured = convert(types.CallToolResult(content=[], structured_content={"answer": 42}))
    assert structured.text == '{"answer": 42}'

"""`pal run/continue/chat --client-tools tools.json`: tools that run on the user's machine, called by the
model in real turns. pal is a real subprocess against the real Agent, SessionStore and Compressor, and
the Ollama simulator scripts the model's tool calls; the tools are small Python programs."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from ollama_sim import Reply
from palimpsest.cli.client_tools import LocalTool, answer_timeout_s, load_tools, run_tool
from palimpsest.cli.errors import CliError
from tests.helpers.calls import full
from tests.helpers.pal_cli import (  # noqa: F401 — importing registers the fixtures
    COMPLETED,
    agent_server_fixture,
    pal,
    pal_env,
    pal_profiles_fixture,
    read_until,
    start_pal,
)
from tests.helpers.relay import Relay
from tests.helpers.waiting import until

# Reads the call's arguments from stdin and answers with the weather of the city.
WEATHER = "import json, sys; print('sunny in ' + json.load(sys.stdin)['city'])"
# Fails the way a broken tool does: a message on stderr and a non-zero status.
BROKEN = "import sys; sys.stderr.write('no route to the weather service'); sys.exit(3)"
# Runs past its limit.
HANGS = "import time; time.sleep(120)"


def tool(name: str, code: str, **more) -> dict:
    return {
        "name": name,
        "description": f"the {name} tool",
        "read_only": True,
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "command": [sys.executable, "-c", code],
        **more,
    }


def tools_file(tmp_path: Path, *tools: dict) -> str:
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(list(tools)))
    return str(path)


def tool_results(ollama_sim) -> list[str]:
    """What the model read as tool results, in the last request that carried any."""
    for body in reversed(ollama_sim.bodies()):
        results = [m["content"] for m in body.get("messages", []) if m["role"] == "tool"]
        if results:
            return results
    return []


@pytest.fixture
def env(agent_server, store_server, compressor_server) -> dict[str, str]:
    return pal_env(store=store_server.address, agent=agent_server.address, compressor=compressor_server.address)


@pytest.fixture(autouse=True)
def fresh_simulator(ollama_sim):
    ollama_sim.set_responder(None)
    ollama_sim.clear()
    yield
    ollama_sim.set_responder(None)


async def test_run_answers_the_models_calls_with_local_commands(env, store, ollama_sim, tmp_path):
    tools = tools_file(
        tmp_path, tool("get_weather", WEATHER), tool("broken", BROKEN), tool("hangs", HANGS, timeout_s=1)
    )
    ollama_sim.script(
        Reply(tool_calls=[("get_weather", {"city": "Lyon"}), ("broken", {}), ("hangs", {})]),
        Reply(text="Sunny in Lyon."),
    )
    ran = await pal("run", "--client-tools", tools, "weather in Lyon?", env=env)
    assert ran.code == 0, ran.stderr
    offered = {t["function"]["name"]: t["function"] for t in ollama_sim.bodies()[0]["tools"]}
    assert offered["get_weather"]["parameters"]["properties"] == {"city": {"type": "string"}}
    weather, broken, hangs = tool_results(ollama_sim)
    assert weather == "sunny in Lyon\n"
    assert broken == "broken exited with status 3: no route to the weather service"
    assert hangs == "hangs timed out after 1 s"
    assert "⇢ get_weather asked of pal" in ran.stdout and "⇠ get_weather answered (14 bytes" in ran.stdout
    assert "⇠ broken answered (failed" in ran.stdout
    assert "Sunny in Lyon." in ran.stdout
    session_id = ran.stdout.split("session ")[-1].split()[0]
    got = await full(store, session_id)
    assert [m.content for m in got.messages if m.role == "tool"] == [weather, broken, hangs]

    ollama_sim.script(Reply(tool_calls=[("get_weather", {"city": "Nice"})]), Reply(text="Sunny in Nice too."))
    more = await pal("continue", "--id", session_id, "--client-tools", tools, "and Nice?", env=env)
    assert more.code == 0, more.stderr
    assert tool_results(ollama_sim)[-1] == "sunny in Nice\n"


async def test_chat_offers_the_tools_with_every_message(env, ollama_sim, tmp_path):
    tools = tools_file(tmp_path, tool("get_weather", WEATHER))
    ollama_sim.script(
        Reply(text="Hello."), Reply(tool_calls=[("get_weather", {"city": "Oslo"})]), Reply(text="Snowy, surely.")
    )
    ran = await pal("chat", "--json", "--client-tools", tools, env=env, stdin="hi\nweather in Oslo?\n")
    assert ran.code == 0, ran.stderr
    events = ran.json_lines()
    (asked,) = [e for e in events if "tool_call_requested" in e]
    assert asked["tool_call_requested"]["name"] == "get_weather"
    assert int(asked["tool_call_requested"]["timeout_seconds"]) == answer_timeout_s(load_tools(tools)) == 60
    assert tool_results(ollama_sim) == ["sunny in Oslo\n"]
    assert "⇠ get_weather answered" in ran.stderr  # --json: stdout holds the events alone
    assert all(
        any(t["function"]["name"] == "get_weather" for t in body["tools"])
        for body in ollama_sim.bodies()
        if body.get("stream", True)
    )


async def test_the_answer_gets_through_when_the_connection_drops_while_the_tool_runs(
    agent_server, store_server, compressor_server, ollama_sim, tmp_path
):
    """The connection to the Agent is cut while the command runs: pal resumes the turn's stream,
    delivers the answer once the Agent is reachable again, and the turn completes."""
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    waits = f"import sys; sys.stdin.read(); print(open({str(gate)!r}).read())"  # until the test opens the gate
    tools = tools_file(tmp_path, tool("slow_lookup", waits))
    ollama_sim.script(Reply(tool_calls=[("slow_lookup", {"city": "Quito"})]), Reply(text="Warm in Quito."))
    host, port = agent_server.address.rsplit(":", 1)
    relay = Relay((host, int(port)))
    await relay.start()
    env = pal_env(store=store_server.address, agent=f"127.0.0.1:{relay.port}", compressor=compressor_server.address)
    proc = await start_pal("run", "--json", "--client-tools", tools, "weather?", env=env)
    shown = await read_until(proc.stdout, "tool_call_requested")
    await relay.cut()
    await asyncio.to_thread(gate.write_text, "warm")  # the command answers while the Agent is out of reach
    await relay.start()
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert "resuming the turn" in err.decode() and "⇠ slow_lookup answered" in err.decode()
    events = [json.loads(line) for line in (shown + out.decode()).splitlines() if line.strip()]
    assert [int(e["seq"]) for e in events] == list(range(1, len(events) + 1))
    assert sum("tool_call_requested" in e for e in events) == 1
    assert events[-1]["stream_end"]["reason"] == COMPLETED
    assert tool_results(ollama_sim) == ["warm\n"]


async def test_an_answer_whose_acknowledgement_was_lost_is_not_reported_undelivered(
    agent_server, store_server, compressor_server, ollama_sim, tmp_path
):
    """The answer reaches the Agent but the connection dies before its acknowledgement comes back: pal
    sends it again, is told the call no longer waits, and knows that means the first one arrived."""
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    waits = f"import sys; sys.stdin.read(); print(open({str(gate)!r}).read())"
    tools = tools_file(tmp_path, tool("slow_lookup", waits))
    ollama_sim.script(Reply(tool_calls=[("slow_lookup", {})]), Reply(text="Done."))
    host, port = agent_server.address.rsplit(":", 1)
    relay = Relay((host, int(port)))
    await relay.start()
    env = pal_env(store=store_server.address, agent=f"127.0.0.1:{relay.port}", compressor=compressor_server.address)
    proc = await start_pal("run", "--json", "--client-tools", tools, "look it up", env=env)
    await read_until(proc.stdout, "tool_call_requested")
    relay.hold_answers()  # what pal sends arrives; nothing comes back
    await asyncio.to_thread(gate.write_text, "found")
    assert await until(lambda: tool_results(ollama_sim) == ["found\n"], timeout=30)  # the Agent took the answer
    await relay.cut()
    relay.thaw()
    await relay.start()
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert "not delivered" not in err.decode() and "⇠ slow_lookup answered" in err.decode()
    assert json.loads(out.decode().splitlines()[-1])["stream_end"]["reason"] == COMPLETED


async def test_ctrl_c_stops_the_turn_and_kills_the_command_still_running(env, ollama_sim, tmp_path):
    started = tmp_path / "started"
    os.mkfifo(started)
    # Says its pid through the FIFO (the test waits for it there), then runs far past the turn.
    lingers = f"import os, time; open({str(started)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    tools = tools_file(tmp_path, tool("lingers", lingers, timeout_s=300))
    ollama_sim.script(Reply(tool_calls=[("lingers", {})]), Reply(text="unused"))
    proc = await start_pal("run", "--client-tools", tools, "go", env=env)
    pid = int(await asyncio.to_thread(started.read_text))
    proc.send_signal(signal.SIGINT)
    async with asyncio.timeout(30):
        out, err = await proc.communicate()
    assert proc.returncode == 130, err.decode()
    assert "turn stopped" in out.decode() and "Traceback" not in err.decode()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped by pal before it left
    assert tool_results(ollama_sim) == []  # the turn ended without asking the model again


async def test_a_bad_tools_file_is_a_usage_error_and_nothing_is_sent(env, ollama_sim, tmp_path):
    path = tmp_path / "tools.json"
    path.write_text(json.dumps([tool("get_weather", WEATHER), {"name": "deploy", "parameters": {"type": "object"}}]))
    ran = await pal("run", "--client-tools", str(path), "go", env=env)
    assert ran.code == 2 and "Traceback" not in ran.stderr
    assert f"{path}: tools[1] (deploy).command: required" in ran.stderr
    # A name the Agent's own tools take is the Agent's refusal, naming the field.
    taken = await pal("run", "--client-tools", tools_file(tmp_path, tool("read_file", WEATHER)), "go", env=env)
    taken.assert_one_line_error("client_tools[0].name")
    assert not ollama_sim.bodies()


# -- the file and the command, without services -----------------------------------------------------
@pytest.mark.parametrize(
    "content, words",
    [
        ("[{not json", ["is not valid JSON"]),
        ('{"name": "x"}', ["non-empty JSON list"]),
        ('[{"command": ["true"]}]', ["tools[0].name: required"]),
        ('[{"name": "a b", "command": ["true"]}]', ["tools[0].name"]),
        ('[{"name": "x", "command": "true"}]', ["tools[0] (x).command"]),
        ('[{"name": "x", "command": []}]', ["tools[0] (x).command"]),
        ('[{"name": "x", "command": ["true"], "parameters": {"type": "array"}}]', ["tools[0] (x).parameters"]),
        (
            '[{"name": "x", "command": ["true"], "parameters": {"type": "object", "properties": {"a": {"type": "nope"}}}}]',
            ["tools[0] (x).parameters", "not a valid JSON schema"],
        ),
        ('[{"name": "x", "command": ["true"], "timeout_s": 0}]', ["tools[0] (x).timeout_s"]),
        ('[{"name": "x", "command": ["true"], "read_only": "yes"}]', ["tools[0] (x).read_only"]),
        ('[{"name": "x", "command": ["true"], "cmd": ["true"]}]', ["tools[0] (x).cmd: unknown field"]),
        ('[{"name": "x", "command": ["true"]}, {"name": "x", "command": ["false"]}]', ["tools[1].name", "twice"]),
    ],
)
def test_a_bad_tools_file_names_the_entry_and_the_field(tmp_path, content, words):
    path = tmp_path / "tools.json"
    path.write_text(content)
    with pytest.raises(CliError) as raised:
        load_tools(str(path))
    assert raised.value.exit_code == 2
    for word in words:
        assert word in str(raised.value)


def test_a_chatty_command_is_cut_and_a_missing_one_is_an_error_result():
    chatty = LocalTool("chatty", "", {"type": "object"}, (sys.executable, "-c", "print('a' * 200_000)"))
    got = run_tool(chatty, "{}")
    assert not got.is_error and got.content.startswith("a" * 65536)
    assert got.content.endswith("[output cut at 64 KB: 134,465 more bytes not shown]")
    missing = run_tool(LocalTool("gone", "", {"type": "object"}, ("/nonexistent/tool",)), "{}")
    assert missing.is_error and missing.content == "gone: cannot run /nonexistent/tool: No such file or directory"

"""run_command through the Agent: a model's command runs in the session's workspace inside the real
sandbox (bubblewrap), its output comes back and what it changed reaches the store; a sandboxed
session stays sandboxed whatever its profile later says (the pin), until the operator lifts it;
a command with the network is outside content and reaches outside the conversation. Real Agents,
the store on PostgreSQL, the Ollama simulator, real processes."""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import replace

import grpc
import pytest

from ollama_sim import Reply
from palimpsest.agent.sandbox import availability
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import agent_pb2_grpc
from palimpsest.v1 import session_store_pb2 as store_pb
from tests.conftest import agent_settings
from tests.helpers.calls import END, file_bytes, full, run

# Each test starts from the simulator's deterministic echo.
pytestmark = pytest.mark.usefixtures("fresh_sim")

HANDS = ["read_file", "write_file", "list_files", "run_command"]


@pytest.fixture(scope="module")
def command_profiles(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("cmd-profiles") / "profiles.json"
    base = {
        "model": "qwen3.6",
        "context_window": 8192,
        "max_iterations": 6,
        "think_enabled": False,
        "memory_recall_enabled": False,
        "tools": {"agent": HANDS},
    }
    path.write_text(
        json.dumps(
            {
                "default": "boxed",
                "profiles": [
                    {**base, "id": "boxed", "sandbox": {"wall_seconds": 20}},
                    {**base, "id": "open", "sandbox": {"enabled": False}},
                    {**base, "id": "online", "sandbox": {"network": True}},
                    {**base, "id": "quick", "sandbox": {"wall_seconds": 1}},
                ],
            }
        )
    )
    return str(path)


async def _agent(base_settings, store_server, compressor_server, ollama_sim, profiles, **overrides):
    from palimpsest.agent.app import start_agent

    settings = replace(
        agent_settings(base_settings, store_server, compressor_server, ollama_sim, profiles), **overrides
    )
    return await start_agent(settings, port=0)


@pytest.fixture(scope="module")
async def agents(base_settings, store_server, compressor_server, ollama_sim, command_profiles):
    """Two Agent replicas on one store; and one whose operator turned the sandbox off."""
    running = [
        await _agent(base_settings, store_server, compressor_server, ollama_sim, command_profiles) for _ in range(2)
    ]
    running.append(
        await _agent(base_settings, store_server, compressor_server, ollama_sim, command_profiles, sandbox_mode="off")
    )
    channels = [grpc.aio.insecure_channel(r.address) for r in running]
    yield [agent_pb2_grpc.AgentStub(c) for c in channels]
    for channel in channels:
        await channel.close()
    for r in running:
        await r.stop(0)


def results(ollama_sim) -> list[str]:
    return [m["content"] for m in ollama_sim.bodies()[-1]["messages"] if m["role"] == "tool"]


async def stored_results(store, session_id: str) -> list:
    return [m for m in (await full(store, session_id)).messages if m.role == "tool"]


def command(text: str) -> Reply:
    return Reply(tool_calls=[("run_command", {"command": text})])


async def test_a_command_runs_in_the_workspace_and_what_it_wrote_is_kept(agents, store, ollama_sim):
    agent = agents[0]
    ollama_sim.script(
        Reply(tool_calls=[("write_file", {"path": "src/app.py", "content": "print(sum(range(10)))\n"})]),
        command("cd src && python3 app.py > out.txt && cat out.txt && rm app.py && echo oops >&2"),
        Reply(text="45"),
    )
    events = await run(agent, "run it")
    session_id = events[0].session_id
    assert events[-1].stream_end.reason == END.STREAM_END_REASON_COMPLETED
    ran = results(ollama_sim)[-1]
    assert ran.startswith("exit code 0") and "stdout:\n45" in ran and "stderr:\noops" in ran
    assert "written to the workspace: src/out.txt" in ran and "deleted from it: src/app.py" in ran
    assert await file_bytes(store, session_id, "src/out.txt") == b"45\n"
    listed = (await store.ListFiles(store_pb.ListFilesRequest(session_id=session_id))).files
    assert [(f.name, f.outside_content) for f in listed] == [("src/out.txt", False)]  # the conversation's own
    session = await full(store, session_id)
    assert session.sandboxed and not session.untrusted_ingested and not session.episode_untrusted
    metadata = (await stored_results(store, session_id))[-1].metadata
    assert metadata["sandboxed"] is True and metadata["exit_code"] == 0


async def test_a_command_on_another_replica_sees_what_the_first_one_made(agents, store, ollama_sim):
    first, second = agents[0], agents[1]
    ollama_sim.script(command("mkdir -p data && seq 3 > data/n.txt"), Reply(text="made"))
    session_id = (await run(first, "make it"))[0].session_id
    ollama_sim.script(command("wc -l < data/n.txt"), Reply(text="3"))
    await run(second, "count", session_id=session_id)
    assert "stdout:\n3" in results(ollama_sim)[-1]


async def test_an_escape_through_the_tool_finds_only_the_sandbox(agents, store, base_settings, ollama_sim):
    other = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="boxed"))).session
    await file_bytes_put(store, other.id, "secret-marker.txt", b"the other session's secret 7741")
    host_path = base_settings.files_root / other.id / "secret-marker.txt"
    assert host_path.read_bytes() == b"the other session's secret 7741"
    attempts = [
        f"cat {host_path}",
        f"cat /proc/1/root{host_path}",
        "find / -name secret-marker.txt 2>/dev/null",
        "cat /etc/shadow",
        "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep PALIMPSEST_",
        "echo x > /usr/owned && echo wrote",
        "ls ../.. /root 2>&1",
    ]
    ollama_sim.script(Reply(tool_calls=[("run_command", {"command": a}) for a in attempts]), Reply(text="no"))
    await run(agents[0], "try")
    for attempt, ran in zip(attempts, results(ollama_sim)):
        out = ran.split("stdout:", 1)[1].split("stderr:", 1)[0]
        assert "7741" not in ran and "root:" not in out and "PALIMPSEST_" not in out and "wrote" not in out, attempt
        assert "secret-marker" not in out, attempt


async def file_bytes_put(store, session_id: str, name: str, data: bytes) -> None:
    from tests.helpers.calls import put_file

    await put_file(store, session_id, name, data)


async def test_the_stores_port_is_out_of_reach_without_the_network(agents, store_server, ollama_sim):
    port = int(store_server.address.rsplit(":", 1)[1])
    ollama_sim.script(command(f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected"), Reply(text="no"))
    await run(agents[0], "connect")
    ran = results(ollama_sim)[-1]
    assert "connected" not in ran.split("stdout:")[-1] and not ran.startswith("exit code 0")


async def test_the_pin_outlives_a_profile_that_no_longer_sandboxes_until_the_operator_lifts_it(
    agents, store, ollama_sim
):
    agent, _, lifted = agents
    ollama_sim.script(command("true"), Reply(text="ok"))
    session_id = (await run(agent, "first"))[0].session_id
    assert (await full(store, session_id)).sandboxed
    ollama_sim.script(command("true"), Reply(text="ok"))
    await run(agent, "again, on a profile that runs on the host", session_id=session_id, profile_id="open")
    assert (await stored_results(store, session_id))[-1].metadata["sandboxed"] is True  # pinned
    fresh = (await run(agent, "a new session on that profile", profile_id="open"))[0].session_id  # (no tool)
    ollama_sim.script(command("true"), Reply(text="ok"))
    await run(agent, "and now", session_id=fresh, profile_id="open")
    assert (await stored_results(store, fresh))[-1].metadata["sandboxed"] is False  # not pinned: the profile's way
    ollama_sim.script(command("true"), Reply(text="ok"))
    await run(lifted, "the operator said off", session_id=session_id, profile_id="open")
    assert (await stored_results(store, session_id))[-1].metadata["sandboxed"] is False


async def test_a_pinned_session_whose_sandbox_cannot_start_fails_its_command_clearly(
    agents, store, ollama_sim, monkeypatch, tmp_path
):
    agent = agents[0]
    ollama_sim.script(command("true"), Reply(text="ok"))
    session_id = (await run(agent, "pin it"))[0].session_id
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap to be found: as on a host without the package
    availability.forget()
    try:
        ollama_sim.script(command("touch made"), Reply(text="it failed"))
        events = await run(agent, "again", session_id=session_id, profile_id="open")
    finally:
        monkeypatch.undo()
        availability.forget()
    assert events[-1].stream_end.reason == END.STREAM_END_REASON_COMPLETED
    ran = results(ollama_sim)[-1]
    assert "the command was not run" in ran and "apt-get install bubblewrap" in ran and "pinned" in ran
    assert not [f for f in (await store.ListFiles(store_pb.ListFilesRequest(session_id=session_id))).files]


async def test_a_command_that_hangs_ends_at_its_limit_and_the_turn_goes_on(agents, ollama_sim):
    ollama_sim.script(command("sleep 600"), Reply(text="it timed out"))
    events = await run(agents[0], "wait", profile_id="quick")
    assert events[-1].stream_end.reason == END.STREAM_END_REASON_COMPLETED
    assert "the time limit (1 s) was reached" in results(ollama_sim)[-1].splitlines()[0]


async def test_stop_kills_a_running_command(agents, ollama_sim):
    agent = agents[0]
    ollama_sim.script(command("echo started; sleep 600"), Reply(text="unused"))
    events: list[pb.AgentEvent] = []
    started = asyncio.Event()

    async def read() -> None:
        async for event in agent.RunStream(pb.RunStreamRequest(text="long")):
            events.append(event)
            if event.HasField("tool_started"):
                started.set()

    reading = asyncio.create_task(read())
    await asyncio.wait_for(started.wait(), 30)
    assert (await agent.Stop(pb.StopRequest(session_id=events[0].session_id))).stopped
    await asyncio.wait_for(reading, 30)
    assert events[-1].stream_end.reason == END.STREAM_END_REASON_STOPPED
    (finished,) = [e.tool_finished for e in events if e.HasField("tool_finished")]
    assert finished.is_error and "stop" in finished.preview


async def test_a_command_with_the_network_is_outside_content_and_refused_once_tainted(agents, store, ollama_sim):
    agent = agents[0]
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        ollama_sim.script(
            command(f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected"), command("echo again"), Reply(text="ok")
        )
        events = await run(agent, "reach it", profile_id="online")
    session_id = events[0].session_id
    first, second = results(ollama_sim)
    assert "connected" in first
    assert second.startswith("run_command was not run: this conversation has taken in content from outside")
    session = await full(store, session_id)
    assert session.untrusted_ingested and session.episode_untrusted

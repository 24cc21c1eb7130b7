"""The Node.js client (clients/node) against the running services: installed with npm, run with node."""

from __future__ import annotations

import asyncio
import fcntl
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from palimpsest.v1 import session_store_pb2 as pb
from tests.helpers.pal_cli import agent_server_fixture, pal_env, pal_profiles_fixture  # noqa: F401 — importing registers the fixtures

NODE_DIR = Path(__file__).resolve().parents[2] / "clients" / "node"


@pytest.fixture(scope="module")
def node() -> str:
    """`node`, with clients/node's dependencies installed from its lock file (once, whichever worker is first)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        pytest.skip("the Node.js client needs node and npm on PATH (Node.js 18 or newer)")
    installed = NODE_DIR / "node_modules" / ".package-lock.json"
    # xdist workers share the folder: one installs while the other waits, and neither deletes it under the other.
    with open(Path(tempfile.gettempdir()) / "palimpsest-node-install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not installed.exists() or installed.stat().st_mtime < (NODE_DIR / "package-lock.json").stat().st_mtime:
            done = subprocess.run(
                [npm, "ci", "--no-audit", "--no-fund"],
                cwd=NODE_DIR,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            if done.returncode != 0:
                pytest.fail(f"npm ci in clients/node failed:\n{done.stderr[-2000:]}")
    return node


async def run_node(node: str, *args: str, env: dict[str, str], timeout: float = 60) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        node, *args, cwd=NODE_DIR, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(timeout):
        out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


LIST_SCRIPT = """
const { sessionStore, call } = require('./index');
const store = sessionStore();
(async () => {
  const profile = process.argv[1];
  const created = await call(store, 'CreateSession', { profile_id: profile, name: 'from node' });
  const listed = await call(store, 'ListSessions', { profile_id: profile });
  console.log(JSON.stringify({ created: created.session.id, listed: listed.sessions.map((s) => s.id),
                               total: listed.total }));
  store.close();
})().catch((err) => { console.error(err.message); process.exit(1); });
"""


async def test_the_client_loads_the_protos_at_runtime_and_talks_to_the_store(node, store, store_server, profile):
    code, out, err = await run_node(node, "-e", LIST_SCRIPT, profile, env=pal_env(store=store_server.address))
    assert code == 0, err
    result = json.loads(out)
    assert result["listed"] == [result["created"]] and result["total"] == "1"  # int64 arrives as a string
    got = await store.GetSession(pb.GetSessionRequest(session_id=result["created"]))
    assert (got.session.name, got.session.profile_id) == ("from node", profile)


async def test_demo_creates_a_session_streams_a_turn_and_lists_sessions(
    node, agent_server, store, store_server, compressor_server, pal_profiles
):
    env = pal_env(store=store_server.address, agent=agent_server.address, compressor=compressor_server.address)
    code, out, err = await run_node(node, "demo.js", "Hello from Node", env=env)
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    session_id = lines[0]["created"]["session_id"]
    assert lines[0]["created"]["profile_id"] == pal_profiles[0]  # the Agent's default profile
    events = [line for line in lines if "kind" in line]
    assert {e["session_id"] for e in events} == {session_id}
    assert events[-1]["kind"] == "stream_end"
    assert events[-1]["stream_end"] == {
        "reason": "STREAM_END_REASON_COMPLETED",
        "text": "Simulated answer to: Hello from Node",
    }
    assert (
        "".join(e["text_delta"]["text"] for e in events if e["kind"] == "text_delta")
        == "Simulated answer to: Hello from Node"
    )
    listed = [line["session"] for line in lines if "session" in line]
    assert session_id in {s["id"] for s in listed} and "total_sessions" in lines[-1]
    history = await store.GetSession(pb.GetSessionRequest(session_id=session_id, view=pb.SESSION_VIEW_DISPLAY))
    assert history.session.messages[0].content == "Hello from Node"


async def test_demo_exits_non_zero_with_one_line_when_a_service_is_down(node, store_server):
    code, out, err = await run_node(node, "demo.js", env=pal_env(store=store_server.address))
    assert code != 0 and out == ""
    assert err.strip().splitlines() == [err.strip()] and "cannot reach the Agent at 127.0.0.1:1" in err
    code, _, err = await run_node(node, "demo.js", env=pal_env(PALIMPSEST_PROFILE="default"))
    assert code != 0 and "cannot reach the SessionStore at 127.0.0.1:1" in err


# What clients/README.md tells Node users about proto-loader's mapping, shown on a real store: the
# options are keepCase, longs: String and oneofs (index.js), yet google.protobuf.Struct keeps
# protobuf.js's own camelCase field names, so a snake_case Value member is dropped without an error.
STRUCT_SCRIPT = """
const { sessionStore, call } = require('./index');
const store = sessionStore();
(async () => {
  const metadata = { fields: { camel: { stringValue: 'kept' }, snake: { string_value: 'lost' } } };
  const { session } = await call(store, 'CreateSession', { profile_id: process.argv[1], metadata });
  const read = (await call(store, 'GetSession', { session_id: session.id })).session;
  console.log(JSON.stringify({ id: session.id, created_at: read.created_at, metadata: read.metadata }));
  store.close();
})().catch((err) => { console.error(err.message); process.exit(1); });
"""


async def test_struct_values_must_be_camel_case_even_with_keep_case(node, store, store_server, profile):
    code, out, err = await run_node(node, "-e", STRUCT_SCRIPT, profile, env=pal_env(store=store_server.address))
    assert code == 0, err
    result = json.loads(out)
    stored = (await store.GetSession(pb.GetSessionRequest(session_id=result["id"]))).session.metadata
    assert stored.fields["camel"].string_value == "kept"
    assert "snake" in stored.fields and stored.fields["snake"].WhichOneof("kind") == "null_value"  # silently
    # Back in Node: a Timestamp is {seconds, nanos} with int64 seconds as a string, and a oneof names its member.
    assert isinstance(result["created_at"]["seconds"], str) and isinstance(result["created_at"]["nanos"], int)
    assert result["metadata"]["fields"]["camel"] == {"stringValue": "kept", "kind": "stringValue"}


async def test_a_node_client_offers_a_tool_and_answers_the_models_call(
    node, agent_server, store, store_server, compressor_server, pal_profiles, ollama_sim
):
    from ollama_sim import Reply

    ollama_sim.script(Reply(tool_calls=[("local_time", {"zone": "Europe/Paris"})]), Reply(text="It is noon."))
    env = pal_env(store=store_server.address, agent=agent_server.address, compressor=compressor_server.address)
    code, out, err = await run_node(node, "client-tools.js", "What time is it in Paris?", env=env)
    assert code == 0, err
    kinds = [json.loads(line)["kind"] for line in out.splitlines()]
    assert kinds.index("tool_call_requested") < kinds.index("tool_finished") < kinds.index("stream_end")
    told = [m["content"] for m in ollama_sim.bodies()[-1]["messages"] if m["role"] == "tool"]
    assert len(told) == 1 and told[0].endswith("(Europe/Paris)")


MEMORY_SCRIPT = """
const { sessionStore, call } = require('./index');
const store = sessionStore();
(async () => {
  const added = await call(store, 'EditMemory', { action: 'MEMORY_ACTION_ADD', text: 'Prefers metric units' });
  await call(store, 'EditMemory', { action: 'MEMORY_ACTION_REPLACE', entry_id: added.entry.id,
                                    text: 'Prefers SI units', expected_revision: added.revision });
  const memory = await call(store, 'GetMemory', {});
  console.log(JSON.stringify({ revision: memory.revision, entries: memory.entries.map((e) => e.text) }));
  store.close();
})().catch((err) => { console.error(err.message); process.exit(1); });
"""


async def test_the_client_reads_and_edits_the_callers_memory(node, store_server_auth, user):
    from conftest import JWT_SECRET

    from palimpsest.shared.auth import make_token

    env = pal_env(store=store_server_auth.address, PALIMPSEST_TOKEN=make_token(user, JWT_SECRET))
    code, out, err = await run_node(node, "-e", MEMORY_SCRIPT, env=env)
    assert code == 0, err
    assert json.loads(out) == {"revision": "2", "entries": ["Prefers SI units"]}


async def test_the_memory_and_mcp_example_reads_adds_lists_held_writes_and_each_profiles_servers(
    node, base_settings, store_server, store_server_auth, store_auth, compressor_server, ollama_sim, tmp_path, user
):
    from conftest import JWT_SECRET, bearer

    from palimpsest.shared.auth import make_token
    from palimpsest.v1 import agent_pb2
    from tests.helpers.mcp_agents import agent_with, servers_settled, stdio_server
    from tests.helpers.mcp_agents import profile as mcp_profile
    from tests.helpers.waiting import until

    me, add = bearer(user), pb.MEMORY_ACTION_ADD
    await store_auth.EditMemory(pb.EditMemoryRequest(action=add, text="Prefers tea"), metadata=me)
    held = await store_auth.EditMemory(pb.EditMemoryRequest(action=add, text="Lives in Lyon", hold=True), metadata=me)
    profiles = [
        mcp_profile("tools", [stdio_server("echo", tmp_path)]),
        mcp_profile("ghost", [{"name": "ghost", "command": [str(tmp_path / "no-such-server")]}]),
        mcp_profile("plain", []),
    ]
    async with agent_with(base_settings, store_server, compressor_server, ollama_sim, tmp_path, profiles) as (
        stub,
        running,
    ):
        assert await until(lambda: servers_settled(stub), timeout=60)
        env = pal_env(
            store=store_server_auth.address, agent=running.address, PALIMPSEST_TOKEN=make_token(user, JWT_SECRET)
        )
        code, out, err = await run_node(node, "memory-and-mcp.js", "Prefers", "metric", "units", env=env)
    assert code == 0, err
    memory, added, pending, *servers = [json.loads(line) for line in out.splitlines()]
    assert [e["text"] for e in memory["memory"]["entries"]] == ["Prefers tea"]
    assert added["added"]["entry"]["text"] == "Prefers metric units" and added["added"]["revision"] == "2"
    assert pending["pending"] == [
        {
            "id": str(held.held.id),
            "action": "MEMORY_ACTION_ADD",
            "text": "Lives in Lyon",
            "old_text": "",
            "session_id": "",
        }
    ]
    by_profile = {line["profile"]: line["mcp_servers"] for line in servers}
    assert set(by_profile) == {"tools", "ghost"}  # a profile without servers is not listed
    (echo,) = by_profile["tools"]
    assert echo["state"] == agent_pb2.McpServerState.Name(agent_pb2.MCP_SERVER_STATE_READY)
    assert "mcp__echo__lookup" in echo["tools"] and echo["target"].startswith("stdio: ")
    (ghost,) = by_profile["ghost"]
    assert ghost["state"] == "MCP_SERVER_STATE_FAILED" and "not found" in ghost["error"]
    after = await store_auth.GetMemory(pb.GetMemoryRequest(), metadata=me)
    assert [e.text for e in after.entries] == ["Prefers tea", "Prefers metric units"]

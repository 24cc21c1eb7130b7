"""An Agent with MCP servers (tests/helpers/mcp_server.py as processes) and a profile that names them."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import grpc

from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import agent_pb2_grpc
from tests.conftest import CHECKOUT, agent_settings

READY, FAILED = pb.MCP_SERVER_STATE_READY, pb.MCP_SERVER_STATE_FAILED


def stdio_server(name: str, tmp: Path, **entry: Any) -> dict[str, Any]:
    """A profile's entry for the test server as a stdio process; it stays down while `<tmp>/<name>.down` exists."""
    env = {
        "PYTHONPATH": str(CHECKOUT),
        "MCP_TEST_DOWN_FILE": str(tmp / f"{name}.down"),
        "MCP_TEST_RELEASE_FILE": str(tmp / f"{name}.release"),
    }
    return {
        "name": name,
        "command": [sys.executable, "-m", "tests.helpers.mcp_server", "stdio"],
        "env": env,
        "timeout_s": 20,
        **entry,
    }


def profile(profile_id: str, servers: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {
        "id": profile_id,
        "model": "qwen3.6",
        "context_window": 8192,
        "max_iterations": 6,
        "think_enabled": False,
        "memory_recall_enabled": False,
        "mcp_servers": servers,
        **fields,
    }


@contextlib.asynccontextmanager
async def agent_with(base_settings, store_server, compressor_server, ollama_sim, tmp: Path, profiles: list[dict]):
    """An Agent of the test's own over `profiles`; yields (stub, running server)."""
    from palimpsest.agent.app import start_agent

    path = tmp / "profiles.json"
    path.write_text(json.dumps({"default": profiles[0]["id"], "profiles": profiles}))
    running = await start_agent(
        agent_settings(base_settings, store_server, compressor_server, ollama_sim, str(path)), port=0
    )
    try:
        async with grpc.aio.insecure_channel(running.address) as channel:
            yield agent_pb2_grpc.AgentStub(channel), running
    finally:
        await running.stop(0)


async def statuses(agent) -> dict[str, dict[str, pb.McpServerStatus]]:
    listed = await agent.ListProfiles(pb.ListProfilesRequest())
    return {p.id: {s.name: s for s in p.mcp_servers} for p in listed.profiles}


async def servers_settled(agent) -> bool:
    """Every server has made its first try: ready, or failed with a reason."""
    return all(s.state in (READY, FAILED) for servers in (await statuses(agent)).values() for s in servers.values())

"""What the Agent's tool path adds to an MCP tool call: the same server, the same connection (one SDK
`Client`), called directly with the SDK and through `execute` — the way a turn runs every tool:
arguments checked against the schema, the taint rule, the connection's deadline and state, the result
turned into what the model reads. Calls alternate between the two, so drift on the machine falls on
both alike. Stdio (a process the Agent starts) and streamable HTTP (a process of the benchmark's)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

from bench._common import percentile, table
from palimpsest.agent.events import EventSink
from palimpsest.agent.mcp_servers.config import McpServerConfig
from palimpsest.agent.mcp_servers.manager import McpManager
from palimpsest.agent.profiles import Profile, ProfileRegistry
from palimpsest.agent.tools.base import ToolContext, TurnState
from palimpsest.agent.tools.registry import execute
from palimpsest.shared.settings import Settings

NEEDS_POSTGRES = False
CHECKOUT = Path(__file__).resolve().parents[1]
ARGS = {"query": "tides at Brest"}


def server_command(transport: str) -> list[str]:
    return [sys.executable, "-m", "tests.helpers.mcp_server", transport]


async def measure(server: McpServerConfig, calls: int) -> list[str]:
    profile = Profile(id="bench", mcp_servers=(server,))
    manager = McpManager()
    await manager.sync(ProfileRegistry({"bench": profile}, "bench"))
    try:
        await manager.settle(profile)
        connection = manager.connection(server)
        tool = manager.tools_for(profile).get(f"mcp__{server.name}__lookup")
        if connection is None or tool is None or connection._client is None:
            raise RuntimeError(f"the server did not come up: {connection.error if connection else 'no connection'}")
        client = connection._client
        # update_session None: the once-per-turn episode write is the store's (about one round trip).
        ctx = ToolContext(
            session_id="",
            store=None,
            ollama=None,
            profile=profile,  # type: ignore[arg-type]
            settings=Settings(),
            events=EventSink(""),
            state=TurnState(),
            window=8192,
        )
        direct: list[float] = []
        agent: list[float] = []
        for i in range(calls + 20):  # the first 20 of each warm up
            started = time.perf_counter()
            result = await client.call_tool("lookup", ARGS)
            middle = time.perf_counter()
            outcome = await execute(tool, dict(ARGS), ctx)
            ended = time.perf_counter()
            if result.is_error or outcome.is_error:
                raise RuntimeError(outcome.content)
            if i >= 20:
                direct.append(middle - started)
                agent.append(ended - middle)
    finally:
        await manager.close()
    added = [a - d for a, d in zip(agent, direct)]
    row = []
    for values in (direct, agent):
        row += [f"{percentile(values, 50) * 1e3:.2f}", f"{percentile(values, 90) * 1e3:.2f}"]
    return row + [f"{(percentile(agent, 50) - percentile(direct, 50)) * 1e3:.2f}", f"{percentile(added, 50) * 1e3:.2f}"]


async def run(args) -> str:
    calls = 100 if args.quick else 1000
    env = (("PYTHONPATH", str(CHECKOUT)),)
    rows = [
        ["stdio", *await measure(McpServerConfig(name="bench", command=tuple(server_command("stdio")), env=env), calls)]
    ]
    http = subprocess.Popen(
        server_command("http"),
        stdout=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": str(CHECKOUT), "PATH": "/usr/bin:/bin"},
    )
    try:
        port = int(await asyncio.to_thread(http.stdout.readline))  # type: ignore[union-attr]
        rows.append(
            [
                "streamable HTTP",
                *await measure(McpServerConfig(name="bench", url=f"http://127.0.0.1:{port}/mcp"), calls),
            ]
        )
    finally:
        http.kill()
        http.wait()
    return table(
        [
            "transport",
            "SDK direct p50 ms",
            "p90",
            "through execute p50 ms",
            "p90",
            "added p50 ms",
            "added per call, p50 ms",
        ],
        rows,
    ) + (
        f"\n\n{calls} calls of a read-only tool (`lookup`) each way, alternating, on one connection to one server "
        'process (tests/helpers/mcp_server.py). "Added" is the difference of the p50s, and the p50 of each pair\'s '
        "difference."
    )

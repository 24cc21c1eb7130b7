"""The Agent's MCP servers: one connection per configured server (profiles that name a server the same
way share it), started with the Agent and when the profiles file adds one, closed when it is removed
or the Agent stops. Turns take their tools from here; ListProfiles and the `mcp` health entry read
the servers' state. The SDK is imported (in a thread: it takes a second) only when a server is
configured."""

from __future__ import annotations

import asyncio
import importlib
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from palimpsest.agent.mcp_servers.config import PREFIX, McpServerConfig, server_of
from palimpsest.agent.tools.base import Tool
from palimpsest.v1 import agent_pb2

if TYPE_CHECKING:
    from palimpsest.agent.mcp_servers.connection import McpConnection
    from palimpsest.agent.profiles import Profile, ProfileRegistry

log = logging.getLogger("palimpsest.agent.mcp")

# The longest a turn waits for a server's first try to connect: a server that hangs at its start
# costs the first turns this much once, and its tools afterwards.
SETTLE_MAX_S = 10.0

_STATES = {
    "connecting": agent_pb2.MCP_SERVER_STATE_CONNECTING,
    "ready": agent_pb2.MCP_SERVER_STATE_READY,
    "failed": agent_pb2.MCP_SERVER_STATE_FAILED,
}


def named(tools: dict[str, Tool], names: Iterable[str]) -> dict[str, Tool]:
    """The MCP tools a tools list names, by their name or by their server's (mcp__<server>)."""
    wanted = set(names)
    return {name: tool for name, tool in tools.items() if name in wanted or PREFIX + server_of(name) in wanted}


class McpManager:
    def __init__(self) -> None:
        self._connections: dict[McpServerConfig, McpConnection] = {}
        self._closing: set[asyncio.Task] = set()
        self._syncing = asyncio.Lock()  # two turns may read an edited profiles file at once
        # Set whenever a server's state or tools change (the health entry follows it).
        self.changed = asyncio.Event()

    @property
    def configured(self) -> bool:
        return bool(self._connections)

    async def sync(self, registry: "ProfileRegistry") -> None:
        """Connections for the servers the profiles name now: new ones started, gone ones closed."""
        wanted = {server.connection_key for profile in registry.profiles.values() for server in profile.mcp_servers}
        async with self._syncing:
            if wanted - set(self._connections):
                module = await asyncio.to_thread(importlib.import_module, "palimpsest.agent.mcp_servers.connection")
                for key in wanted - set(self._connections):
                    connection = module.McpConnection(key, self.changed.set)
                    self._connections[key] = connection
                    connection.start()
            for key in set(self._connections) - wanted:
                closing = asyncio.create_task(self._connections.pop(key).close())
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)
        self.changed.set()

    async def close(self) -> None:
        """Every connection closed, with nothing of them left running."""
        connections, self._connections = list(self._connections.values()), {}
        await asyncio.gather(*(c.close() for c in connections), *self._closing, return_exceptions=True)

    def connection(self, server: McpServerConfig) -> "McpConnection | None":
        return self._connections.get(server.connection_key)

    async def settle(self, profile: "Profile") -> None:
        """Until each of the profile's servers has made its first try to connect (at most SETTLE_MAX_S):
        a turn right after the Agent started sees the tools of servers that came up."""
        waits = [c.first_attempt(SETTLE_MAX_S) for s in profile.mcp_servers if (c := self.connection(s)) is not None]
        if waits:
            await asyncio.gather(*waits)

    def tools_for(self, profile: "Profile") -> dict[str, Tool]:
        """The profile's MCP tools as of now, each server's in its order (filtered by the entry's `tools`).
        New objects every time: a turn keeps the set it took, whatever the servers list later."""
        from palimpsest.agent.mcp_servers.tool import McpTool

        tools: dict[str, Tool] = {}
        for server in profile.mcp_servers:
            connection = self.connection(server)
            if connection is None:
                continue
            for listed in connection.tools:
                if server.offers(listed.name):
                    tool = McpTool(server, connection, listed)
                    tools[tool.name] = tool
        return tools

    def statuses(self, profile: "Profile") -> list[agent_pb2.McpServerStatus]:
        statuses = []
        for server in profile.mcp_servers:
            status = agent_pb2.McpServerStatus(
                name=server.name, target=server.target, state=agent_pb2.MCP_SERVER_STATE_CONNECTING
            )
            connection = self.connection(server)
            if connection is not None:
                status.state = _STATES.get(connection.state.value, agent_pb2.MCP_SERVER_STATE_UNSPECIFIED)
                status.error = connection.error if connection.state.value == "failed" else ""
                if connection.retry_at:
                    status.retry_in_seconds = max(0.0, connection.retry_at - time.monotonic())
                status.tools.extend(server.tool_name(t.name) for t in connection.tools if server.offers(t.name))
                status.skipped_tools.extend(
                    f"{name}: {why}" for name, why in connection.skipped.items() if server.offers(name)
                )
            statuses.append(status)
        return statuses

    def not_ready(self) -> list[str]:
        """The servers that are not ready, each as "<name>: <state and why>" (the health entry's say)."""
        return [
            f"{c.config.name}: {c.state.value}" + (f" ({c.error})" if c.error else "")
            for c in self._connections.values()
            if c.state.value != "ready"
        ]

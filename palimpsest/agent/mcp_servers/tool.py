"""An MCP server's tool as the model calls it: mcp__<server>__<tool>, the server's own schema and
description, run through the connection with the entry's deadline. What the server answers is
outside content (it taints the conversation and the session's episode); its reach is what the
server declares: read-only tools (`readOnlyHint: true`) only read from outside, others may act there."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from palimpsest.agent.mcp_servers.config import PREFIX, McpServerConfig, server_of
from palimpsest.agent.mcp_servers.results import convert
from palimpsest.agent.tools.base import Reach, ToolContext, ToolResult

if TYPE_CHECKING:
    from palimpsest.agent.mcp_servers.connection import McpConnection, ServerTool


def is_critical(name: str, critical_tools: tuple[str, ...]) -> bool:
    """A profile's critical_tools names this MCP tool, or its whole server (mcp__<server>)."""
    return name in critical_tools or PREFIX + server_of(name) in critical_tools


class McpTool:
    def __init__(self, config: McpServerConfig, connection: "McpConnection", tool: "ServerTool") -> None:
        self.name = config.tool_name(tool.name)
        self.description = tool.description
        self.parameters = tool.parameters
        # Declared by the server the profile's author chose to trust: reading is all a read-only tool does.
        self.reach = Reach.ENGINE if tool.read_only else Reach.OUTSIDE
        self.server = config.name
        self.server_tool = tool.name
        self._timeout_s = config.timeout_s
        self._connection = connection

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        from palimpsest.agent.mcp_servers.connection import CallFailed

        try:
            result = await self._connection.call(self.server_tool, args, self._timeout_s)
        except CallFailed as exc:  # our own words, nothing from the server: no taint
            return ToolResult(
                content=f"{self.name} failed: {exc}",
                is_error=True,
                untrusted=False,
                metadata={"mcp_server": self.server},
            )
        if ctx.update_session is not None and not ctx.state.episode_untrusted:
            # What came back crossed the episode's trust boundary: recorded before the model reads it.
            await ctx.update_session(mark_episode_untrusted=True)
            ctx.state.episode_untrusted = True
        converted = convert(result)
        text = converted.text or (
            "(the tool reported an error and said nothing more)" if converted.is_error else "(no content)"
        )
        return ToolResult(
            content=text,
            images=converted.images,
            is_error=converted.is_error,
            untrusted=True,
            critical=is_critical(self.name, ctx.profile.critical_tools),
            metadata={"mcp_server": self.server, **converted.metadata},
        )

"""A real MCP server for the tests, made with the SDK's MCPServer: run by the Agent as a stdio process
(`python -m tests.mcp_server stdio`) or by a test as a streamable-HTTP one (`… http [port]`, which
prints its port on its first line). Its tools play what servers do: answer, show a picture, hang, change their
list, flood notifications, carry a schema Ollama would refuse.

With MCP_TEST_DOWN_FILE set, the server exits at once while that file exists (a server that keeps
crashing at start, until the test lets it up)."""

from __future__ import annotations

import asyncio
import base64
import io
import os
import socket
import sys
import time
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.tools.base import Tool
from mcp.types import ImageContent, TextContent, ToolAnnotations


def png(width: int = 6, height: int = 4) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


def weird(x: str = "") -> str:
    return "never offered"


# A schema Ollama would refuse: a property's type is a number.
MALFORMED = Tool.from_function(weird, name="weird")
MALFORMED.parameters = {"type": "object", "properties": {"x": {"type": 5}}}

server = MCPServer("palimpsest-test", tools=[MALFORMED])


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def lookup(query: str) -> str:
    """Look something up (reads only)."""
    return f"found: {query}"


@server.tool()
def write_note(text: str) -> str:
    """Write a note on the server (acts outside)."""
    return f"wrote: {text}"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def picture(caption: str) -> list:
    """A picture with a caption."""
    return [
        TextContent(type="text", text=f"caption: {caption}"),
        ImageContent(type="image", data=base64.b64encode(png()).decode(), mime_type="image/png"),
    ]


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def header(ctx: Context, name: str) -> str:
    """The value of one of the request's HTTP headers."""
    return (ctx.headers or {}).get(name.lower(), "(none)")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def whoami() -> str:
    """The server's process id and the names of its environment variables."""
    return f"pid {os.getpid()}\nenv {' '.join(sorted(os.environ))}"


@server.tool()
async def hang() -> str:
    """Never answers."""
    await asyncio.Event().wait()
    return "unreachable"


@server.tool()
async def block() -> str:
    """Answers once the file MCP_TEST_RELEASE_FILE exists (the test releases it)."""
    release = Path(os.environ["MCP_TEST_RELEASE_FILE"])
    while not release.exists():
        await asyncio.sleep(0.05)
    return "released"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def freeze() -> str:
    """Stops the whole server: its event loop sleeps and answers nothing more."""
    time.sleep(3600)
    return "unreachable"


@server.tool()
def fail() -> str:
    """Reports an error."""
    raise ValueError("the disk is full")


@server.tool()
async def grow(ctx: Context) -> str:
    """Adds the tool `added` and says the list changed."""

    def added(n: int) -> str:
        """Added at run time."""
        return f"added {n}"

    if server._tool_manager.get_tool("added") is None:
        server.add_tool(added, annotations=ToolAnnotations(read_only_hint=True))
    await ctx.notify_tools_changed()  # to 2026-07-28 clients' subscriptions/listen streams
    if not str(ctx.session.protocol_version or "").startswith("2026"):  # and on an older connection itself
        await ctx.session.send_tool_list_changed()
    return "grown"


@server.tool()
async def flood(ctx: Context, count: int, every_ms: int = 0) -> str:
    """Adds the tool `flooded`, then says the list changed `count` times, one every `every_ms`."""

    def flooded() -> str:
        return "flooded"

    if server._tool_manager.get_tool("flooded") is None:
        server.add_tool(flooded)
    for _ in range(count):
        await ctx.notify_tools_changed()
        await asyncio.sleep(every_ms / 1000)
    return f"flooded {count}"


def main() -> None:
    down = os.environ.get("MCP_TEST_DOWN_FILE")
    if down and Path(down).exists():
        sys.exit(3)
    if sys.argv[1:2] == ["http"]:
        import anyio
        import uvicorn

        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a server started again on its port
        sock.bind(("127.0.0.1", int(sys.argv[2]) if len(sys.argv) > 2 else 0))
        sock.listen(128)  # before the port is told: a client may connect at once
        print(sock.getsockname()[1], flush=True)
        config = uvicorn.Config(server.streamable_http_app(), log_level="warning")
        anyio.run(uvicorn.Server(config).serve, [sock])
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()

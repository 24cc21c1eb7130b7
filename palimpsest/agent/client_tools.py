"""Tools a client offers for one turn (`RunStream.client_tools`): the model calls one, the turn's
stream asks the client with a `tool_call_requested` event, and the turn waits for the answer the
client gives with `SubmitToolResult` — from any connection, and (the session bus on) any replica.

- `client_tools_from_proto` checks what a client declares, naming the field.
- `ClientTool` is the Tool the model calls; its `run` waits for the answer, the turn's Stop, or the
  deadline, whichever comes first.
- The calls waiting for an answer are `pending_calls.PendingCalls`.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Collection, Sequence
from typing import Any

from jsonschema import Draft202012Validator, SchemaError

from palimpsest.agent.mcp_servers.config import is_mcp_name
from palimpsest.agent.tools.base import Reach, ToolContext, ToolResult
from palimpsest.shared.errors import InvalidArgument, ResourceExhausted
from palimpsest.v1 import agent_pb2 as pb

MAX_CLIENT_TOOLS = 64
MAX_DESCRIPTION_CHARS = 4_000
MAX_SCHEMA_BYTES = 64 * 1024
# An answer crosses the session bus to the replica running the turn: within its message limit.
MAX_ANSWER_BYTES = 1024 * 1024
# What Ollama and every model's chat template take as a function name.
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def client_tools_from_proto(tools: Sequence[pb.ClientTool], taken: Collection[str]) -> list[ClientTool]:
    """The client's tools, checked: INVALID_ARGUMENT naming `client_tools[i].…`. ``taken``: the names
    of the turn's other tools (built-in, custom, MCP), which a client tool may not shadow."""
    if len(tools) > MAX_CLIENT_TOOLS:
        raise ResourceExhausted(f"client_tools: at most {MAX_CLIENT_TOOLS} tools a turn, got {len(tools)}")
    seen: set[str] = set()
    made = []
    for i, tool in enumerate(tools):
        field = f"client_tools[{i}]"
        if not _NAME.fullmatch(tool.name):
            raise InvalidArgument(f"{field}.name", "1 to 64 letters, digits, '_' or '-'")
        if tool.name in taken or is_mcp_name(tool.name):
            raise InvalidArgument(f"{field}.name", f"{tool.name!r} is the name of one of the turn's own tools")
        if tool.name in seen:
            raise InvalidArgument(f"{field}.name", f"{tool.name!r} is declared twice")
        seen.add(tool.name)
        if len(tool.description) > MAX_DESCRIPTION_CHARS:
            raise InvalidArgument(f"{field}.description", f"at most {MAX_DESCRIPTION_CHARS} characters")
        made.append(
            ClientTool(
                tool.name, tool.description, _schema(tool.parameters_json, f"{field}.parameters_json"), tool.read_only
            )
        )
    return made


def _schema(raw: str, field: str) -> dict[str, Any]:
    if not raw.strip():
        return {"type": "object", "properties": {}}
    if len(raw.encode()) > MAX_SCHEMA_BYTES:
        raise InvalidArgument(field, f"at most {MAX_SCHEMA_BYTES} bytes")
    try:
        schema = json.loads(raw)
    except ValueError as exc:
        raise InvalidArgument(field, f"not JSON: {exc}") from None
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        raise InvalidArgument(field, 'must be an object schema: {"type": "object", "properties": {…}}')
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise InvalidArgument(field, f"not a valid JSON schema: {exc.message}") from None
    return {"type": "object", **schema}


class ClientTool:
    """One tool a client declared: the model's call is asked of the client, and waited for."""

    def __init__(self, name: str, description: str, parameters: dict[str, Any], read_only: bool) -> None:
        self.name = name
        self.description = description
        self.parameters = parameters
        # What it does happens on the client's side, out of our sight: outside, unless it only reads.
        self.reach = Reach.ENGINE if read_only else Reach.OUTSIDE

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        asked = ctx.client_calls
        if asked is None or not ctx.turn_id:
            return ToolResult(
                content=f"{self.name} is a client's tool and this run has no client to ask.",
                is_error=True,
                untrusted=False,
            )
        key = (ctx.session_id, ctx.turn_id, ctx.call_id)
        answer = asked.open(key)
        timeout = ctx.client_tool_timeout_s
        ctx.events.tool_call_requested(ctx.call_id, self.name, json.dumps(args, ensure_ascii=False), timeout)
        waits: set[asyncio.Future[Any]] = {answer}
        stopped = asyncio.ensure_future(ctx.stop.wait()) if ctx.stop is not None else None
        if stopped is not None:
            waits.add(stopped)
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            asked.close(key)
            if stopped is not None:
                stopped.cancel()
        if answer.done() and not answer.cancelled():
            got = answer.result()
            return ToolResult(
                content=got.content, is_error=got.is_error, untrusted=not got.trusted, metadata={"client_tool": True}
            )
        answer.cancel()
        if stopped is not None and ctx.stop is not None and ctx.stop.is_set():
            return ToolResult(
                content=f"{self.name} was not answered: the turn was stopped.",
                is_error=True,
                untrusted=False,
                metadata={"stopped": True},
            )
        return ToolResult(
            content=f"{self.name} was not answered: the client gave no result within {timeout} s.",
            is_error=True,
            untrusted=False,
        )

"""Running a model call's tool calls: the tool set a turn offers, and one batch of calls run in
order, each answered (a stop answers the rest "not run"), audited, and stored together."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from google.protobuf import struct_pb2

from palimpsest.agent.audit import Recording
from palimpsest.agent.conversation import Conversation
from palimpsest.agent.events import EventSink
from palimpsest.agent.mcp_servers.manager import McpManager, named
from palimpsest.agent.profiles import Profile
from palimpsest.agent.tools.base import Tool, ToolContext, ToolResult, TurnState, confined
from palimpsest.agent.tools.registry import execute, tools_for
from palimpsest.shared.structs import to_struct
from palimpsest.v1 import common_pb2

Message = common_pb2.Message

MAX_SPAWN_DEPTH = 2
PREVIEW_CHARS = 400
# The result of a call a stop came before (every call gets one, so the context stays valid).
NOT_RUN = ToolResult(
    content="[not run: the turn was stopped]",
    is_error=True,
    untrusted=False,
    metadata={"stopped": True},
)


def tool_metadata(outcome: ToolResult) -> struct_pb2.Struct:
    """What a tool said about its result besides the text, kept with the result."""
    return to_struct({**outcome.metadata, **({"is_error": True} if outcome.is_error else {})})


def tool_set(
    profile: Profile,
    mcp: McpManager | None,
    *,
    is_subagent: bool,
    exclude: Iterable[str],
    depth: int,
    client_tools: Iterable[Tool],
    clamped: bool,
) -> tuple[dict[str, Tool], list[str]]:
    """The tools a turn offers, and those a clamp took away (a sub-agent of a session that took in
    outside content keeps only the confined ones)."""
    names = profile.tools_for_subagent if is_subagent else profile.agent_tools
    excluded = set(exclude)
    if depth >= MAX_SPAWN_DEPTH:
        excluded.add("spawn_agent")
    # The profile's MCP tools as their servers list them now, kept for the whole turn (the tool
    # block leads the prompt Ollama reuses); a sub-agent gets those its tools list names.
    offered = mcp.tools_for(profile) if mcp is not None else {}
    tools = tools_for(names, profile.custom_tools, excluded, mcp=named(offered, names) if is_subagent else offered)
    tools.update((tool.name, tool) for tool in client_tools)  # the turn's own, after the profile's
    if not clamped:
        return tools, []
    return {name: tool for name, tool in tools.items() if confined(tool)}, [
        name for name, tool in tools.items() if not confined(tool)
    ]


@dataclass(frozen=True)
class ToolRun:
    """What running a batch of tool calls takes from its turn."""

    tools: Mapping[str, Tool]
    clamped_out: Sequence[str]
    conv: Conversation
    sink: EventSink
    stop: asyncio.Event
    state: TurnState
    is_subagent: bool
    context_for: Callable[[str], ToolContext]  # what the call with this id sees of its turn
    taint: Callable[[], Awaitable[None]]  # outside content came in: this run and its parents are marked


async def run_tools(calls: Sequence[common_pb2.ToolCall], run: ToolRun) -> None:
    """Run the calls in order; store their results (and a plan a tool made) in one append."""
    results: list[Message] = []
    extra: list[Message] = []
    for call in calls:
        if run.stop.is_set():
            # Every call gets a result, so the context stays valid for the next turn.
            results.append(Message(role="tool", name=call.name, tool_call_id=call.id, content=NOT_RUN.content))
            _audit(run, call).end(NOT_RUN, 0.0)
            continue
        outcome, elapsed = await run_tool(call, run)
        if outcome.untrusted:
            # At once, not after the batch: the next call in it is judged tainted.
            await run.taint()
        result = Message(
            role="tool",
            name=call.name,
            tool_call_id=call.id,
            content=outcome.content,
            images=outcome.images,
            files=outcome.files,
            is_compression_critical=outcome.critical,
            elapsed_seconds=elapsed,
            metadata=tool_metadata(outcome),
        )
        results.append(result)
        if "plan" in outcome.metadata:
            extra.append(Message(role="assistant", content=outcome.metadata["plan"], is_plan=True))
    await run.conv.append(results + extra)
    if run.state.todo_changed:
        run.state.todo_changed = False
        run.sink.todo_updated(list(run.state.todo))


def _audit(run: ToolRun, call: common_pb2.ToolCall) -> Recording:
    """The run of `call` on the session's audit log (a sub-agent's: its parent's), from now on."""
    return run.conv.tool_runs.start(call, turn_id=run.sink.turn_id, is_subagent=run.is_subagent)


async def run_tool(call: common_pb2.ToolCall, run: ToolRun) -> tuple[ToolResult, float]:
    """The tool's result and the seconds it ran, recorded on the audit log (a run cut short too)."""
    run.sink.tool_started(call.id, call.name, call.arguments_json)
    started = time.monotonic()
    audited = _audit(run, call)
    tool = run.tools.get(call.name)
    if tool is None and call.name in run.clamped_out:
        outcome = ToolResult(
            content=f"{call.name} is not available to this sub-agent: the session it works for "
            "has taken in outside content, so its sub-agents keep only "
            f"{', '.join(run.tools) or 'no tools'}.",
            is_error=True,
            untrusted=False,
            metadata={"refused": "untrusted content"},
        )
    elif tool is None:
        outcome = ToolResult(
            content=f"Unknown tool {call.name!r}. Available: {', '.join(run.tools)}",
            is_error=True,
            untrusted=False,
        )
    else:
        try:
            args = json.loads(call.arguments_json or "{}")
        except ValueError:
            args = None
        if not isinstance(args, dict):
            outcome = ToolResult(
                content=f"Arguments for {call.name} must be a JSON object",
                is_error=True,
                untrusted=False,
            )
        else:
            outcome = await execute(tool, args, run.context_for(call.id))
    elapsed = time.monotonic() - started
    audited.end(outcome, elapsed)
    run.sink.tool_finished(call.id, call.name, outcome.content[:PREVIEW_CHARS], outcome.is_error, elapsed)
    return outcome, elapsed

"""spawn_agent: hand a bounded subtask to a sub-agent with its own temporary context."""

from __future__ import annotations

from typing import Any

from palimpsest.agent.tools.base import Reach, SpawnRequest, ToolContext, ToolResult
from palimpsest.agent.tools.common import ToolInputError, error, text_arg

DEFAULT_MAX_ITERATIONS = 40
MAX_ITERATIONS = 200
DEFAULT_TIMEOUT_SECONDS = 300.0
MAX_TIMEOUT_SECONDS = 3600.0


def spawn_request(args: dict[str, Any], parent_session_id: str) -> SpawnRequest:
    """The RunEphemeral request the model asked for, validated field by field."""
    task = text_arg(args, "task", required=True)
    exclude = args.get("exclude_tools") or []
    if isinstance(exclude, str):
        exclude = [name.strip() for name in exclude.split(",")]
    if not isinstance(exclude, list) or not all(isinstance(name, str) for name in exclude):
        raise ToolInputError("'exclude_tools' must be a list of tool names")
    max_iterations = args.get("max_iterations")
    if max_iterations is None:
        max_iterations = DEFAULT_MAX_ITERATIONS
    if (
        isinstance(max_iterations, bool)
        or not isinstance(max_iterations, int | float)
        or not 1 <= max_iterations <= MAX_ITERATIONS
        or int(max_iterations) != max_iterations
    ):
        raise ToolInputError(f"'max_iterations' must be a whole number from 1 to {MAX_ITERATIONS}")
    timeout = args.get("timeout_seconds")
    if timeout is None:
        timeout = DEFAULT_TIMEOUT_SECONDS
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= MAX_TIMEOUT_SECONDS:
        raise ToolInputError(f"'timeout_seconds' must be above 0 and at most {MAX_TIMEOUT_SECONDS:.0f}")
    return SpawnRequest(
        text=task,
        profile_id=text_arg(args, "profile_id"),  # empty: the Agent uses the parent session's profile
        max_iterations=int(max_iterations),
        exclude_tools=tuple(name for name in (n.strip() for n in exclude) if name),
        briefing=text_arg(args, "briefing"),
        custom_system_prompt=text_arg(args, "custom_system_prompt"),
        inherit_system_prompt=bool(args.get("inherit_system_prompt", False)),
        context_transfer=text_arg(args, "context_transfer"),
        parent_session_id=parent_session_id,
        timeout_seconds=float(timeout),
    )


class SpawnAgentTool:
    name = "spawn_agent"
    reach = Reach.ENGINE  # a sub-agent of this session: nothing outside Palimpsest
    description = (
        "Delegate a bounded subtask (three or more tool calls) to a sub-agent that works in its own "
        "temporary context and returns its final answer. Give it everything it needs in `task` and `briefing`: "
        "it does not see this conversation unless you pass `context_transfer`."
    )
    parameters = {
        "type": "object",
        "properties": {
            "task": {"type": "string", "description": "What the sub-agent must do and report back."},
            "profile_id": {"type": "string", "description": "Agent profile to run it with (default: this one)."},
            "exclude_tools": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Tools the sub-agent must not have.",
            },
            "briefing": {"type": "string", "description": "Background added to the sub-agent's instructions."},
            "custom_system_prompt": {"type": "string", "description": "Replaces the sub-agent's instructions."},
            "inherit_system_prompt": {
                "type": "boolean",
                "description": "Give the sub-agent this agent's instructions.",
            },
            "context_transfer": {
                "type": "string",
                "description": "Facts from this conversation the sub-agent should know.",
            },
            "timeout_seconds": {"type": "number", "description": "Wall-clock limit (default 300)."},
            "max_iterations": {"type": "integer", "description": "Model calls allowed (default 40)."},
        },
        "required": ["task"],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        if ctx.spawn is None:
            return error(
                "spawn_agent is not available here: this agent may not start sub-agents "
                "(the maximum nesting depth is reached). Do the subtask yourself."
            )
        try:
            request = spawn_request(args, ctx.session_id)
        except ToolInputError as exc:
            return error(f"spawn_agent: {exc}")
        text, completed = await ctx.spawn(request)
        who = f"Sub-agent ({request.profile_id})" if request.profile_id else "Sub-agent"
        if completed:
            head = f"{who} finished normally. Its report:"
        else:
            head = (
                f"{who} did NOT finish (it hit its iteration limit or its {request.timeout_seconds:.0f}s "
                "timeout). Its partial report:"
            )
        # Whatever the sub-agent read (files, the web, other sessions) reaches us through its text.
        return ToolResult(
            content=f"{head}\n\n{text or '(no text)'}", untrusted=True, metadata={"completed_normally": completed}
        )

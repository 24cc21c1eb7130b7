"""What a turn runs on now: its profile, the model's facts, the window and the tool set. One
value, made whole at the turn's start and again when a tool switches the turn's profile."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from palimpsest.agent.events import EventSink
from palimpsest.agent.mcp_servers.manager import McpManager
from palimpsest.agent.profiles import Profile
from palimpsest.agent.stages.tools import tool_set
from palimpsest.agent.tools.base import Tool, schema
from palimpsest.shared.ollama import ModelFacts

log = logging.getLogger("palimpsest.agent")

# (profile, model, window asked for) already warned of as more than the model was trained on.
_WINDOWS_WARNED: set[tuple[str, str, int]] = set()


@dataclass(frozen=True)
class RunsOn:
    """The profile a turn runs under, its model's facts, the window it asked for and the one it
    gets (at most what the model was trained on), and the tools it offers (and those a clamp
    took)."""

    profile: Profile
    facts: ModelFacts
    requested_window: int
    window: int
    tools: Mapping[str, Tool]
    clamped_out: tuple[str, ...] = ()

    def tool_schemas(self) -> list[dict] | None:
        """The tools as the model is told of them (none for a model without tool calling)."""
        return [schema(t) for t in self.tools.values()] if self.facts.tools and self.tools else None

    def tool_schemas_json(self) -> list[str]:
        return [json.dumps(s, ensure_ascii=False) for s in self.tool_schemas() or ()]


def runs_on(
    profile: Profile,
    facts: ModelFacts,
    *,
    num_ctx: int,
    mcp: McpManager | None,
    is_subagent: bool,
    exclude: Iterable[str],
    depth: int,
    client_tools: Iterable[Tool],
    clamped: bool,
) -> RunsOn:
    """What a turn runs on under `profile`, its tools as the MCP servers list them now."""
    requested = profile.window(num_ctx)
    tools, clamped_out = tool_set(
        profile,
        mcp,
        is_subagent=is_subagent,
        exclude=exclude,
        depth=depth,
        client_tools=client_tools,
        clamped=clamped,
    )
    return RunsOn(profile, facts, requested, facts.usable_window(requested), tools, tuple(clamped_out))


async def settle_mcp(mcp: McpManager | None, profile: Profile) -> bool:
    """Whether the profile has MCP servers; those still on their first try to connect (the Agent
    just started, or the profiles file just added them) are waited for, each at most its
    timeout, so that their tools are in the tool set loaded next."""
    if mcp is None or not profile.mcp_servers:
        return False
    await mcp.settle(profile)
    return True


def announce_model(sink: EventSink, on: RunsOn) -> None:
    """The model and the window the turn runs in; a profile asking for more than the model was
    trained on is told (Ollama would clamp it silently, and the meter would show a window that
    is not there)."""
    profile, window = on.profile, on.window
    requested = on.requested_window if on.requested_window > window else 0
    if requested and (profile.id, profile.model, requested) not in _WINDOWS_WARNED:
        _WINDOWS_WARNED.add((profile.id, profile.model, requested))  # the event tells every turn
        log.warning(
            "profile %s asks for a %d-token window; %s was trained on %d: the turn uses %d",
            profile.id,
            requested,
            profile.model,
            window,
            window,
        )
    sink.model_info(profile.model, window, requested)

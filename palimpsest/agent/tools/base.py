"""The tool interface. A tool is a name, a JSON schema and an async `run`; the registry makes the
set a profile asks for, and users add their own through a profile's `custom_tools`."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from palimpsest.agent.events import EventSink
from palimpsest.agent.profiles import Profile
from palimpsest.shared.ollama import OllamaClient
from palimpsest.shared.settings import Settings
from palimpsest.shared.stubs import AsyncStoreStub
from palimpsest.v1 import agent_pb2

if TYPE_CHECKING:
    from palimpsest.agent.pending_calls import PendingCalls
    from palimpsest.agent.workspace import Workspace


@dataclass
class ToolResult:
    content: str
    is_error: bool = False
    # Images the model should see with the result (image_view).
    images: list[bytes] = field(default_factory=list)
    # Content from outside the engine (files, the web, other sessions, sub-agents) taints the session.
    untrusted: bool = True
    # Kept verbatim by the summarizer (up to its cap) instead of an 800-char preview.
    critical: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)
    # Session files the result offers (share_file, content_publish): kept on the stored result.
    files: list[str] = field(default_factory=list)


@dataclass
class SpawnRequest:
    """What spawn_agent asks of the Agent: the RunEphemeral fields."""

    text: str
    profile_id: str = ""
    max_iterations: int = 40
    exclude_tools: tuple[str, ...] = ()
    briefing: str = ""
    custom_system_prompt: str = ""
    inherit_system_prompt: bool = False
    context_transfer: str = ""
    parent_session_id: str = ""
    timeout_seconds: float = 300.0


@dataclass
class TurnState:
    """Mutable state of one turn (or one sub-agent run), never shared between them."""

    todo: list[agent_pb2.TodoItem] = field(default_factory=list)
    todo_changed: bool = False
    todo_progress: int = 0  # bumped whenever an item moves forward: the anti-stall signal
    switched_profile: str = ""
    goal: str = ""
    # The scratchpad's notes when there is no session to keep them in (a sub-agent of none).
    scratchpad: list[dict[str, str]] = field(default_factory=list)
    # The session's episode_untrusted is set (an MCP result came in): written once per turn at most.
    episode_untrusted: bool = False


@dataclass
class ToolContext:
    """What a tool may touch during one call."""

    # The session whose data session-aware tools act on (a sub-agent's parent session).
    session_id: str
    store: AsyncStoreStub
    ollama: OllamaClient
    profile: Profile
    settings: Settings
    events: EventSink
    state: TurnState
    window: int
    is_subagent: bool = False
    # The conversation has taken in outside content (a sub-agent's: its own run's, or its parent's).
    untrusted: bool = False
    # Writes UpdateSession fields to `session_id` through the running turn, carrying its revision, so
    # a tool's write never looks like another writer's (None: nothing may be written).
    update_session: Callable[..., Awaitable[Any]] | None = None
    # Runs a sub-agent; returns (text, completed_normally).
    spawn: Callable[[SpawnRequest], Awaitable[tuple[str, bool]]] | None = None
    # The conversation so far, for tools that need it (plan).
    conversation: list[Any] = field(default_factory=list)
    tool_schemas: list[dict[str, Any]] = field(default_factory=list)
    # The session's workspace (None: a run without a session), the folder relative paths start from,
    # and the key of the run whose first file tool syncs the workspace from the store.
    workspace: Workspace | None = None
    cwd: str = ""
    turn_key: str = ""
    # Set when the turn is stopped: a long tool (a command) ends at once.
    stop: asyncio.Event | None = None
    # The session's commands are pinned to the sandbox (a sandboxed command ran in it before).
    sandbox_pinned: bool = False
    # The call being run, its turn (as events name them), and where a client's tool waits for its answer.
    call_id: str = ""
    turn_id: str = ""
    client_calls: PendingCalls | None = None
    client_tool_timeout_s: int = 300


class Reach(enum.Enum):
    """How far a tool's effects go: what the taint rule weighs before it runs."""

    SESSION = "session"  # the session it works for and the model: its files, todo, plan, memory
    ENGINE = "engine"  # other sessions, sub-agents, profiles: nothing outside Palimpsest
    OUTSIDE = "outside"  # beyond the conversation: host files, publishing, the network, the owner's memory


@runtime_checkable
class Tool(Protocol):
    """A tool may also say how far it reaches, ``reach = Reach.SESSION`` (or ``"session"``,
    ``"engine"``, ``"outside"``; ``confined = True`` is the older word for "session"), or answer per
    call with ``reach_of(args, ctx) -> Reach``. A tool that does not say is taken to act outside the
    conversation, so a tainted conversation refuses it (see ``refusal``)."""

    name: str
    description: str
    parameters: dict[str, Any]

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult: ...


def reach_of(tool: Tool, args: dict[str, Any] | None = None, ctx: ToolContext | None = None) -> Reach:
    """How far this call of ``tool`` reaches (without a call: how far the tool can reach at most)."""
    per_call = getattr(tool, "reach_of", None)
    if callable(per_call) and args is not None and ctx is not None:
        return Reach(per_call(args, ctx))
    declared = getattr(tool, "reach", None)
    if declared is not None:
        try:
            return Reach(declared.value if isinstance(declared, Reach) else declared)
        except ValueError:
            return Reach.OUTSIDE
    return Reach.SESSION if getattr(tool, "confined", False) is True else Reach.OUTSIDE


def confined(tool: Tool) -> bool:
    """The tool reaches nothing beyond the session it works for and the model."""
    return reach_of(tool) is Reach.SESSION


TAINT_REFUSAL = (
    "{tool} was not run: this conversation has taken in content from outside (a tool's output, a file or "
    "an image), which may carry instructions someone planted, so tools whose effects reach {where} are "
    "refused in it. Tell the user what you wanted to do and why; they can do it themselves, or in a new "
    "session."
)


def refusal(tool: Tool, args: dict[str, Any], ctx: ToolContext) -> str:
    """Why the taint rule refuses this call ("" when it may run). In a tainted conversation no tool
    acts outside it; a sub-agent of one keeps only what stays in its session (the clamp)."""
    if not ctx.untrusted:
        return ""
    reach = reach_of(tool, args, ctx)
    if reach is Reach.OUTSIDE:
        return TAINT_REFUSAL.format(tool=tool.name, where="outside it")
    if reach is Reach.ENGINE and ctx.is_subagent:
        return TAINT_REFUSAL.format(tool=tool.name, where="beyond its session (for a sub-agent)")
    return ""


def schema(tool: Tool) -> dict[str, Any]:
    """The tool as Ollama's `tools` entry."""
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
    }

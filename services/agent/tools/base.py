"""The tool interface. A tool is a name, a JSON schema and an async `run`; the registry makes the
set a profile asks for, and users add their own through a profile's `custom_tools`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from palimpsest.v1 import agent_pb2
from palimpsest.v1.session_store_pb2_grpc import SessionStoreStub
from services.agent.events import EventSink
from services.agent.profiles import Profile
from services.shared.ollama import OllamaClient
from services.shared.settings import Settings


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


@dataclass
class ToolContext:
    """What a tool may touch during one call."""

    # The session whose data session-aware tools act on (a sub-agent's parent session).
    session_id: str
    store: SessionStoreStub
    ollama: OllamaClient
    profile: Profile
    settings: Settings
    events: EventSink
    state: TurnState
    window: int
    is_subagent: bool = False
    untrusted: bool = False  # the session has ingested untrusted content
    # Writes UpdateSession fields to `session_id` through the running turn, carrying its revision, so
    # a tool's write never looks like another writer's (None: nothing may be written).
    update_session: Callable[..., Awaitable[Any]] | None = None
    # Runs a sub-agent; returns (text, completed_normally).
    spawn: Callable[[SpawnRequest], Awaitable[tuple[str, bool]]] | None = None
    # The conversation so far, for tools that need it (plan).
    conversation: list[Any] = field(default_factory=list)
    tool_schemas: list[dict[str, Any]] = field(default_factory=list)


@runtime_checkable
class Tool(Protocol):
    """A tool may also say ``confined = True``: it reaches nothing beyond the session it works for
    and the model (no other session, no sub-agent, no profile switch, nothing outside the engine).
    Only confined tools are left to a clamped sub-agent (one of a session that has taken in outside
    content); a tool that does not say so is taken as unconfined."""

    name: str
    description: str
    parameters: dict[str, Any]

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult: ...


def confined(tool: Tool) -> bool:
    return getattr(tool, "confined", False) is True


def schema(tool: Tool) -> dict[str, Any]:
    """The tool as Ollama's `tools` entry."""
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
    }

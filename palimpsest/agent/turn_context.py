"""What a turn is given and what it gives back, as values: the long-lived dependencies, the
immutable context a turn is built from (by the servicer, or by ``run_subagent`` for a sub-agent),
the user's input, and how the turn ended. Apart from ``turn`` so that the modules that build turns
and the stages a turn runs depend on these types, not on each other."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from palimpsest.agent.audit import ToolRunLog
from palimpsest.agent.client_tools import ClientTool
from palimpsest.agent.context_builder import ContextBuilder
from palimpsest.agent.conversation import Conversation
from palimpsest.agent.events import EventSink
from palimpsest.agent.mcp_servers.manager import McpManager
from palimpsest.agent.pending_calls import PendingCalls
from palimpsest.agent.profiles import Profile, ProfileRegistry
from palimpsest.agent.tools.base import SpawnRequest
from palimpsest.agent.workspace import Workspaces
from palimpsest.shared.ollama import ModelFacts, OllamaClient
from palimpsest.shared.settings import Settings
from palimpsest.shared.stubs import AsyncCompressorStub, AsyncStoreStub
from palimpsest.v1 import agent_pb2

END = agent_pb2.StreamEndReason


@dataclass
class AgentDeps:
    """The long-lived parts a turn uses; one per Agent server."""

    store: AsyncStoreStub
    compressor: AsyncCompressorStub
    ollama: OllamaClient
    settings: Settings
    profiles: ProfileRegistry
    builder: ContextBuilder
    post_turn_tasks: set[asyncio.Task] = field(default_factory=set)
    mcp: McpManager | None = None  # the profiles' MCP servers (None: the Agent connects to none)
    # The sessions' workspaces as this Agent mirrors them (None: no file tools, e.g. in unit tests).
    workspaces: Workspaces | None = None
    # Client tools' calls waiting for their answers on this replica.
    client_calls: PendingCalls = field(default_factory=PendingCalls)


@dataclass
class TurnInput:
    text: str
    images: Sequence[bytes] = ()
    hidden: bool = False
    # Stored names of the session files this turn carries (attachments, inline ones once stored).
    files: Sequence[str] = ()
    # The working folder in the session's workspace ("" is the workspace itself).
    cwd: str = ""
    # Tools the client offers for this turn (checked), and how long one call waits for its answer.
    client_tools: Sequence[ClientTool] = ()
    client_tool_timeout_s: int = 0


@dataclass
class TurnResult:
    text: str = ""
    reason: agent_pb2.StreamEndReason = END.STREAM_END_REASON_UNSPECIFIED

    @property
    def completed_normally(self) -> bool:
        return self.reason == END.STREAM_END_REASON_COMPLETED


@dataclass(frozen=True)
class SubagentOptions:
    """How a sub-agent's turn differs from a user's: its parent, its own system prompt and
    iteration budget, the tools it may not use, how deep it is, and how it writes its parent's
    session (a sub-agent keeps none of its own)."""

    parent_session_id: str = ""
    system_prompt: str | None = None
    max_iterations: int | None = None
    exclude_tools: tuple[str, ...] = ()
    depth: int = 1
    session_writer: Callable[..., Awaitable[object]] | None = None
    # Marks the parent's conversation as holding outside content: what a sub-agent takes in taints
    # the whole conversation at once, not when its report comes back.
    taint_parent: Callable[[], Awaitable[None]] | None = None
    cwd: str = ""  # the parent's working folder
    # Whether the session's commands are pinned to the sandbox (the parent's session, as it is now).
    sandbox_pinned: Callable[[], bool] | None = None


class SpawnSubagent(Protocol):
    """Runs a sub-agent for a turn's spawn_agent call (``subagent.run_subagent``), given to the turn
    by whoever builds it, so that this module never imports the one that builds turns."""

    async def __call__(
        self,
        deps: AgentDeps,
        request: SpawnRequest,
        *,
        sink: EventSink,
        metadata: tuple[tuple[str, str], ...],
        untrusted: bool = False,
        depth: int = 1,
        parent_profile: Profile | None = None,
        session_writer: Callable[..., Awaitable[object]] | None = None,
        taint_parent: Callable[[], Awaitable[None]] | None = None,
        cwd: str = "",
        parent_stop: asyncio.Event | None = None,
        sandbox_pinned: Callable[[], bool] | None = None,
        tool_runs: ToolRunLog | None = None,
    ) -> TurnResult: ...


@dataclass(frozen=True)
class TurnContext:
    """Everything a turn is given, fixed before it runs: built whole by the servicer (a user's
    turn) or by ``run_subagent`` (a sub-agent's), never patched afterwards."""

    deps: AgentDeps
    conversation: Conversation
    profile: Profile  # the profile it starts under (a tool may switch the running turn to another)
    sink: EventSink
    metadata: tuple[tuple[str, str], ...]  # the caller's credentials, forwarded on internal calls
    facts: ModelFacts
    subagent: SubagentOptions | None = None  # None: a user's turn
    spawn: SpawnSubagent | None = None  # None: the turn offers no spawn_agent
    # Which version of the session the servicer saw when it opened the turn (another turn may run
    # before this one gets the session's lock: then it starts from the store).
    opened_generation: int = 0
    # UpdateSession fields the request implies (what the turn runs on, refs, a taint), written
    # first under the session lock: a write before it could refuse a running turn's next one.
    session_changes: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

"""What one turn carries between its steps (made from its TurnContext), and the prompt's head every
step builds on; Turn (palimpsest.agent.turn) runs the steps."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

from palimpsest.agent import context_builder as cb
from palimpsest.agent.client_tools import ClientTool
from palimpsest.agent.profiles import Profile
from palimpsest.agent.stages.runs_on import RunsOn, runs_on
from palimpsest.agent.tools.base import TurnState
from palimpsest.agent.turn_context import SubagentOptions, TurnContext, TurnResult
from palimpsest.shared import metrics
from palimpsest.shared.ollama import ChatResult, ModelFacts
from palimpsest.shared.settings import Settings
from palimpsest.v1 import agent_pb2, common_pb2

Message = common_pb2.Message


class TurnBase:
    """A turn's state and its small helpers, shared by Turn and the parts it is made of."""

    def __init__(self, ctx: TurnContext) -> None:
        self.ctx = ctx
        self.deps = deps = ctx.deps
        self.conv = conversation = ctx.conversation
        profile = ctx.profile
        self.sink = ctx.sink
        self.metadata = ctx.metadata
        self.is_subagent = ctx.subagent is not None
        self.spawner = ctx.spawn  # None: this turn cannot spawn sub-agents (spawn_agent is not offered)
        options = ctx.subagent or SubagentOptions(depth=0)
        self.system_prompt_override = options.system_prompt
        self.max_iterations = options.max_iterations or profile.max_iterations
        self.exclude_tools = tuple(options.exclude_tools)
        self.depth = options.depth
        self.parent_session_id = options.parent_session_id
        # A stored turn writes its own session; a sub-agent writes its parent's through the parent.
        self.session_writer = conversation.update if not conversation.ephemeral else options.session_writer
        self.taint_parent = options.taint_parent
        self.cwd = options.cwd
        self._parent_pinned = options.sandbox_pinned
        self.key = uuid.uuid4().hex  # the run whose first file tool syncs the workspace
        self.client_tools: list[ClientTool] = []
        self.client_tool_timeout_s = deps.settings.client_tool_timeout_s
        # A sub-agent of a session that has taken in outside content runs clamped: its task may
        # carry instructions planted in that content, so it keeps only the confined tools.
        self.clamped = self.is_subagent and conversation.untrusted
        self.stop = asyncio.Event()
        self.state = TurnState()
        self.last_prompt_tokens = 0
        self.last_trigger = 0  # where the last size check said compression starts
        self.prompt_cut = False  # the last call's report proved its prompt cut
        self.compressed_after = False  # the post-turn pass committed a compression
        self.first_words = ""  # the name this turn gave a new session, for the title after the answer
        self.result = TurnResult()
        self._pending: list[Message] = []  # this turn's user message, stored with the first size check
        self._noted_iteration = -1  # the iteration whose notes are already on their way to the store
        self._compressor_away = False  # said once per turn
        self._shrunk_by = ""  # what the last refused prompt was shrunk by before it was sent again
        self._partial: ChatResult | None = None  # the call under way, kept as a partial answer if cut short
        # The profile, model, window and tools it runs on, made anew when a tool switches profile.
        self.on = self._runs_on(profile, ctx.facts)

    # -- small helpers -------------------------------------------------------------------------
    @property
    def settings(self) -> Settings:
        return self.deps.settings

    @property
    def session_id(self) -> str:
        return self.conv.session_id

    @property
    def stored(self) -> bool:
        return not self.conv.ephemeral

    def _runs_on(self, profile: Profile, facts: ModelFacts) -> RunsOn:
        return runs_on(
            profile,
            facts,
            num_ctx=self.settings.ollama_num_ctx,
            mcp=self.deps.mcp,
            is_subagent=self.is_subagent,
            exclude=self.exclude_tools,
            depth=self.depth,
            client_tools=self.client_tools,
            clamped=self.clamped,
        )

    def _system_prompt(self) -> str:
        if self.system_prompt_override is not None:
            return self.system_prompt_override
        return self.deps.builder.system_prompt(self.on.profile, subagent=self.is_subagent)

    def _keep_recent(self) -> int:
        return self.on.profile.compression_keep_recent or self.settings.compression_keep_recent

    def _compression_on(self) -> bool:
        return self.stored and self.settings.compression_enabled and self.on.profile.compression_enabled

    def _end(self, reason: agent_pb2.StreamEndReason, text: str) -> TurnResult:
        self.result = TurnResult(text=text, reason=reason)
        if not self.is_subagent:
            self.sink.stream_end(reason, text)
            metrics.turn_ended(reason)
        return self.result

    def build(self, pending: Sequence[Message] = ()) -> list[Message]:
        return cb.ContextBuilder.build(
            self._system_prompt(),
            [*self.conv.context, *(m for m in pending if not m.explicit_flags or m.is_context)],
            self._memory_message(),
        )

    def _prompt_head(self) -> list[Message]:
        """What every prompt of this session begins with: the system prompt and the memory message
        (the Compressor begins a summary with it, so Ollama reuses what it evaluated for the last call)."""
        return cb.ContextBuilder.build(self._system_prompt(), [], self._memory_message())

    def _memory_message(self) -> str:
        """The owner's memory as the session holds it: taken when the session was made and at each
        compression, so between two compressions every prompt begins alike (a sub-agent: none)."""
        session = self.conv.session
        if session is None:
            return ""
        return cb.memory_message(session.memory.entries, self.settings.memory_prompt_tokens)

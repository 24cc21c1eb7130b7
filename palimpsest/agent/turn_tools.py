"""What a turn lends its tools: their context, the sandbox pin, the taint of outside content and the
sub-agents they spawn."""

from __future__ import annotations

from palimpsest.agent.stages.tools import MAX_SPAWN_DEPTH
from palimpsest.agent.tools.base import SpawnRequest, ToolContext, schema
from palimpsest.agent.turn_base import TurnBase


class TurnTools(TurnBase):
    """The tool side of a turn."""

    def tool_context(self, call_id: str = "") -> ToolContext:
        """What this turn's tools (and a sub-agent's planner) see of it, for the call ``call_id``."""
        session_id = self.session_id or self.parent_session_id
        workspaces = self.deps.workspaces
        return ToolContext(
            session_id=session_id,
            workspace=workspaces.get(session_id) if workspaces is not None and session_id else None,
            cwd=self.cwd,
            turn_key=self.key,
            stop=self.stop,
            sandbox_pinned=self.sandbox_pinned(),
            call_id=call_id,
            turn_id=self.sink.turn_id,
            client_calls=self.deps.client_calls,
            client_tool_timeout_s=self.client_tool_timeout_s,
            store=self.deps.store,
            ollama=self.deps.ollama,
            profile=self.on.profile,
            settings=self.settings,
            events=self.sink,
            state=self.state,
            window=self.on.window,
            is_subagent=self.is_subagent,
            untrusted=self.conv.untrusted,
            spawn=self._spawn if self.spawner is not None and self.depth < MAX_SPAWN_DEPTH else None,
            update_session=self.session_writer,
            conversation=list(self.conv.context),
            tool_schemas=[schema(t) for t in self.on.tools.values()],
        )

    def sandbox_pinned(self) -> bool:
        """The session's commands run in the sandbox whatever the profile says (a sub-agent: its parent's)."""
        if self._parent_pinned is not None:
            return self._parent_pinned()
        return bool(self.conv.session is not None and self.conv.session.sandboxed)

    async def taint(self) -> None:
        """Outside content is in the conversation: this run's and every parent's are marked."""
        if self.conv.untrusted:
            return
        await self.conv.mark_untrusted()
        if self.taint_parent is not None:
            await self.taint_parent()

    async def _spawn(self, request: SpawnRequest) -> tuple[str, bool]:
        assert self.spawner is not None  # (offered to the tools only with one)
        result = await self.spawner(
            self.deps,
            request,
            sink=self.sink.for_subagent(),
            metadata=self.metadata,
            untrusted=self.conv.untrusted,
            depth=self.depth + 1,
            parent_profile=self.on.profile,
            session_writer=self.session_writer,
            taint_parent=self.taint,
            cwd=self.cwd,
            parent_stop=self.stop,
            sandbox_pinned=self.sandbox_pinned,
            tool_runs=self.conv.tool_runs,
        )
        return result.text, result.completed_normally

"""RunEphemeral: a sub-agent run on its own, outside any turn; a parent session, when named, lends its
profile, its taint and its sandbox pin, and keeps the audit of the tools it ran."""

from __future__ import annotations

import uuid

from palimpsest.agent.audit import ToolRunLog, store_tool_runs
from palimpsest.agent.events import EventSink
from palimpsest.agent.subagent import run_subagent
from palimpsest.agent.tools.base import SpawnRequest
from palimpsest.agent.turn_context import AgentDeps
from palimpsest.shared.auth import vouching_metadata
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import session_store_pb2 as store_pb


async def run_ephemeral(
    deps: AgentDeps, request: pb.RunEphemeralRequest, metadata: tuple[tuple[str, str], ...]
) -> pb.RunEphemeralResponse:
    """The sub-agent's run, its request already checked (AgentServicer.RunEphemeral)."""
    parent_profile = None
    untrusted = pinned = False
    if request.parent_session_id:
        parent = (await deps.store.GetSession(store_pb.GetSessionRequest(session_id=request.parent_session_id))).session
        parent_profile = deps.profiles.resumed(parent.profile_id, parent.provider, parent.model)
        untrusted = parent.untrusted_ingested  # sub-agents of an untrusted session run untrusted
        pinned = parent.sandboxed
    spawn = SpawnRequest(
        text=request.text,
        profile_id=request.profile_id,
        max_iterations=request.max_iterations or 40,
        exclude_tools=tuple(request.exclude_tools),
        briefing=request.briefing,
        custom_system_prompt=request.custom_system_prompt,
        inherit_system_prompt=request.inherit_system_prompt,
        context_transfer=request.context_transfer,
        parent_session_id=request.parent_session_id,
        timeout_seconds=request.timeout_seconds or 300.0,
    )

    async def taint_parent() -> None:  # (the parent's own turns read the flag from the store)
        await deps.store.UpdateSession(
            store_pb.UpdateSessionRequest(session_id=request.parent_session_id, mark_untrusted_ingested=True)
        )

    tool_runs = ToolRunLog()
    try:
        result = await run_subagent(
            deps,
            spawn,
            sink=EventSink(request.parent_session_id, is_subagent=True),
            metadata=metadata,
            untrusted=untrusted,
            parent_profile=parent_profile,
            taint_parent=taint_parent if request.parent_session_id else None,
            sandbox_pinned=lambda: pinned,
            tool_runs=tool_runs,
        )
    finally:
        runs = tool_runs.unstored()
        if runs and request.parent_session_id:  # audited under the session it worked for, in one write
            settings = deps.settings
            await store_tool_runs(
                deps.store.AppendMessages,
                request.parent_session_id,
                runs,
                key=uuid.uuid4().hex,
                metadata=vouching_metadata(settings.auth_enabled, settings.jwt_secret),
                timeout=settings.rpc_timeout_s,
            )
    return pb.RunEphemeralResponse(text=result.text, completed_normally=result.completed_normally)

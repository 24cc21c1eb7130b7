"""Sub-agents (RunEphemeral, spawn_agent): a temporary in-memory context, nothing persisted."""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress

from palimpsest.v1 import common_pb2
from services.agent.audit import ToolRunLog
from services.agent.conversation import EphemeralConversation
from services.agent.events import EventSink
from services.agent.profiles import Profile
from services.agent.tools.base import SpawnRequest
from services.agent.turn import END, AgentDeps, SubagentOptions, Turn, TurnInput, TurnResult

log = logging.getLogger("palimpsest.agent.subagent")

Message = common_pb2.Message

STOP_GRACE_SECONDS = 5.0


def _system_prompt(deps: AgentDeps, request: SpawnRequest, profile: Profile, parent: Profile | None) -> str:
    if request.custom_system_prompt:
        base = request.custom_system_prompt
    elif request.inherit_system_prompt and parent is not None:
        base = deps.builder.system_prompt(parent)
    else:
        base = deps.builder.system_prompt(profile, subagent=True)
    return f"{base}\n\n## Briefing\n{request.briefing}" if request.briefing else base


async def run_subagent(
    deps: AgentDeps,
    request: SpawnRequest,
    *,
    sink: EventSink,
    metadata: tuple[tuple[str, str], ...],
    untrusted: bool = False,
    depth: int = 1,
    parent_profile: Profile | None = None,
    session_writer=None,
    taint_parent=None,
    cwd: str = "",
    parent_stop: asyncio.Event | None = None,
    sandbox_pinned=None,
    tool_runs: ToolRunLog | None = None,
) -> TurnResult:
    """Run to completion or timeout; returns the text and how it ended. Its tool runs go on
    `tool_runs`: the parent turn's log (spawn_agent), or RunEphemeral's, written when it ends."""
    profile = deps.profiles.get(request.profile_id or (parent_profile.id if parent_profile else ""))
    facts = await deps.ollama.model_facts(profile.model)
    seed: list[Message] = []
    if request.context_transfer:
        seed = [Message(role="user", content=f"Context from the parent task:\n{request.context_transfer}"),
                Message(role="assistant", content="Understood. I have the context.")]
    conversation = EphemeralConversation(seed, untrusted=untrusted, tool_runs=tool_runs)
    turn = Turn(deps, conversation, profile, sink, metadata, facts=facts,
                subagent=SubagentOptions(
                    parent_session_id=request.parent_session_id,
                    system_prompt=_system_prompt(deps, request, profile, parent_profile),
                    max_iterations=request.max_iterations or 40, exclude_tools=tuple(request.exclude_tools),
                    depth=depth, session_writer=session_writer, taint_parent=taint_parent, cwd=cwd,
                    sandbox_pinned=sandbox_pinned))
    text = request.text
    if profile.subagent_planning_enabled:
        from services.agent.tools.plan import run_subagent_planning

        plan = await run_subagent_planning(turn.tool_context(), text)
        if plan:
            text = f"{text}\n\n## Plan (ready — execute it now)\n{plan}"
    task = asyncio.create_task(turn.run(TurnInput(text=text)))
    # The parent's Stop stops its sub-agent too (its command, its model call), not only after it.
    relay = asyncio.create_task(_relay_stop(parent_stop, turn.stop)) if parent_stop is not None else None
    try:
        return await asyncio.wait_for(asyncio.shield(task), timeout=request.timeout_seconds or 300.0)
    except asyncio.TimeoutError:
        turn.stop.set()  # cooperative first: the sub-agent saves what it has and answers its tools
        await _finish(task, grace=STOP_GRACE_SECONDS)
        log.warning("sub-agent timed out after %.0fs", request.timeout_seconds)
        return TurnResult(text=turn.result.text, reason=END.STREAM_END_REASON_STOPPED)
    except asyncio.CancelledError:
        turn.stop.set()
        await _finish(task, grace=0)
        raise
    finally:
        if relay is not None:
            relay.cancel()


async def _relay_stop(parent: asyncio.Event, child: asyncio.Event) -> None:
    await parent.wait()
    child.set()


async def _finish(task: asyncio.Task, grace: float) -> None:
    """Give a stopped sub-agent `grace` seconds, then cancel it: nothing is left running."""
    with suppress(asyncio.TimeoutError, asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(task), timeout=grace)
    if not task.done():
        task.cancel()
        with suppress(asyncio.CancelledError, Exception):
            await task

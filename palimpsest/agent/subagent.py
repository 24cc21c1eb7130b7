"""Sub-agents (RunEphemeral, spawn_agent): a temporary in-memory context, nothing persisted."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import suppress

from palimpsest.agent.audit import ToolRunLog
from palimpsest.agent.conversation import EphemeralConversation
from palimpsest.agent.events import EventSink
from palimpsest.agent.profiles import Profile
from palimpsest.agent.tools.base import SpawnRequest
from palimpsest.agent.turn import Turn
from palimpsest.agent.turn_context import (
    END,
    AgentDeps,
    SubagentOptions,
    TurnContext,
    TurnInput,
    TurnResult,
)
from palimpsest.v1 import common_pb2

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
    session_writer: Callable[..., Awaitable[object]] | None = None,
    taint_parent: Callable[[], Awaitable[None]] | None = None,
    cwd: str = "",
    parent_stop: asyncio.Event | None = None,
    sandbox_pinned: Callable[[], bool] | None = None,
    tool_runs: ToolRunLog | None = None,
) -> TurnResult:
    """Run to completion or timeout; returns the text and how it ended. Its tool runs go on
    `tool_runs`: the parent turn's log (spawn_agent), or RunEphemeral's, written when it ends."""
    profile = deps.profiles.get(request.profile_id or (parent_profile.id if parent_profile else ""))
    facts = await deps.ollama.model_facts(profile.model)
    seed: list[Message] = []
    if request.context_transfer:
        seed = [
            Message(role="user", content=f"Context from the parent task:\n{request.context_transfer}"),
            Message(role="assistant", content="Understood. I have the context."),
        ]
    conversation = EphemeralConversation(seed, untrusted=untrusted, tool_runs=tool_runs)
    turn = Turn(
        TurnContext(
            deps,
            conversation,
            profile,
            sink,
            metadata,
            facts,
            subagent=SubagentOptions(
                parent_session_id=request.parent_session_id,
                system_prompt=_system_prompt(deps, request, profile, parent_profile),
                max_iterations=request.max_iterations or 40,
                exclude_tools=tuple(request.exclude_tools),
                depth=depth,
                session_writer=session_writer,
                taint_parent=taint_parent,
                cwd=cwd,
                sandbox_pinned=sandbox_pinned,
            ),
            spawn=run_subagent,
        )
    )
    text = request.text
    if profile.subagent_planning_enabled:
        from palimpsest.agent.tools.plan import run_subagent_planning

        plan = await run_subagent_planning(turn.tool_context(), text)
        if plan:
            text = f"{text}\n\n## Plan (ready — execute it now)\n{plan}"
    task = asyncio.create_task(turn.run(TurnInput(text=text)))
    # The parent's Stop stops its sub-agent too (its command, its model call), not only after it.
    relay = asyncio.create_task(_relay_stop(parent_stop, turn.stop)) if parent_stop is not None else None
    try:
        return await asyncio.wait_for(asyncio.shield(task), timeout=request.timeout_seconds or 300.0)
    except asyncio.TimeoutError:
        # Stopped by its event, as a client's Stop stops a turn (003: never task.cancel()): the
        # sub-agent ends its model stream, answers its remaining tool calls "not run" and returns
        # what it has.
        turn.stop.set()
        if not await _stopped_within(task, STOP_GRACE_SECONDS):
            await _cancel_last_resort(task, f"it did not stop within {STOP_GRACE_SECONDS:g}s of its timeout")
        log.warning("sub-agent timed out after %.0fs", request.timeout_seconds)
        return TurnResult(text=turn.result.text, reason=END.STREAM_END_REASON_STOPPED)
    except asyncio.CancelledError:
        # The parent's own call is cancelled (its client left): nothing will read the sub-agent's
        # answer, and the parent's cancellation must not wait on it.
        turn.stop.set()
        await _cancel_last_resort(task, "its parent's call was cancelled")
        raise
    finally:
        if relay is not None:
            relay.cancel()


async def _relay_stop(parent: asyncio.Event, child: asyncio.Event) -> None:
    await parent.wait()
    child.set()


async def _stopped_within(task: asyncio.Task, grace: float) -> bool:
    """Whether the stopped sub-agent ended by itself within `grace` seconds."""
    with suppress(asyncio.TimeoutError, asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(task), timeout=grace)
    return task.done()


async def _cancel_last_resort(task: asyncio.Task, why: str) -> None:
    """Cancel a sub-agent its stop event did not end. Kept, against 003's "never task.cancel()",
    because a custom tool (user code) may never look at the event, and a sub-agent must not outlive
    the call that asked for it, holding a model slot and its sandbox. 003's reason for the rule (a
    cancelled task corrupting a WebSocket's state) does not hold here: a sub-agent writes to no
    client connection, only to its parent's sink, and its HTTP stream to Ollama closes cleanly."""
    if task.done():
        return
    log.warning("sub-agent cancelled: %s", why)
    task.cancel()
    with suppress(asyncio.CancelledError, Exception):
        await task

"""run_command: a shell command in the session's workspace, in the OS sandbox (palimpsest.agent.sandbox)
unless the operator or the profile explicitly says otherwise. The command sees the workspace at
/workspace, starting in the turn's working folder; what it changed there goes back to the store.

Trust: without the network, a command's output and files come from the workspace and the system
image; they are outside content only when the workspace holds some. With the network they are
outside content, the session's `episode_untrusted` is set, and the call reaches outside the
conversation (the taint rule refuses it once outside content is in it).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from palimpsest.agent.sandbox import COMMAND_TOOL, SandboxError, SandboxPolicy, effective_policy
from palimpsest.agent.sandbox import run_command as run_in_sandbox
from palimpsest.agent.tools.base import Reach, ToolContext, ToolResult
from palimpsest.agent.tools.common import ToolInputError, error, text_arg
from palimpsest.shared.errors import PalimpsestError
from palimpsest.v1 import session_store_pb2 as store_pb

log = logging.getLogger("palimpsest.agent.tools")

MAX_COMMAND_CHARS = 100_000


def policy_for(ctx: ToolContext) -> SandboxPolicy:
    """How this session's commands run: the profile's policy, the session's pin, the operator's mode."""
    return effective_policy(ctx.profile.sandbox, pinned=ctx.sandbox_pinned, operator_mode=ctx.settings.sandbox_mode)


class RunCommandTool:
    name = COMMAND_TOOL
    description = (
        "Run a shell command in the workspace (mounted at /workspace; it starts in the working folder). "
        "Returns its exit code, stdout and stderr; files it writes, changes or deletes in the workspace are "
        "kept. It runs in a sandbox: no network unless the profile allows it, and limits on time, memory, "
        "processes and output."
    )
    parameters = {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "A shell command line, e.g. `python3 app.py`."}},
        "required": ["command"],
    }

    def reach_of(self, args: dict[str, Any], ctx: ToolContext) -> Reach:
        # Without the network a command only touches the session's own workspace.
        return Reach.OUTSIDE if policy_for(ctx).network else Reach.SESSION

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            command = text_arg(args, "command", required=True)
            if len(command) > MAX_COMMAND_CHARS:
                raise ToolInputError(
                    f"'command' is {len(command):,} characters; at most {MAX_COMMAND_CHARS:,} "
                    "(write a script with write_file and run that)"
                )
        except ToolInputError as exc:
            return error(f"run_command: {exc}")
        workspace = ctx.workspace
        if workspace is None:
            return error("run_command: this run has no session, so it has no workspace to run in")
        policy = policy_for(ctx)
        async with workspace.lock:
            await workspace.ready(ctx.turn_key)
            await asyncio.to_thread((workspace.folder / ctx.cwd).mkdir, parents=True, exist_ok=True)
            try:
                result = await run_in_sandbox(
                    command, workspace=workspace.folder, cwd=ctx.cwd, policy=policy, stop=ctx.stop
                )
            except SandboxError as exc:
                pinned = " (this session's commands are pinned to the sandbox)" if ctx.sandbox_pinned else ""
                return error(f"run_command: the command was not run: {exc}{pinned}")
            kept = await workspace.write_back(outside=policy.network)
        await self._mark(ctx, policy)
        outside = policy.network or any(entry.outside for entry in workspace.files.values())
        text = result.render()
        summary = kept.summary()
        if summary:
            text += "\n" + summary
        metadata: dict[str, Any] = {
            "exit_code": result.exit_code if result.exit_code is not None else -1,
            "sandboxed": result.sandboxed,
            "network": policy.network,
            "duration_s": round(result.duration_s, 3),
            "output_bytes": result.output_bytes,
        }
        if result.killed_for is not None:
            metadata["killed_for"] = str(result.killed_for)
        if ctx.stop is not None and ctx.stop.is_set():
            metadata["stopped"] = True
        return ToolResult(content=text, is_error=not result.ok, untrusted=outside, metadata=metadata)

    @staticmethod
    async def _mark(ctx: ToolContext, policy: SandboxPolicy) -> None:
        """A sandboxed command pins the session's commands to the sandbox; one with the network marks
        the session's episode untrusted. Through the running turn (its revision), or the store."""
        changes: dict[str, bool] = {}
        if policy.sandboxed and not ctx.sandbox_pinned:
            changes["mark_sandboxed"] = True
        if policy.network:
            changes["mark_episode_untrusted"] = True
        if not changes or not ctx.session_id:
            return
        try:
            if ctx.update_session is not None:
                await ctx.update_session(**changes)
            else:  # a RunEphemeral sub-agent: its parent's session, directly
                await ctx.store.UpdateSession(
                    store_pb.UpdateSessionRequest(
                        session_id=ctx.session_id,
                        mark_sandboxed=changes.get("mark_sandboxed", False),
                        mark_episode_untrusted=changes.get("mark_episode_untrusted", False),
                    )
                )
        except PalimpsestError as exc:  # the command ran; the flag is written by the next one
            log.warning("session %s not marked %s: %s", ctx.session_id, ", ".join(changes), exc)

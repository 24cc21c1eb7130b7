"""``run_command``: one shell command in a session's workspace, sandboxed unless the policy says
otherwise, and its result."""

from __future__ import annotations

import asyncio
import os
import posixpath
from pathlib import Path

from palimpsest.agent.sandbox.availability import probe
from palimpsest.agent.sandbox.owner import SandboxError, run_as, unreachable_folder
from palimpsest.agent.sandbox.policy import SandboxPolicy
from palimpsest.agent.sandbox.process import Run
from palimpsest.agent.sandbox.result import CommandResult


class SandboxUnavailable(SandboxError):
    """The policy asks for the sandbox and it cannot start here; never run unsandboxed instead."""


async def run_command(
    command: str, *, workspace: Path, cwd: str = "", policy: SandboxPolicy, stop: asyncio.Event | None = None
) -> CommandResult:
    """Run ``command`` with the shell, the workspace as /workspace (sandboxed) or as it is (on the
    host), from ``cwd`` relative to it. SandboxError when it cannot be run as asked (a bad cwd, the
    sandbox unavailable, too many commands at once); otherwise a result, however the command ended.
    Setting ``stop`` or cancelling the call kills every process the command started."""
    if "\0" in command:
        raise SandboxError("the command contains a NUL byte")
    if not command.strip():
        raise SandboxError("the command is empty")
    relative = checked_cwd(cwd)
    workspace, host_cwd = _host_folders(Path(workspace), relative)
    bwrap = ""
    if policy.sandboxed:
        status = await probe()
        if not status.available:
            raise SandboxUnavailable(f"commands run sandboxed here and the sandbox cannot start: {status.reason}")
        bwrap = status.bwrap
        if os.geteuid() == 0 and (closed := unreachable_folder(workspace)) is not None:
            raise SandboxError(
                f"the sandbox's user cannot reach the workspace {workspace}: {closed} is closed to "
                f"other users (chmod o+x {closed}: every folder above a workspace must be searchable)"
            )
    async with run_as(workspace) as who:
        run = Run(command, policy, who, stop)
        if policy.sandboxed:
            return await run.sandboxed(bwrap, workspace, relative)
        return await run.on_host(host_cwd)


def checked_cwd(cwd: str) -> str:
    """``cwd`` as a normalised path relative to the workspace ("" for its top). The caller has checked
    it already; refused here too, so nothing ever leaves the workspace by it."""
    if "\0" in cwd:
        raise SandboxError("cwd contains a NUL byte")
    if cwd.startswith("/"):
        raise SandboxError(f"cwd must be relative to the workspace, got the absolute path {cwd!r}")
    if ".." in cwd.split("/"):
        raise SandboxError(f"cwd must stay inside the workspace, got {cwd!r}")
    normal = posixpath.normpath(cwd) if cwd else "."
    return "" if normal == "." else normal


def _host_folders(workspace: Path, relative: str) -> tuple[Path, Path]:
    """The workspace and the folder ``relative`` names in it, symlinks followed: SandboxError unless
    both are folders and the second is inside the first."""
    try:
        top = workspace.resolve(strict=True)
    except (OSError, RuntimeError):
        raise SandboxError(f"the workspace {workspace} does not exist") from None
    try:
        folder = (top / relative).resolve(strict=True)
        inside = folder.is_relative_to(top)
    except (OSError, RuntimeError):
        folder, inside = top / relative, False
    if not top.is_dir() or not inside or not folder.is_dir():
        raise SandboxError(
            f"cwd {relative!r} is not a folder in the workspace"
            if relative
            else f"the workspace {workspace} is not a folder"
        )
    return top, folder

"""Can commands run sandboxed here? One real sandboxed run of ``true``, cached, and a one-line reason
naming the fix when they cannot."""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from palimpsest.agent.sandbox.owner import SandboxError, run_as
from palimpsest.agent.sandbox.policy import SandboxPolicy
from palimpsest.agent.sandbox.process import Run

log = logging.getLogger("palimpsest.agent")

# A failed probe is tried again after this long, so installing bubblewrap needs no restart.
RETRY_S = 30.0
INSTALL_HINT = "bubblewrap is not installed: apt-get install bubblewrap (dnf/apk/pacman: the bubblewrap package)"
_POLICY = SandboxPolicy(wall_seconds=30, cpu_seconds=10, processes=16, output_kb=64)
_SYSCTLS = (
    "kernel/unprivileged_userns_clone",
    "user/max_user_namespaces",
    "kernel/apparmor_restrict_unprivileged_userns",
)


@dataclass(frozen=True)
class SandboxStatus:
    available: bool
    reason: str = ""  # why not, naming the fix; "" when available
    bwrap: str = ""  # the bubblewrap binary found


_cached: SandboxStatus | None = None
_checked_at = 0.0
_lock: asyncio.Lock | None = None


async def probe(*, refresh: bool = False) -> SandboxStatus:
    """Whether bubblewrap is installed and a sandboxed ``true`` runs (user namespaces available).
    Cached: an answer that it works for good, one that it does not for RETRY_S."""
    global _cached, _checked_at, _lock
    if _cached is not None and not refresh and (_cached.available or time.monotonic() - _checked_at < RETRY_S):
        return _cached
    if _lock is None:
        _lock = asyncio.Lock()
    async with _lock:
        if _cached is None or refresh or (not _cached.available and time.monotonic() - _checked_at >= RETRY_S):
            _cached, _checked_at = await _check(), time.monotonic()
        return _cached


async def _check() -> SandboxStatus:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return SandboxStatus(False, INSTALL_HINT)
    workspace = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="palimpsest-sandbox-probe-"))
    try:
        async with run_as(workspace) as who:
            result = await Run("true", _POLICY, who, None).sandboxed(bwrap, workspace, "")
    except SandboxError as exc:
        return SandboxStatus(False, str(exc), bwrap)
    except Exception as exc:  # the check itself failed (no temporary folder, no pipes): said, never fatal
        log.exception("the sandbox check failed")
        return SandboxStatus(False, f"the sandbox check could not run: {exc}", bwrap)
    finally:
        await asyncio.to_thread(shutil.rmtree, workspace, True)
    if result.exit_code == 0:
        return SandboxStatus(True, "", bwrap)
    stderr = result.stderr.text().strip()
    return SandboxStatus(False, diagnose(stderr, _read_sysctls()), bwrap)


def _read_sysctls() -> dict[str, str]:
    values = {}
    for name in _SYSCTLS:
        try:
            values[name.replace("/", ".")] = Path("/proc/sys", name).read_text().strip()
        except OSError:
            continue
    return values


def diagnose(stderr: str, sysctls: dict[str, str]) -> str:
    """Why a sandboxed ``true`` failed, from bwrap's message and the kernel's switches, as one line
    naming the fix."""
    said = (stderr.splitlines()[-1] if stderr else "no message").removeprefix("bwrap: ")
    said = f"(bwrap: {said})"
    if sysctls.get("kernel.unprivileged_userns_clone") == "0":
        return f"user namespaces are off for unprivileged users: sysctl -w kernel.unprivileged_userns_clone=1 {said}"
    if sysctls.get("user.max_user_namespaces") == "0":
        return f"user namespaces are off: sysctl -w user.max_user_namespaces=15000 {said}"
    if sysctls.get("kernel.apparmor_restrict_unprivileged_userns") == "1":
        return (
            "AppArmor keeps unprivileged programs from making user namespaces: give bwrap an AppArmor "
            f"profile that allows them, or sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 {said}"
        )
    lowered = said.lower()
    if "namespace" in lowered or "operation not permitted" in lowered or "uid map" in lowered:
        return (
            "bubblewrap cannot make its user namespace: allow unprivileged user namespaces where the Agent "
            "runs (in a container, its runtime or the pod's securityContext must; docs/deploying.md, Commands in a pod) "
            + said
        )
    return f"a sandboxed test command failed {said}"


def forget() -> None:
    """Drop the cached answer (tests)."""
    global _cached
    _cached = None

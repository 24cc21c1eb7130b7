"""What a command costs before it does anything: `true` from start to exit through `run_command`,
sandboxed (bubblewrap) and on the host side by side, run in turns so both see the same load; and,
to show where the time goes, the same bwrap command line spawned bare, and `/bin/true` spawned bare."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from bench import _common
from palimpsest.agent.sandbox import SandboxPolicy, probe, run_command
from palimpsest.agent.sandbox.launch import ETC_FILES, as_user, bwrap_argv, host_layout
from palimpsest.agent.sandbox.owner import FIRST_UID

NEEDS_POSTGRES = False
RUNS = 200
TARGET_P50_S = 0.030
# Held while measuring, as an Agent holds its warm sessions and buffers: a spawn must not copy it.
BALLAST_MB = 256


def _bare_bwrap(bwrap: str, workspace: Path) -> tuple[list[str], list[int], int]:
    """The sandboxed run's bwrap command line with the descriptors it is given, for spawning without
    run_command, and the read end of its status pipe (open until it exits: a write into a closed pipe
    would kill it)."""
    fds = [os.open(workspace, os.O_RDONLY | os.O_DIRECTORY)]
    status_r, status_w = os.pipe()
    fds.append(status_w)
    etc = {}
    for path, text in ETC_FILES.items():
        r, w = os.pipe()
        os.write(w, text.encode())
        os.close(w)
        etc[path] = r
        fds.append(r)
    argv = bwrap_argv(
        bwrap, "true", SandboxPolicy(), host_layout(), cwd="", workspace_fd=fds[0], status_fd=status_w, etc_fds=etc
    )
    return argv, fds, status_r


def _spawn_bare(argv: list[str], fds: list[int]) -> None:
    argv = as_user(argv, host_layout(), uid=FIRST_UID + 500 if os.geteuid() == 0 else None, no_new_privs=False)
    subprocess.run(argv, pass_fds=fds, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


async def run(args) -> str:
    status = await probe()
    if not status.available:
        return f"**skipped:** the sandbox cannot start here: {status.reason}"
    runs = 30 if args.quick else RUNS
    base = Path(tempfile.mkdtemp(prefix="palimpsest-bench-sandbox-"))
    base.chmod(0o711)  # a pool uid must pass through, as through the Agent's workspaces' root
    workspace = base / "workspace"
    workspace.mkdir()
    ballast = bytearray(BALLAST_MB * 1024 * 1024)
    for page in range(0, len(ballast), 4096):
        ballast[page] = 1  # resident, not just reserved
    times: dict[str, list[float]] = {name: [] for name in ("sandboxed", "host", "bwrap alone", "true alone")}
    try:
        for _ in range(5):  # warm the page cache and the probe
            await run_command("true", workspace=workspace, policy=SandboxPolicy())
        for i in range(runs):
            for name in times:  # in turns: every variant sees the same moments of load
                started = time.perf_counter()
                if name == "sandboxed":
                    result = await run_command("true", workspace=workspace, policy=SandboxPolicy())
                elif name == "host":
                    result = await run_command("true", workspace=workspace, policy=SandboxPolicy(sandboxed=False))
                elif name == "bwrap alone":
                    argv, fds, status_r = _bare_bwrap(status.bwrap, workspace)
                    started = time.perf_counter()
                    _spawn_bare(argv, fds)
                    for fd in (*fds, status_r):
                        os.close(fd)
                else:
                    subprocess.run(["/bin/true"], check=False)
                times[name].append(time.perf_counter() - started)
                if name in ("sandboxed", "host") and result.exit_code != 0:
                    raise RuntimeError(f"`true` failed {name}: {result.render()}")
    finally:
        shutil.rmtree(base, ignore_errors=True)

    what = {
        "sandboxed": "run_command, sandboxed (bubblewrap)",
        "host": "run_command, on the host",
        "bwrap alone": "the same bwrap line, spawned bare",
        "true alone": "/bin/true, spawned bare",
    }
    rows = [
        [
            what[name],
            _common.ms(_common.p50(ts)),
            _common.ms(_common.percentile(ts, 95)),
            _common.ms(_common.percentile(ts, 99)),
            _common.ms(max(ts)),
        ]
        for name, ts in times.items()
    ]
    sandboxed_p50 = _common.p50(times["sandboxed"])
    verdict = "✓" if sandboxed_p50 < TARGET_P50_S else "✗ MISSED"
    bwrap_version = subprocess.run([status.bwrap, "--version"], capture_output=True, text=True).stdout.strip()
    return "\n".join(
        [
            f"`true`, start to exit (ms), {runs} runs of each, in turns; target sandboxed p50 < 30 ms: "
            f"{_common.ms(sandboxed_p50)} {verdict}",
            "",
            _common.table(["command", "p50", "p95", "p99", "max"], rows),
            "",
            f"- {bwrap_version}, {host_layout().shell}, Linux {platform.release()}, {os.cpu_count()} cores; "
            f"run as {'root (pool uids)' if os.geteuid() == 0 else 'uid ' + str(os.getuid())}; the process holds "
            f"{BALLAST_MB} MB resident while measuring, as an Agent would.",
            "- run_command includes the workspace handed to the pool uid and back (an empty workspace here), the "
            "limits set by the shell, the pipes, and waiting until every process is gone.",
        ]
    )

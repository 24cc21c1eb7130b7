"""A command's processes, start to end: spawned under bubblewrap or on the host, held to the wall
time and output limits, and every process gone when the run returns (killed on stop or cancel).

Processes are watched through pidfds and pipes on the event loop rather than asyncio's subprocess
support, whose wait() lasts as long as any process holds the command's stdout open (a `sleep &`)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from palimpsest.agent.sandbox.launch import ENVIRONMENT, ETC_FILES, as_user, bwrap_argv, host_layout, shell_argv
from palimpsest.agent.sandbox.owner import RunAs, SandboxError
from palimpsest.agent.sandbox.policy import SandboxPolicy
from palimpsest.agent.sandbox.result import CommandResult, StopReason, StreamCapture

READ_CHUNK = 64 * 1024
# Once every process is gone, output still in the pipes arrives at once; only a process that left
# the command's process group on a host run (no pid namespace, not a pool uid) can hold a pipe open.
DRAIN_S = 2.0
# Exit code of the limits prefix when the shell could not set them (launch.limits_prefix).
LIMITS_FAILED = 125
# bwrap names the sandbox's init on its status descriptor right after making it.
NAMED_WAIT_S = 5.0

_MEMORY_WORDS = re.compile(
    rb"cannot allocate|out of memory|memoryerror|bad_alloc|memory exhausted"
    rb"|failed to reserve virtual memory|allocation failed",
    re.IGNORECASE,
)
_FORK_WORDS = re.compile(
    rb"cannot fork|fork: retry|fork: resource temporarily unavailable"
    rb"|can't fork|unable to create (a )?(new )?(native )?thread",
    re.IGNORECASE,
)


class Run:
    """One command's run: ``sandboxed`` or ``on_host``, each returning its result."""

    def __init__(self, command: str, policy: SandboxPolicy, who: RunAs, stop: asyncio.Event | None) -> None:
        self.command = command
        self.policy = policy
        self.who = who
        self.stop = stop
        self.stdout = StreamCapture(policy.keep_bytes)
        self.stderr = StreamCapture(policy.keep_bytes)
        self.output_bytes = 0
        self.over_limit = asyncio.Event()

    async def on_host(self, folder: Path) -> CommandResult:
        # The processes limit counts every process of the user: right for a pool uid, but an Agent
        # running as itself would count its own threads and every other command's processes.
        argv = shell_argv(self.command, self.policy, host_layout(), processes=self.who.switched)
        popen = self._spawn(argv, cwd=str(folder), pass_fds=(), no_new_privs=True)

        async def kill_tree() -> None:
            _kill_group(popen.pid)

        async def after_exit() -> None:
            _kill_group(popen.pid)  # whatever the shell left running in its process group
            self.who.sweep_when_done()  # and, with a pool uid, whatever left the group (setsid)

        return await self._supervise(popen, kill_tree, after_exit, sandboxed=False)

    async def sandboxed(self, bwrap: str, workspace: Path, relative: str) -> CommandResult:
        passed: list[int] = []
        status_fd = -1
        try:
            passed.append(os.open(workspace, os.O_RDONLY | os.O_DIRECTORY))
            status_fd, status_w = os.pipe()
            passed.append(status_w)
            etc_fds = {}
            for path, text in ETC_FILES.items():
                read_end, write_end = os.pipe()
                os.write(write_end, text.encode())  # a few hundred bytes: never fills the pipe
                os.close(write_end)
                etc_fds[path] = read_end
                passed.append(read_end)
            argv = bwrap_argv(
                bwrap,
                self.command,
                self.policy,
                host_layout(),
                cwd=relative,
                workspace_fd=passed[0],
                status_fd=status_w,
                etc_fds=etc_fds,
            )
            popen = self._spawn(argv, cwd="/", pass_fds=tuple(passed), no_new_privs=False)  # bwrap sets it
        except BaseException:
            if status_fd >= 0:
                os.close(status_fd)
            raise
        finally:
            for fd in passed:
                os.close(fd)
        sandbox = _SandboxInit(status_fd, popen.pid)

        async def kill_tree() -> None:
            if not await sandbox.kill():
                _kill_group(popen.pid)  # bwrap before it made the sandbox: --die-with-parent does the rest

        async def after_exit() -> None:
            if not await sandbox.gone():
                # bwrap ended before saying which process is the sandbox's init: found by uid, later.
                self.who.sweep_when_done()

        try:
            return await self._supervise(popen, kill_tree, after_exit, sandboxed=True)
        finally:
            sandbox.close()

    def _spawn(self, argv: list[str], *, cwd: str, pass_fds: tuple[int, ...], no_new_privs: bool) -> subprocess.Popen:
        try:
            argv = as_user(
                argv, host_layout(), uid=self.who.uid if self.who.switched else None, no_new_privs=no_new_privs
            )
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=dict(ENVIRONMENT),
                cwd=cwd,
                start_new_session=True,
                pass_fds=pass_fds,
            )
        except FileNotFoundError as exc:
            missing = exc.filename or str(exc) or argv[0]
            hint = " (util-linux)" if "setpriv" in missing else ""
            raise SandboxError(f"cannot start the command: {missing}{hint} is not installed") from None

    def _count(self, capture: StreamCapture, chunk: bytes) -> None:
        capture.feed(chunk)
        self.output_bytes += len(chunk)
        if self.output_bytes > self.policy.output_limit_bytes:
            self.over_limit.set()

    async def _supervise(
        self,
        popen: subprocess.Popen,
        kill_tree: Callable[[], Awaitable[None]],
        after_exit: Callable[[], Awaitable[None]],
        *,
        sandboxed: bool,
    ) -> CommandResult:
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert popen.stdout is not None and popen.stderr is not None
        try:
            exit_watch = _ExitWatch(popen)  # the child is not reaped until it reports: its pid is its own
        except OSError:  # no descriptor left for its pidfd: the command must not run unwatched
            _kill_group(popen.pid)
            popen.wait()
            raise
        pipes = [
            _PipeReader(popen.stdout, lambda chunk: self._count(self.stdout, chunk)),
            _PipeReader(popen.stderr, lambda chunk: self._count(self.stderr, chunk)),
        ]
        waits: list[asyncio.Task[bool]] = [asyncio.create_task(self.over_limit.wait())]
        if self.stop is not None:
            waits.append(asyncio.create_task(self.stop.wait()))
        killed_for: StopReason | None = None
        try:
            watched: list[asyncio.Future[Any]] = [exit_watch.exited, *waits]
            await asyncio.wait(watched, timeout=self.policy.wall_seconds, return_when=asyncio.FIRST_COMPLETED)
            if not exit_watch.exited.done():
                killed_for = (
                    "output"
                    if self.over_limit.is_set()
                    else "stop"
                    if self.stop is not None and self.stop.is_set()
                    else "wall_time"
                )
                await kill_tree()
            returncode = await exit_watch.exited
            duration = loop.time() - started
            await after_exit()
            await asyncio.wait([pipe.closed for pipe in pipes], timeout=DRAIN_S)
        except BaseException:
            # Cancelled (the turn ended or was stopped): the tree goes first, shielded from the cancel.
            await asyncio.shield(self._end_now(exit_watch, kill_tree, after_exit))
            raise
        finally:
            for task in waits:
                task.cancel()
            for pipe in pipes:
                pipe.close()
            exit_watch.close()
        return self._result(returncode, duration, killed_for, sandboxed)

    @staticmethod
    async def _end_now(
        exit_watch: "_ExitWatch", kill_tree: Callable[[], Awaitable[None]], after_exit: Callable[[], Awaitable[None]]
    ) -> None:
        if not exit_watch.exited.done():
            await kill_tree()
        await exit_watch.exited
        await after_exit()

    def _result(
        self, returncode: int, duration: float, killed_for: StopReason | None, sandboxed: bool
    ) -> CommandResult:
        stderr = self.stderr.captured()
        exit_code: int | None
        if killed_for is not None:
            exit_code, number = None, int(signal.SIGKILL)
        elif returncode < 0:
            exit_code, number = None, -returncode
        else:
            exit_code, number = returncode, None
        if killed_for is None:
            killed_for = classify_end(exit_code, number, stderr.head + stderr.tail)
        return CommandResult(
            command=self.command,
            exit_code=exit_code,
            signal=number,
            stdout=self.stdout.captured(),
            stderr=stderr,
            duration_s=duration,
            sandboxed=sandboxed,
            killed_for=killed_for,
            note=describe_end(killed_for, exit_code, self.policy, self.output_bytes),
        )


def classify_end(exit_code: int | None, number: int | None, stderr: bytes) -> StopReason | None:
    """Which limit ended a command that ended by itself, as far as can be told: a signal the kernel
    sends at a limit (directly, or as a shell's or bwrap's 128 + N), else words its stderr says."""
    if number is None and exit_code is not None and 128 < exit_code < 160:
        number = exit_code - 128
    if number == signal.SIGXCPU:
        return "cpu"
    if number == signal.SIGXFSZ:
        return "file_size"
    if exit_code == 0:
        return None
    if _MEMORY_WORDS.search(stderr):
        return "memory"
    if _FORK_WORDS.search(stderr):
        return "processes"
    return None


def describe_end(reason: StopReason | None, exit_code: int | None, policy: SandboxPolicy, output_bytes: int) -> str:
    """One line naming the limit that ended a command, and its value."""
    if reason is None:
        return "the sandbox could not set the command's limits" if exit_code == LIMITS_FAILED else ""
    return {
        "wall_time": f"the time limit ({policy.wall_seconds:g} s) was reached",
        "output": f"{output_bytes:,} bytes of output passed the limit ({policy.output_kb:,} KB)",
        "stop": "the turn was stopped",
        "cpu": f"the CPU time limit ({policy.cpu_seconds} s) was reached",
        "file_size": f"a file reached the size limit ({policy.file_size_mb} MB)",
        "memory": f"it seems to have run out of memory (the limit is {policy.memory_mb} MB of address space a process)",
        "processes": f"it seems to have reached the processes limit ({policy.processes} processes and threads)",
    }[reason]


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _when_readable(fd: int) -> asyncio.Future[None]:
    """A future done once ``fd`` turns readable (a pidfd: its process has exited)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def on_ready() -> None:
        loop.remove_reader(fd)
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, on_ready)
    ready.add_done_callback(lambda _: loop.remove_reader(fd))
    return ready


class _ExitWatch:
    """The spawned process's exit, through its pidfd (it cannot be reused: the process is ours and
    reaped only here, once the pidfd says it exited); ``exited`` gives its return code."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self._popen = popen
        self._pidfd = os.pidfd_open(popen.pid)
        self.exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        _when_readable(self._pidfd).add_done_callback(self._reap)

    def _reap(self, ready: asyncio.Future[None]) -> None:
        if not ready.cancelled() and not self.exited.done():
            self.exited.set_result(self._popen.wait())  # exited already: returns at once

    def close(self) -> None:
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1


class _PipeReader:
    """Reads one of the command's pipes on the event loop, handing each chunk to ``sink``."""

    def __init__(self, pipe: object, sink: Callable[[bytes], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._pipe = pipe
        self._fd = pipe.fileno()  # type: ignore[attr-defined]
        self._sink = sink
        self.closed: asyncio.Future[None] = self._loop.create_future()
        os.set_blocking(self._fd, False)
        self._loop.add_reader(self._fd, self._on_readable)

    def _on_readable(self) -> None:
        try:
            chunk = os.read(self._fd, READ_CHUNK)
        except BlockingIOError:
            return
        if chunk:
            self._sink(chunk)
        else:
            self.close()

    def close(self) -> None:
        if not self.closed.done():
            self._loop.remove_reader(self._fd)
            self._pipe.close()  # type: ignore[attr-defined]
            self.closed.set_result(None)


class _SandboxInit:
    """The sandbox's pid 1 (bwrap's init), named on bwrap's status descriptor. Killing it makes the
    kernel kill every process of the sandbox's pid namespace, and its pidfd turns readable only once
    they are all gone: that is how an ended command is known to have left nothing behind."""

    def __init__(self, status_fd: int, bwrap_pid: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._fd: int | None = status_fd
        self._bwrap_pid = bwrap_pid
        self._text = b""
        self.pidfd: int | None = None
        self.named: asyncio.Future[bool] = self._loop.create_future()  # True: bwrap said which it is
        os.set_blocking(status_fd, False)
        self._loop.add_reader(status_fd, self._on_status)

    def _on_status(self) -> None:
        assert self._fd is not None
        try:
            data = os.read(self._fd, 4096)
        except BlockingIOError:
            return
        if not data:  # bwrap has exited (read to the end: bwrap must never write into a closed pipe)
            self._stop_reading()
        elif not self.named.done():
            self._text += data
            if b"\n" in self._text:
                self._name(self._text.split(b"\n", 1)[0])

    def _name(self, line: bytes) -> None:
        try:
            status = json.loads(line)
        except ValueError:
            status = {}
        pid, namespace = status.get("child-pid"), status.get("pid-namespace")
        if isinstance(pid, int):
            self.pidfd = _open_init(pid, namespace, self._bwrap_pid)
        self.named.set_result(True)

    def _stop_reading(self) -> None:
        if self._fd is not None:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None
        if not self.named.done():
            self.named.set_result(False)

    async def kill(self) -> bool:
        """SIGKILL the sandbox's init; bwrap then reaps it and exits. False when there is none to
        kill (bwrap has not made it, or has said nothing yet)."""
        # bwrap names its init right after making it, or exits: a short wait, bounded all the same.
        try:
            await asyncio.wait_for(asyncio.shield(self.named), NAMED_WAIT_S)
        except asyncio.TimeoutError:
            return False
        if self.pidfd is None:
            return False
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return True

    async def gone(self) -> bool:
        """Once bwrap has exited: wait until the sandbox's init, and so every process in it, is gone.
        False when bwrap never named it (it died before)."""
        named = await self.named
        if self.pidfd is not None:
            await _when_readable(self.pidfd)
        return named

    def close(self) -> None:
        self._stop_reading()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def _open_init(pid: int, namespace: object, bwrap_pid: int) -> int | None:
    """A pidfd of the sandbox's init, checked after opening it (so a pid reused meanwhile is never
    the one signalled): its pid namespace is the one bwrap named, or, where that cannot be read, its
    parent is bwrap. None when it is already gone."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return None
    try:
        ours = os.stat(f"/proc/{pid}/ns/pid").st_ino == namespace
    except PermissionError:
        ours = _parent(pid) == bwrap_pid
    except OSError:
        ours = False
    if not ours:
        os.close(pidfd)
        return None
    return pidfd


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return int(stat.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None

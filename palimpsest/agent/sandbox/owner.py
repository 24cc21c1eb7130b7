"""Who a command runs as on the host. An Agent running as root hands each workspace in use an
unprivileged uid of its own for its commands: the kernel does not enforce a processes limit on uid 0,
and a uid no other workspace shares lets the end of a workspace's commands find every process they
left. The workspace is that uid's while its commands run and the Agent's again afterwards."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import pwd
import signal
import stat
import tempfile
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("palimpsest.agent")

# A range no account names (checked): 64000–64511 lie in Debian's range for dynamic system users,
# which such installs rarely reach, and within the 65,536 uids a user-namespaced container maps.
FIRST_UID = 64000
POOL_SIZE = 512
# Where a uid in use is claimed host-wide: two root Agents on one host (replicas, a test run's
# workers) each have a pool over the same range, and a uid both handed out would share one processes
# limit, and one's sweep would kill the other's commands. An flock is let go when its holder dies.
CLAIMS_DIR = Path("/run/palimpsest-sandbox-uids")


class SandboxError(Exception):
    """A command cannot be run as asked; the message says why, for the model or the operator."""


def _claims_dir() -> Path:
    """The claims folder: made by this user, or made before by this user and no one else's to
    write (in the temporary folder another user could have made it first, to plant links)."""
    for folder in (CLAIMS_DIR, Path(tempfile.gettempdir()) / CLAIMS_DIR.name):
        try:
            folder.mkdir(mode=0o700, exist_ok=True)
            st = os.lstat(folder)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077:
            return folder
    raise SandboxError(f"no folder to claim sandbox uids in: {CLAIMS_DIR} cannot be made, nor a private one in /tmp")


def claim(uid: int) -> int | None:
    """Claim ``uid`` for this process, host-wide: the descriptor that holds the claim (closing it
    lets go), or None when another process holds it. SandboxError when no claim can be made."""
    try:
        fd = os.open(_claims_dir() / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise SandboxError(f"cannot claim a sandbox uid: {exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError as exc:
        os.close(fd)
        raise SandboxError(f"cannot claim a sandbox uid: {exc}") from None
    return fd


@dataclass
class _Lease:
    uid: int
    claim: int  # the descriptor holding the uid's host-wide claim
    holders: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    sweep: bool = False  # a command may have left processes outside its reach: kill the uid's at the end


@dataclass(frozen=True)
class RunAs:
    uid: int
    gid: int
    switched: bool  # True: a pool uid of its own (the Agent is root); False: the Agent's own user
    _lease: _Lease | None = field(default=None, repr=False)

    def sweep_when_done(self) -> None:
        """Once the workspace's last command ends, kill every process of its uid: this command may
        have left some its own end cannot reach (a host run's `setsid`). Not at this command's own
        end: another command of the workspace shares the uid and may still be running."""
        if self._lease is not None:
            self._lease.sweep = True


class UidPool:
    """Unprivileged uids, one per workspace with commands running (commands in one workspace share
    it: they share its files)."""

    def __init__(self, first: int = FIRST_UID, size: int = POOL_SIZE) -> None:
        # Handed out oldest-freed first: processes a host run orphaned may linger as zombies until
        # the host's init reaps them, and they count against their uid's processes limit till then.
        self._free = deque(uid for uid in range(first, first + size) if not _names_an_account(uid))
        self._leases: dict[Path, _Lease] = {}

    @asynccontextmanager
    async def lease(self, workspace: Path) -> AsyncIterator[RunAs]:
        """The workspace's uid while the block runs: the workspace's files are chowned to it first
        (the Agent may have written some since), and back to the Agent by the last holder."""
        lease = self._leases.get(workspace)
        if lease is None:
            lease = self._leases[workspace] = self._new_lease()
        lease.holders += 1
        try:
            async with lease.lock:
                await _to_the_end(asyncio.to_thread(hand_over, workspace, lease.uid, lease.uid))
            yield RunAs(lease.uid, lease.uid, switched=True, _lease=lease)
        finally:
            lease.holders -= 1
            if lease.holders == 0:
                # Shielded: a cancelled turn must still leave the workspace the Agent's and the uid free.
                await asyncio.shield(self._give_back(workspace, lease))

    def _new_lease(self) -> _Lease:
        """The oldest-freed uid no other process on the host holds."""
        for _ in range(len(self._free)):
            uid = self._free[0]
            fd = claim(uid)  # a SandboxError leaves the pool as it was
            self._free.rotate(-1)
            if fd is not None:
                self._free.pop()
                return _Lease(uid, fd)
            # another process's: tried again after the rest
        raise SandboxError(
            f"too many commands are running at once ({len(self._leases)} workspaces here, "
            f"{POOL_SIZE} uids on the host); try again when one has finished"
        )

    async def _give_back(self, workspace: Path, lease: _Lease) -> None:
        async with lease.lock:
            if lease.holders:
                return  # another command started here meanwhile and keeps the lease
            if self._leases.get(workspace) is not lease:
                # Let go already: one that arrived and was cancelled before it held the lock queued
                # this second give-back, and the uid (its processes, its claim) may be another's now.
                return
            try:
                if lease.sweep:  # first: nothing of the uid may change the files while they are taken back
                    await asyncio.to_thread(kill_user_processes, lease.uid)
                    lease.sweep = False
                await asyncio.to_thread(take_back, workspace, lease.uid, os.getuid(), os.getgid())
            finally:
                if not lease.holders:  # else one arrived meanwhile: it hands the workspace over again
                    del self._leases[workspace]
                    os.close(lease.claim)
                    self._free.append(lease.uid)


async def _to_the_end(work: Awaitable[None]) -> None:
    """Await ``work``; when cancelled, let it finish first: a walk over a workspace cut short by a
    cancel would race the walk that gives the workspace back."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise


def unreachable_folder(workspace: Path) -> Path | None:
    """The first folder above ``workspace`` a pool uid cannot pass through (bubblewrap, which runs as
    that uid, reaches the workspace by its path), or None when every one is searchable by others."""
    for folder in reversed(workspace.resolve().parents):
        if not folder.stat().st_mode & stat.S_IXOTH:
            return folder
    return None


def _names_an_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def _entries(workspace: Path) -> Iterator[tuple[int, str, os.stat_result]]:
    """(directory descriptor, name, lstat) of the workspace itself and of everything in it. Through
    descriptors (fwalk) and never through a symlink, so a tree changing underneath cannot lead the
    walk out of the workspace."""
    first = True
    if not workspace.is_dir():
        return  # removed meanwhile (the session was deleted): nothing left to hand over or back
    for _, dirs, files, dir_fd in os.fwalk(workspace, follow_symlinks=False):
        names = [".", *dirs, *files] if first else [*dirs, *files]
        first = False
        for name in names:
            try:
                yield dir_fd, name, os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed meanwhile by a command of this workspace


def hand_over(workspace: Path, uid: int, gid: int) -> None:
    """Make the workspace's files ``uid``'s. A file with more than one link is left alone: its other
    name may be outside the workspace."""
    for dir_fd, name, st in _entries(workspace):
        if (st.st_uid, st.st_gid) != (uid, gid) and (stat.S_ISDIR(st.st_mode) or st.st_nlink == 1):
            _chown(name, uid, gid, dir_fd)


def take_back(workspace: Path, uid: int, agent_uid: int, agent_gid: int) -> None:
    """Give everything ``uid`` owns in the workspace back to the Agent, without set-id bits: a
    command must not leave a program that runs as the Agent's user."""
    for dir_fd, name, st in _entries(workspace):
        if uid not in (st.st_uid, st.st_gid):
            continue
        _chown(name, agent_uid, agent_gid, dir_fd)
        if stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
            _drop_set_id(name, dir_fd)


def _drop_set_id(name: str, dir_fd: int) -> None:
    # Through a descriptor opened without following a symlink: chmod by name would follow one.
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=dir_fd)
    except OSError:  # gone, or a symlink now: nothing of ours to change
        return
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
    finally:
        os.close(fd)


def _chown(name: str, uid: int, gid: int, dir_fd: int) -> None:
    try:
        os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        pass


_pool: UidPool | None = None


@asynccontextmanager
async def run_as(workspace: Path) -> AsyncIterator[RunAs]:
    """The host user a command in ``workspace`` runs as: a pool uid when the Agent is root, else the
    Agent's own user (the kernel then enforces the limits as they are)."""
    global _pool
    if os.geteuid() != 0:
        yield RunAs(os.getuid(), os.getgid(), switched=False)
        return
    if _pool is None:
        _pool = UidPool()
    async with _pool.lease(workspace) as who:
        yield who


def kill_user_processes(uid: int, rounds: int = 100) -> int:
    """SIGKILL every live process whose real uid is ``uid``, scanning /proc until none is left (what
    a command started outside its process group, e.g. with setsid). Only for a pool uid: nothing else
    runs as one. Each kill goes through a pidfd checked to be that same process. The processes found
    in all, or -1 when some were still forking after ``rounds`` scans."""
    found = 0
    for _ in range(rounds):
        pids = [pid for pid in _pids() if _real_uid(pid) == uid]
        if not pids:
            return found
        for pid in pids:
            try:
                pidfd = os.pidfd_open(pid)
            except (ProcessLookupError, OSError):
                continue
            try:
                if _real_uid(pid) == uid:  # the pidfd names this pid's process, checked after it was opened
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    found += 1
            except ProcessLookupError:
                pass
            finally:
                os.close(pidfd)
    log.warning("processes of uid %d were still starting after %d rounds of kills", uid, rounds)
    return -1


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _real_uid(pid: int) -> int | None:
    """The real uid of a live process; None for one gone or a zombie (nothing left to kill)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            text = status.read()
    except OSError:
        return None
    state = uid = None
    for line in text.split(b"\n"):
        if line.startswith(b"State:"):
            state = line.split()[1]
        elif line.startswith(b"Uid:"):
            uid = int(line.split()[1])
            break
    return None if state in (b"Z", b"X") else uid

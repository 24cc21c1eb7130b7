"""How a command is started: the fixed environment, the limits as the shell's own ``ulimit``s, and
bubblewrap's arguments. Pure functions over the host's layout, which is read once."""

from __future__ import annotations

import functools
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

from palimpsest.agent.sandbox.policy import SandboxPolicy

WORKSPACE = "/workspace"
# The user commands run as inside the sandbox (mapped to an unprivileged host uid).
SANDBOX_UID = 1000
SANDBOX_USER = "sandbox"
HOSTNAME = "sandbox"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Everything a command gets of an environment: nothing of the Agent's (its secrets live there).
ENVIRONMENT = {"PATH": PATH, "HOME": "/tmp", "LANG": "C.UTF-8", "TERM": "dumb"}

# The system, read-only; on merged-/usr hosts all but /usr are symlinks, made as symlinks.
_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What of the host's /etc a command may see: the loader's cache, CA certificates, alternatives'
# symlinks and public tables; never the whole of it (/etc/shadow, the services' configuration).
_ETC_SHARED = (
    "/etc/ld.so.cache",
    "/etc/alternatives",
    "/etc/ssl/certs",
    "/etc/ssl/openssl.cnf",
    "/etc/ca-certificates.conf",
    "/etc/services",
    "/etc/protocols",
    "/etc/localtime",
    "/etc/os-release",
    "/etc/mime.types",
)
_ETC_NETWORK = ("/etc/resolv.conf", "/etc/gai.conf")

# The sandbox's own /etc files (accounts of its one user, names, lookups), written by bwrap.
ETC_FILES = {
    "/etc/passwd": (
        f"root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"{SANDBOX_USER}:x:{SANDBOX_UID}:{SANDBOX_UID}:{SANDBOX_USER}:/tmp:/bin/sh\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    ),
    "/etc/group": f"root:x:0:\n{SANDBOX_USER}:x:{SANDBOX_UID}:\nnogroup:x:65534:\n",
    "/etc/hosts": f"127.0.0.1\tlocalhost {HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    "/etc/hostname": f"{HOSTNAME}\n",
    "/etc/nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\n"
    "protocols: files\nservices: files\n",
}


@dataclass(frozen=True)
class HostLayout:
    shell: str  # bash when the host has it (what models write), else sh
    system: tuple[tuple[str, str | None], ...]  # (path, symlink target or None for a directory)
    etc_shared: tuple[str, ...]
    etc_network: tuple[str, ...]
    setpriv: str  # util-linux's, "" when missing

    @property
    def bash(self) -> bool:
        return self.shell.endswith("bash")


@functools.cache
def host_layout() -> HostLayout:
    system: list[tuple[str, str | None]] = []
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            system.append((path, os.readlink(path)))
        elif os.path.isdir(path):
            system.append((path, None))
    return HostLayout(
        shell="/bin/bash" if os.access("/bin/bash", os.X_OK) else "/bin/sh",
        system=tuple(system),
        etc_shared=tuple(p for p in _ETC_SHARED if os.path.lexists(p)),
        etc_network=tuple(p for p in _ETC_NETWORK if os.path.lexists(p)),
        setpriv=shutil.which("setpriv", path=PATH) or "",
    )


def as_user(argv: list[str], layout: HostLayout, *, uid: int | None, no_new_privs: bool) -> list[str]:
    """``argv`` started through setpriv: as ``uid`` (and its group, no others) when given, and unable
    to gain privileges through set-id programs when asked. Through setpriv rather than Popen's
    user=, which makes Python fork instead of vfork: copying the Agent's page tables costs
    milliseconds per hundred megabytes it holds."""
    if uid is None and not no_new_privs:
        return argv
    if not layout.setpriv:
        raise FileNotFoundError("setpriv")
    options = ["--reuid", str(uid), "--regid", str(uid), "--clear-groups"] if uid is not None else []
    return [layout.setpriv, *options, *(["--no-new-privs"] if no_new_privs else []), "--", *argv]


def limits_prefix(policy: SandboxPolicy, *, bash: bool, processes: bool = True) -> str:
    """The policy's limits as ``ulimit`` calls run by the command's own shell before the command, on
    its first line (error messages keep their line numbers). Run inside the sandbox's user namespace,
    the processes limit counts only the sandbox's processes. CPU: soft at the limit (SIGXCPU, which
    says why), hard a second later (SIGKILL). ``|| exit 125``: never run the command without them."""
    block = 1024 if bash else 512  # ulimit -f units: bash counts KiB, dash 512-byte blocks
    limits = [
        "ulimit -c 0",
        f"ulimit -v {policy.memory_mb * 1024}",
        f"ulimit -f {policy.file_size_mb * 1024 * 1024 // block}",
        f"ulimit -n {policy.open_files}",
        f"ulimit -S -t {policy.cpu_seconds}",
        f"ulimit -H -t {policy.cpu_seconds + 1}",
    ]
    if processes:
        limits.append(f"ulimit {'-u' if bash else '-p'} {policy.processes}")
    # Traps keep the shell from exec'ing the last command: the shell stays the sandbox's pid 1 (it
    # reaps orphans) and the command runs as its child, where the limits' signals land. The kernel
    # spares a pid 1 the signals it has no handler for: the shell's own say how it ended.
    traps = f"trap : EXIT; trap 'exit {128 + signal.SIGXCPU}' XCPU; trap 'exit {128 + signal.SIGXFSZ}' XFSZ; "
    return traps + " && ".join(limits) + " || exit 125; "


def shell_argv(command: str, policy: SandboxPolicy, layout: HostLayout, *, processes: bool = True) -> list[str]:
    return [layout.shell, "-c", limits_prefix(policy, bash=layout.bash, processes=processes) + command]


def bwrap_argv(
    bwrap: str,
    command: str,
    policy: SandboxPolicy,
    layout: HostLayout,
    *,
    cwd: str,
    workspace_fd: int,
    status_fd: int,
    etc_fds: dict[str, int],
) -> list[str]:
    """bubblewrap's arguments: every namespace new (the network's too unless the policy opens it),
    the system read-only, a minimal /etc, fresh /proc, /dev and /tmp, the workspace read-write (from
    an open descriptor, whose path bwrap still resolves: owner.unreachable_folder), and the root left
    read-only. The command's shell is the sandbox's pid 1 (limits_prefix). ``cwd`` is relative to the
    workspace, already checked."""
    argv = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--as-pid-1",
        "--cap-drop",
        "ALL",
        "--hostname",
        HOSTNAME,
    ]
    if policy.network:
        argv.append("--share-net")
    argv += ["--ro-bind", "/usr", "/usr"]
    for path, target in layout.system:
        argv += ["--symlink", target, path] if target is not None else ["--ro-bind", path, path]
    for path, fd in etc_fds.items():
        argv += ["--perms", "0644", "--file", str(fd), path]
    for path in layout.etc_shared + (layout.etc_network if policy.network else ()):
        argv += ["--ro-bind-try", path, path]
    argv += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--bind-fd",
        str(workspace_fd),
        WORKSPACE,
        "--remount-ro",
        "/",
        "--chdir",
        str(Path(WORKSPACE, cwd)) if cwd else WORKSPACE,
        "--clearenv",
    ]
    for name, value in ENVIRONMENT.items():
        argv += ["--setenv", name, value]
    argv += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--json-status-fd", str(status_fd), "--"]
    return argv + shell_argv(command, policy, layout)

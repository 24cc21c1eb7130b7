"""Wiring of the SessionStore: database, file storage, servicer and the background file sweep."""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress

from palimpsest.v1 import session_store_pb2, session_store_pb2_grpc
from services.shared.server import RunningServer, start_server
from services.shared.settings import Settings
from services.session_store import db
from services.session_store.files import FileStore
from services.session_store.repository import HotWindow, SessionRepository
from services.session_store.servicer import SessionStoreServicer

log = logging.getLogger("palimpsest.store")

SERVICE_NAME = session_store_pb2.DESCRIPTOR.services_by_name["SessionStore"].full_name


def database_url(settings: Settings) -> str:
    """DATABASE_URL when given, else the embedded PostgreSQL (started on first use)."""
    if settings.database_url:
        return settings.database_url
    from services.shared.embedded_pg import EmbeddedPostgres

    return EmbeddedPostgres(settings.data_dir).start()


async def sweep_files_forever(files: FileStore, repo: SessionRepository, interval: float) -> None:
    """Remove folders of sessions that no longer exist; a failure is logged, never fatal."""
    while True:
        await asyncio.sleep(interval)
        try:
            ids = await asyncio.to_thread(files.session_folders)
            existing = await repo.existing_ids(ids) if ids else set()
            removed = await asyncio.to_thread(files.sweep, existing)
            if removed:
                log.info("file sweep removed %d orphaned session folders", len(removed))
        except Exception:  # noqa: BLE001 — the sweep is housekeeping
            log.exception("file sweep failed")


async def start_store(settings: Settings, *, port: int, host: str = "127.0.0.1", dsn: str | None = None) -> RunningServer:
    url = dsn or await asyncio.to_thread(database_url, settings)
    pool = await db.create_pool(url)
    await db.migrate(pool)
    repo = SessionRepository(pool, hot_window=HotWindow(settings.hot_window_messages, settings.hot_window_bytes))
    files = FileStore(settings.files_root, max_bytes=settings.files_max_bytes)
    servicer = SessionStoreServicer(repo, files, settings)
    sweeper = asyncio.create_task(sweep_files_forever(files, repo, settings.file_sweep_interval_s))

    async def on_stop() -> None:
        sweeper.cancel()
        with suppress(asyncio.CancelledError):
            await sweeper
        await pool.close()

    return await start_server(
        lambda server: session_store_pb2_grpc.add_SessionStoreServicer_to_server(servicer, server),
        [SERVICE_NAME],
        settings=settings,
        port=port,
        host=host,
        on_stop=on_stop,
        deep_nul_check=True,  # every string of a request may end up in PostgreSQL
    )

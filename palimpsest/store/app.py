"""Wiring of the SessionStore: database, file storage, servicer and the background file sweep."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from palimpsest.shared.embedded_pg import EmbeddedPostgres

import asyncio
import logging
from contextlib import suppress

import asyncpg

from palimpsest.shared import metrics, tracing
from palimpsest.shared.ollama import OllamaClient
from palimpsest.shared.server import RunningServer, method_paths, start_server
from palimpsest.shared.settings import Settings
from palimpsest.store import db, share_links
from palimpsest.store.files import FileStore
from palimpsest.store.repository import HotWindow, MemoryCaps, Quotas, SessionRepository
from palimpsest.store.repository.vectors import MemoryVectors
from palimpsest.store.semantic import Embedder, MemoryIndex
from palimpsest.store.servicer import SessionStoreServicer
from palimpsest.store.session_bus import SessionBus
from palimpsest.v1 import session_store_pb2, session_store_pb2_grpc

log = logging.getLogger("palimpsest.store")

SERVICE_NAME = session_store_pb2.DESCRIPTOR.services_by_name["SessionStore"].full_name
# The share token is the credential.
OPEN_METHODS = method_paths(SERVICE_NAME, "GetShared")
# Requests that carry a conversation's content (messages, raw history, files, a batch of events);
# every other request takes PALIMPSEST_MAX_SMALL_REQUEST_BYTES.
LARGE_REQUESTS = method_paths(
    SERVICE_NAME,
    "AppendMessages",
    "AppendStream",
    "CommitCompression",
    "IndexChunks",
    "PutFile",
    "PublishSessionMessages",
)


def database(settings: Settings) -> tuple[str, EmbeddedPostgres | None]:
    """(url, the embedded server or None): DATABASE_URL when given, else the embedded PostgreSQL
    (started on first use; the store stops it on exit only if it started it)."""
    if settings.database_url:
        return settings.database_url, None
    from palimpsest.shared.embedded_pg import EmbeddedPostgres

    embedded = EmbeddedPostgres(settings.data_dir)
    return embedded.start(), embedded


async def sweep_files_forever(files: FileStore, repo: SessionRepository, interval: float) -> None:
    """Remove folders of sessions that no longer exist; a failure is logged, never fatal."""
    while True:
        await asyncio.sleep(interval)
        try:
            ids = await asyncio.to_thread(files.session_folders)
            existing = await repo.sessions.existing_ids(ids) if ids else set()
            removed = await asyncio.to_thread(files.sweep, existing)
            if removed:
                log.info("file sweep removed %d orphaned session folders", len(removed))
        except Exception:  # noqa: BLE001 — the sweep is housekeeping
            log.exception("file sweep failed")


async def start_store(
    settings: Settings, *, port: int, host: str = "127.0.0.1", dsn: str | None = None
) -> RunningServer:
    if settings.embed_retry_s <= 0 or settings.embed_timeout_s <= 0:
        raise SystemExit("PALIMPSEST_EMBED_RETRY_SECONDS and PALIMPSEST_EMBED_TIMEOUT_SECONDS must be positive")
    if not 0 <= settings.embed_min_similarity < 1:
        raise SystemExit(f"PALIMPSEST_EMBED_MIN_SIMILARITY must be in [0, 1), got {settings.embed_min_similarity}")
    if settings.message_max_bytes > settings.read_budget_bytes:
        raise SystemExit(
            f"PALIMPSEST_MESSAGE_MAX_MB ({settings.message_max_bytes // 2**20}) must not pass half of "
            f"PALIMPSEST_MAX_MESSAGE_BYTES ({settings.read_budget_bytes:,} bytes): every read must hold "
            "at least one whole message"
        )
    url, embedded = (dsn, None) if dsn else await asyncio.to_thread(database, settings)
    try:
        pool = await db.create_pool(url, command_timeout=settings.db_command_timeout_s)
    except Exception as exc:
        known = db.unusable_database(url, exc) if settings.database_url and not dsn else None
        if known is None:
            raise
        raise known from exc
    await db.migrate(pool)
    metrics.watch_pool(pool)
    share_key = await asyncio.to_thread(share_links.load_key, settings.share_key, settings.data_dir)
    repo = SessionRepository(
        pool,
        hot_window=HotWindow(settings.hot_window_messages, settings.hot_window_bytes),
        share_key=share_key,
        quotas=Quotas(settings.owner_max_sessions, settings.owner_max_bytes),
        memory_caps=MemoryCaps(settings.memory_max_entries, settings.memory_max_chars, settings.memory_max_pending),
    )
    files = FileStore(settings.files_root, max_bytes=settings.files_max_bytes)
    ollama = OllamaClient(settings.ollama_host)
    memory_index = MemoryIndex(
        MemoryVectors(pool),
        Embedder(ollama, retry_s=settings.embed_retry_s),
        model=settings.embed_model,
        query_timeout_s=settings.embed_timeout_s,
        min_similarity=settings.embed_min_similarity,
        where=f"PostgreSQL at {db.where(url)}",
        messages_quiet_s=settings.embed_messages_quiet_s,
    )
    await memory_index.start()
    bus = SessionBus(url, pool)
    bus.start()
    servicer = SessionStoreServicer(repo, files, settings, memory_index, bus)
    sweeper = asyncio.create_task(sweep_files_forever(files, repo, settings.file_sweep_interval_s))

    background = [sweeper]

    async def on_stop() -> None:
        await bus.stop()
        await memory_index.stop()
        await ollama.aclose()
        for task in background:
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task
        await pool.close()
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)

    running = await start_server(
        lambda server: session_store_pb2_grpc.add_SessionStoreServicer_to_server(servicer, server),
        [SERVICE_NAME],
        settings=settings,
        port=port,
        host=host,
        on_stop=on_stop,
        deep_nul_check=True,  # every string of a request may end up in PostgreSQL
        open_methods=OPEN_METHODS,
        large_requests=LARGE_REQUESTS,
        translate=db.database_down(url),
    )
    background.append(asyncio.create_task(watch_database(pool, running, db.where(url))))

    async def end_streams(_grace: float) -> None:
        servicer.stopping.set()  # append streams between two appends end: their writers append elsewhere
        await bus.stop()  # the Agents' listen streams never end by themselves: they listen elsewhere now

    running.on_drain = end_streams
    running.servicer = servicer  # tests reach the bus through it
    return running


# How often health asks PostgreSQL whether it is there, and how long it waits for the answer.
DATABASE_CHECK_INTERVAL_S = 2.0


async def watch_database(pool: asyncpg.Pool, running: RunningServer, address: str) -> None:
    """Health follows the database: NOT_SERVING while PostgreSQL does not answer (balancers and
    `pal health` then see why every call fails), SERVING again when it does."""
    serving = True
    while True:
        await asyncio.sleep(DATABASE_CHECK_INTERVAL_S)
        with tracing.untraced():
            up = await db.reachable(pool, timeout=DATABASE_CHECK_INTERVAL_S)
        if up != serving:
            serving = up
            await running.set_serving(up)
            if up:
                log.info("PostgreSQL at %s answers again: SERVING", address)
            else:
                log.warning("PostgreSQL at %s is not answering: NOT_SERVING", address)

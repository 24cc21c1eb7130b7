"""The connection pool and versioned migrations, applied on start."""

from __future__ import annotations

import json
import logging
from importlib import resources

from urllib.parse import urlsplit

import asyncpg

from services.shared.errors import Unavailable

log = logging.getLogger("palimpsest.store.db")

# Serializes migrations when several store replicas (or test workers) start at once.
_MIGRATION_LOCK = 0x7061_6C69  # "pali"

_TRGM_INDEXES = {
    "session_messages_content_trgm": "session_messages USING gin (content gin_trgm_ops)",
    "session_messages_archive_content_trgm": "session_messages_archive USING gin (content gin_trgm_ops)",
    "sessions_name_trgm": "sessions USING gin (name gin_trgm_ops)",
}


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def create_pool(dsn: str, *, min_size: int = 1, max_size: int = 10,
                      command_timeout: float | None = None) -> asyncpg.Pool:
    """``command_timeout``: no statement may hold a request (and its pooled connection) longer."""
    return await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size, init=_init_connection,
                                     command_timeout=command_timeout)


# What a database that is down or unreachable raises, as opposed to a query that is wrong.
_DATABASE_DOWN = (
    OSError,  # refused, reset, unreachable
    TimeoutError,  # no answer within the command timeout
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.TooManyConnectionsError,
)


def where(dsn: str) -> str:
    """host:port of a DSN, for messages (never its password)."""
    parsed = urlsplit(dsn)
    return f"{parsed.hostname or 'localhost'}:{parsed.port or 5432}"


def database_down(dsn: str):
    """The store's error translation: a dead database is UNAVAILABLE naming it, not INTERNAL."""
    address = where(dsn)

    def translate(exc: BaseException) -> Unavailable | None:
        if isinstance(exc, _DATABASE_DOWN):
            return Unavailable(f"PostgreSQL at {address} is not answering ({type(exc).__name__}): try again shortly")
        return None

    return translate


async def reachable(pool: asyncpg.Pool, timeout: float) -> bool:
    try:
        await pool.fetchval("SELECT 1", timeout=timeout)
        return True
    except (*_DATABASE_DOWN, asyncpg.InterfaceError):
        return False


def _migrations() -> list[tuple[int, str, str]]:
    folder = resources.files("services.session_store") / "migrations"
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            version = int(entry.name.split("_", 1)[0])
            found.append((version, entry.name, entry.read_text()))
    return sorted(found)


async def migrate(pool: asyncpg.Pool, *, through: int | None = None) -> bool:
    """Apply pending migrations (up to version `through`: an older schema, for upgrade tests);
    returns whether trigram indexes are available."""
    async with pool.acquire() as conn:
        await conn.execute("SELECT pg_advisory_lock($1)", _MIGRATION_LOCK)
        try:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            applied = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
            for version, name, sql in _migrations():
                if version in applied or (through is not None and version > through):
                    continue
                async with conn.transaction():
                    await conn.execute(sql)
                    await conn.execute("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", version, name)
                log.info("applied migration %s", name)
            return await _ensure_trigram(conn)
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", _MIGRATION_LOCK)


async def _ensure_trigram(conn: asyncpg.Connection) -> bool:
    """Trigram GIN indexes make substring search use an index; without pg_trgm we fall back to scans."""
    have = await conn.fetchval("SELECT count(*) FROM pg_extension WHERE extname = 'pg_trgm'")
    if not have:
        try:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        except asyncpg.PostgresError as exc:
            log.warning("pg_trgm is not available (%s): search works without trigram indexes, slower", exc)
            return False
    for name, target in _TRGM_INDEXES.items():
        await conn.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {target}")
    return True

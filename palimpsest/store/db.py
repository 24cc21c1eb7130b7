"""The connection pool and versioned migrations, applied on start."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Callable
from importlib import resources
from typing import Any, TypeAlias
from urllib.parse import urlsplit

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from palimpsest.shared.errors import Unavailable

log = logging.getLogger("palimpsest.store.db")

# What the repository's helpers are handed: a connection, or the pool's proxy for one (`pool.acquire()`).
Connection: TypeAlias = asyncpg.Connection | PoolConnectionProxy


async def fetch_one(conn: Connection, query: str, *args: Any) -> asyncpg.Record:
    """``fetchrow`` for a statement that always returns a row: an INSERT … RETURNING, or a read or
    UPDATE … RETURNING of a session the transaction has locked (``lock_session``)."""
    row = await conn.fetchrow(query, *args)
    if row is None:
        raise AssertionError(f"no row from a statement that always returns one: {query.strip()[:80]}")
    return row


async def commit_one(pool: asyncpg.Pool, query: str, *args: Any) -> asyncpg.Record:
    """One statement that always returns a row, in autocommit: its answer as soon as it has one.
    The connection goes back to the pool after that, in the background (the pool's reset, and
    whatever waits on a connection, are not the caller's to wait for). When the server is going
    down that can fail after the statement committed (asyncpg: "cannot switch to state …"); the
    pool then closes the connection, and the committed write's answer stands."""
    conn = await pool.acquire()
    try:
        row = await fetch_one(conn, query, *args)
    except BaseException:
        await pool.release(conn)
        raise
    task = asyncio.get_running_loop().create_task(_release_quietly(pool, conn))
    _releasing.add(task)  # held until done: the loop keeps only a weak reference to a task
    task.add_done_callback(_releasing.discard)
    return row


_releasing: set[asyncio.Task] = set()


async def _release_quietly(pool: asyncpg.Pool, conn: PoolConnectionProxy) -> None:
    try:
        await pool.release(conn)
    except Exception as exc:  # the pool has closed the connection
        log.info("a connection could not be reset after its statement committed (%s); closed", exc)


# Serializes migrations when several store replicas (or test workers) start at once.
_MIGRATION_LOCK = 0x7061_6C69  # "pali"


async def _init_connection(conn: Connection) -> None:
    # Binary, so jsonb can travel inside a composite too (the append function takes its rows as
    # session_messages[]; asyncpg encodes composites in binary only): a version byte, then the text.
    await conn.set_type_codec("jsonb", encoder=_jsonb_bytes, decoder=_jsonb_value, schema="pg_catalog", format="binary")


def _jsonb_bytes(value: Any) -> bytes:
    return b"\x01" + json.dumps(value).encode()


def _jsonb_value(data: bytes) -> Any:
    return json.loads(data[1:])


async def create_pool(
    dsn: str, *, min_size: int = 1, max_size: int = 10, command_timeout: float | None = None
) -> asyncpg.Pool:
    """``command_timeout``: no statement may hold a request (and its pooled connection) longer."""
    return await asyncpg.create_pool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        init=_init_connection,
        command_timeout=command_timeout,
        reset=_end_transaction,
    )


async def _end_transaction(conn: Connection) -> None:
    """What a connection handed back to the pool needs: no transaction left open. asyncpg's default
    also unlocks advisory locks, closes cursors, unlistens and resets settings, one more round trip
    on every release; nothing here leaves any of those on a pooled connection (the migrations unlock
    theirs, the owner lock is the transaction's, the session bus listens on a connection of its own,
    nothing SETs or opens a cursor). That round trip ran beside each answer on its way back (last
    token → stream_end 0.3–0.6 ms lower without it, 3 of 3 alternating runs)."""
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


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


def database_down(dsn: str) -> Callable[[BaseException], Unavailable | None]:
    """The store's error translation: a dead database is UNAVAILABLE naming it, not INTERNAL."""
    address = where(dsn)

    def translate(exc: BaseException) -> Unavailable | None:
        if isinstance(exc, _DATABASE_DOWN):
            return Unavailable(f"PostgreSQL at {address} is not answering ({type(exc).__name__}): try again shortly")
        return None

    return translate


def unusable_database(dsn: str, exc: BaseException) -> SystemExit | None:
    """Why the store cannot start on the database DATABASE_URL names, as one line with the fix;
    None for a failure that is not about reaching or entering that database."""
    fix = "fix DATABASE_URL, or unset it to use the embedded PostgreSQL"
    try:
        address = where(dsn)
    except ValueError:
        address = "?"
    if isinstance(exc, (asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError)):
        return SystemExit(f"DATABASE_URL: PostgreSQL at {address} refused the user or password ({exc}); {fix}")
    if isinstance(exc, asyncpg.InvalidCatalogNameError):
        return SystemExit(f"DATABASE_URL: {exc} at {address}; create it (createdb) or {fix}")
    if isinstance(exc, (asyncpg.ClientConfigurationError, ValueError)) and not isinstance(exc, UnicodeError):
        return SystemExit(
            f"DATABASE_URL is not a usable PostgreSQL URL ({exc}); "
            "write it as postgresql://USER:PASSWORD@HOST:PORT/DATABASE, or unset it to use the "
            "embedded PostgreSQL"
        )
    if isinstance(exc, _DATABASE_DOWN):
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        return SystemExit(f"DATABASE_URL: cannot reach PostgreSQL at {address} ({reason}); start it there, or {fix}")
    return None


async def reachable(pool: asyncpg.Pool, timeout: float) -> bool:
    try:
        await pool.fetchval("SELECT 1", timeout=timeout)
        return True
    except (*_DATABASE_DOWN, asyncpg.InterfaceError):
        return False


def _migrations() -> list[tuple[int, str, str]]:
    """The versioned migrations (NNNN_name.sql), applied once each, in order."""
    return sorted((int(name.split("_", 1)[0]), name, sql) for name, sql in _scripts() if name[0].isdigit())


def _every_start() -> list[tuple[str, str]]:
    """Scripts run on every start after the migrations (every_start_*.sql): idempotent repairs of
    what a migration could not do when it ran (an optional extension installed later)."""
    return sorted((name, sql) for name, sql in _scripts() if name.startswith("every_start_"))


def _scripts() -> list[tuple[str, str]]:
    folder = resources.files("palimpsest.store") / "migrations"
    return [(entry.name, entry.read_text()) for entry in folder.iterdir() if entry.name.endswith(".sql")]


def _functions() -> str:
    """functions.sql: the current text of the store's SQL functions, applied after the migrations."""
    return (resources.files("palimpsest.store") / "functions.sql").read_text()


async def _apply_functions(conn: Connection, applied: set[int]) -> None:
    """The functions file, when its text is not the one last applied (its digest in
    schema_functions). Not by a store older than the database's migrations: a replica of the
    release before, restarted during a rolling update, would put its older text back."""
    newest = max(version for version, _, _ in _migrations())
    if applied and max(applied) > newest:
        log.info("the database has migrations past %04d (a newer store's): its functions are left as they are", newest)
        return
    text = _functions()
    digest = hashlib.sha256(text.encode()).hexdigest()
    if await conn.fetchval("SELECT digest FROM schema_functions") == digest:
        return
    async with conn.transaction():
        await conn.execute(text)
        await conn.execute(
            "INSERT INTO schema_functions (digest) VALUES ($1)"
            " ON CONFLICT (one) DO UPDATE SET digest = excluded.digest, applied_at = now()",
            digest,
        )
    log.info("applied functions.sql (%s)", digest[:12])


async def migrate(pool: asyncpg.Pool, *, through: int | None = None) -> None:
    """Apply pending migrations (up to version `through`: an older schema, for upgrade tests), then
    the functions file (functions.sql) and the every-start scripts, all under one advisory lock, so
    replicas starting at once take turns. Tables and indexes live in migrations/ alone: nothing else
    creates or drops one."""
    async with pool.acquire() as conn:
        # A migration's RAISE WARNING (an optional extension missing) reaches the store's log.
        conn.add_log_listener(_log_notice)
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
                applied.add(version)
                log.info("applied migration %s", name)
            if through is None:
                await _apply_functions(conn, applied)
                for name, sql in _every_start():
                    await conn.execute(sql)
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", _MIGRATION_LOCK)
            conn.remove_log_listener(_log_notice)


def _log_notice(conn: Connection, message: asyncpg.PostgresLogMessage) -> None:
    # Only warnings: IF NOT EXISTS answers every start with NOTICEs of what already exists.
    if message.severity_en == "WARNING":
        log.warning("migration: %s", message.message)

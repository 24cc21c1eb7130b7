"""The schema lives in the migrations (and the functions in functions.sql) alone: a database
migrated from empty and one at the previous release's schema (migrations through 0008, plus the
trigram indexes that release's start-up code made outside them) end with the same tables, columns,
indexes, constraints and functions."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from palimpsest.store import db
from tests.conftest import _start_store
from tests.helpers.databases import empty_database

# What the release before 0009 ran on every start, outside the migrations (db._ensure_trigram).
PREVIOUS_RELEASE_STARTUP_DDL = (
    "CREATE EXTENSION IF NOT EXISTS pg_trgm",
    "CREATE INDEX IF NOT EXISTS session_messages_content_trgm ON session_messages USING gin (content gin_trgm_ops)",
    "CREATE INDEX IF NOT EXISTS session_messages_archive_content_trgm"
    " ON session_messages_archive USING gin (content gin_trgm_ops)",
    "CREATE INDEX IF NOT EXISTS sessions_name_trgm ON sessions USING gin (name gin_trgm_ops)",
)
PREVIOUS_RELEASE = 8
TABLES = {
    "schema_migrations",
    "schema_functions",
    "sessions",
    "session_messages",
    "session_messages_archive",
    "memory_chunks",
    "session_shares",
    "calibration_observations",
    "session_baselines",
    "applied_appends",
    "tool_runs",
    "owner_memory",
    "owner_memory_entries",
    "owner_memory_pending",
}
# Made only where pgvector is available (0011); without it memory search is lexical.
VECTOR_TABLES = {"memory_vectors", "memory_vector_spaces", "summary_vectors", "message_vectors", "message_vector_marks"}
TRIGRAM_INDEXES = {
    "session_messages_content_trgm",
    "session_messages_archive_content_trgm",
    "sessions_name_trgm",
    "memory_chunks_content_trgm",
}


async def schema(pool: asyncpg.Pool) -> dict[str, list[tuple]]:
    """The schema as pg_catalog describes it, in a stable order (names of the database left out)."""
    queries = {
        "columns": """
            SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                   pg_get_expr(d.adbin, d.adrelid), a.attgenerated
              FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
              LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
             WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r'
               AND a.attnum > 0 AND NOT a.attisdropped
             ORDER BY 1, 3""",
        "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema()"
        " ORDER BY 1, 2",
        "constraints": "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE connamespace = current_schema()::regnamespace ORDER BY 1, 2",
        "extensions": "SELECT extname FROM pg_extension ORDER BY 1",
        "migrations": "SELECT version, name FROM schema_migrations ORDER BY 1",
        # The store's own functions (an extension's are the extension's), as the server prints them.
        "functions": """
            SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid)
              FROM pg_proc p
             WHERE p.pronamespace = current_schema()::regnamespace
               AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = p.oid AND d.deptype = 'e')
             ORDER BY 1, 2""",
    }
    found = {}
    for part, sql in queries.items():
        found[part] = [tuple(r) for r in await pool.fetch(sql)]
    # attnum differs where a column was dropped and re-added; the order of names is what matters.
    found["columns"] = [(table, *rest) for table, _, *rest in found["columns"]]
    return found


async def vector_available(pool: asyncpg.Pool) -> bool:
    return bool(await pool.fetchval("SELECT count(*) FROM pg_available_extensions WHERE name = 'vector'"))


async def trigram_available(pool: asyncpg.Pool) -> bool:
    return bool(await pool.fetchval("SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_trgm'"))


async def test_migrating_from_empty_gives_the_whole_schema(database_url):
    async with empty_database(database_url) as pool:
        await db.migrate(pool)
        migrated = await schema(pool)
        tables = {table for table, *_ in migrated["columns"]}
        assert tables == TABLES | (VECTOR_TABLES if await vector_available(pool) else set())
        assert [version for version, _ in migrated["migrations"]] == [v for v, _, _ in db._migrations()]
        assert {name for name, *_ in migrated["functions"]} == {"append_messages"}
        indexes = {name for _, name, _ in migrated["indexes"]}
        assert {
            "memory_chunks_tsv",
            "memory_chunks_breadcrumbs",
            "sessions_owner_last_active",
            "calibration_observations_exact",
        } <= indexes
        if await trigram_available(pool):
            assert TRIGRAM_INDEXES <= indexes
            assert "pg_trgm" in {name for (name,) in migrated["extensions"]}
        await db.migrate(pool)  # a second start changes nothing
        assert await schema(pool) == migrated


async def test_a_database_at_the_previous_release_ends_identical(database_url):
    async with empty_database(database_url) as fresh, empty_database(database_url) as upgraded:
        await db.migrate(upgraded, through=PREVIOUS_RELEASE)
        if await trigram_available(upgraded):
            for statement in PREVIOUS_RELEASE_STARTUP_DDL:
                await upgraded.execute(statement)
        await upgraded.execute(
            "INSERT INTO sessions (id, owner, profile_id, name) VALUES ($1, 'o', 'p', 'old')", uuid.uuid4()
        )
        await db.migrate(upgraded)
        await db.migrate(fresh)
        before, after = await schema(fresh), await schema(upgraded)
        assert after == before
        assert await upgraded.fetchval("SELECT name FROM sessions") == "old"


async def test_trigram_indexes_come_back_once_pg_trgm_is_installed(database_url, base_settings, caplog):
    """A store whose role may not create pg_trgm starts without the trigram indexes; an operator
    installs the extension as a superuser; the next start of the store builds them."""
    admin = await asyncpg.connect(database_url)
    if not await admin.fetchval("SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_trgm'"):
        await admin.close()
        pytest.skip("this PostgreSQL has no pg_trgm to install")
    suffix = uuid.uuid4().hex[:10]
    role, name = f"pal_store_{suffix}", f"pal_trgm_{suffix}"
    server = database_url.rsplit("/", 1)[0]
    try:
        # Not a superuser and no CREATE on the database: pg_trgm (a trusted extension) is out of reach.
        await admin.execute(f"CREATE ROLE {role} LOGIN")
        await admin.execute(f"CREATE DATABASE {name}")
        superuser = await asyncpg.connect(f"{server}/{name}")
        try:
            await superuser.execute(f"GRANT CREATE, USAGE ON SCHEMA public TO {role}")
            store_dsn = server.replace("://postgres@", f"://{role}@", 1) + f"/{name}"
            running = await _start_store(base_settings, store_dsn)
            await running.stop(0)
            assert not TRIGRAM_INDEXES & await _indexes(superuser)
            assert "CREATE EXTENSION pg_trgm" in caplog.text  # the log tells the operator what to do

            await superuser.execute("CREATE EXTENSION pg_trgm")
            running = await _start_store(base_settings, store_dsn)
            await running.stop(0)
            assert TRIGRAM_INDEXES <= await _indexes(superuser)
        finally:
            await superuser.close()
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.execute(f"DROP ROLE IF EXISTS {role}")
        await admin.close()


async def _indexes(conn: asyncpg.Connection) -> set[str]:
    return {r["indexname"] for r in await conn.fetch("SELECT indexname FROM pg_indexes WHERE schemaname = 'public'")}

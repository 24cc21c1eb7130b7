"""The store's SQL functions have one text, functions.sql, which the migration runner applies after
the numbered migrations: a database migrated from empty and one migrated by the older chain end with
it, an edit reaches the database on the next start, an unchanged file is not applied again, a store
older than the database's migrations leaves a newer text alone, and replicas starting at once take
turns."""

from __future__ import annotations

import asyncio
import re

import asyncpg

from palimpsest.store import db
from tests.helpers.databases import empty_database

# The last migration of the release before functions.sql: its functions as 0013 to 0017 made them.
BEFORE_THE_FILE = 20
# CREATE OR REPLACE FUNCTION name(arguments) … AS $$body$$;
FUNCTION = re.compile(r"CREATE OR REPLACE FUNCTION (\w+)\((.*?)\)\s+RETURNS.*?AS \$\$(.*?)\$\$;", re.DOTALL)


def functions_in(text: str) -> dict[tuple[str, int], str]:
    """(name, number of arguments) → body, for each function the file defines."""
    found = {(name, len(args.split(","))): body for name, args, body in FUNCTION.findall(text)}
    assert found, "functions.sql defines no function this test can read"
    return found


async def bodies(pool: asyncpg.Pool, wanted: dict[tuple[str, int], str]) -> dict[tuple[str, int], str]:
    rows = await pool.fetch(
        "SELECT proname, pronargs, prosrc FROM pg_proc WHERE pronamespace = current_schema()::regnamespace"
    )
    return {(r["proname"], r["pronargs"]): r["prosrc"] for r in rows if (r["proname"], r["pronargs"]) in wanted}


def edited(text: str) -> str:
    """functions.sql with every body changed the way an edit would (a comment added to each)."""
    return FUNCTION.sub(lambda m: m.group(0).replace("BEGIN\n", "BEGIN\n    -- edited\n", 1), text)


async def test_a_fresh_database_and_one_migrated_by_the_old_chain_end_with_the_files_text(database_url):
    wanted = functions_in(db._functions())
    async with empty_database(database_url) as fresh, empty_database(database_url) as old:
        await db.migrate(fresh)
        await db.migrate(old, through=BEFORE_THE_FILE)
        await db.migrate(old)
        assert await bodies(fresh, wanted) == wanted
        assert await bodies(old, wanted) == wanted


async def test_an_edit_reaches_the_database_on_the_next_start_and_only_then(database_url, monkeypatch):
    original = db._functions()
    changed = edited(original)
    assert changed != original
    async with empty_database(database_url) as pool:
        await db.migrate(pool)
        stamped = await pool.fetchrow("SELECT digest, applied_at FROM schema_functions")
        await db.migrate(pool)  # nothing changed: not applied again
        assert await pool.fetchrow("SELECT digest, applied_at FROM schema_functions") == stamped

        monkeypatch.setattr(db, "_functions", lambda: changed)
        await db.migrate(pool)
        assert await bodies(pool, functions_in(changed)) == functions_in(changed)
        assert await pool.fetchval("SELECT count(*) FROM schema_functions") == 1

        monkeypatch.setattr(db, "_functions", lambda: original)
        await db.migrate(pool)
        assert await bodies(pool, functions_in(original)) == functions_in(original)


async def test_a_store_older_than_the_databases_migrations_leaves_the_functions_alone(database_url, monkeypatch):
    async with empty_database(database_url) as pool:
        await db.migrate(pool)
        # A newer release migrated this database past what this store knows.
        await pool.execute("INSERT INTO schema_migrations (version, name) VALUES (9999, '9999_newer.sql')")
        text = db._functions()
        original = functions_in(text)
        monkeypatch.setattr(db, "_functions", lambda: edited(text))
        await db.migrate(pool)
        assert await bodies(pool, original) == original


async def test_replicas_starting_at_once_on_an_empty_database_take_turns(database_url):
    async with empty_database(database_url) as pool:
        dsn = f"{database_url.rsplit('/', 1)[0]}/{await pool.fetchval('SELECT current_database()')}"
        pools = [await db.create_pool(dsn, max_size=1) for _ in range(4)]
        try:
            await asyncio.gather(*(db.migrate(p) for p in pools))
        finally:
            for p in pools:
                await p.close()
        wanted = functions_in(db._functions())
        assert await bodies(pool, wanted) == wanted
        assert await pool.fetchval("SELECT count(*) FROM schema_functions") == 1
        assert [v for (v,) in await pool.fetch("SELECT version FROM schema_migrations ORDER BY 1")] == [
            v for v, _, _ in db._migrations()
        ]

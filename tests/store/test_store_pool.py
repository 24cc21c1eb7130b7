"""The store's connection pool on a real PostgreSQL: what a connection carries back to it."""

from __future__ import annotations

import uuid

from palimpsest.store import db


async def test_a_connection_handed_back_inside_a_transaction_is_rolled_back_before_its_next_use(database_url):
    """The pool's reset is only the end of an open transaction (db._end_transaction): a request
    cancelled mid-transaction must not leave its writes, or its locks, to the connection's next user."""
    table = f"left_open_{uuid.uuid4().hex[:10]}"
    pool = await db.create_pool(database_url, min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn:
            await conn.execute(f"CREATE TABLE {table} (n integer)")
        async with pool.acquire() as conn:
            await conn.execute("BEGIN")
            await conn.execute(f"INSERT INTO {table} VALUES (1)")
        async with pool.acquire() as conn:  # (the same connection: the pool holds one)
            assert not conn.is_in_transaction()
            assert await conn.fetchval(f"SELECT count(*) FROM {table}") == 0
    finally:
        async with pool.acquire() as conn:
            await conn.execute(f"DROP TABLE IF EXISTS {table}")
        await pool.close()

"""Faults of the session bus a test can cause: a store's LISTEN connection dropped."""

from __future__ import annotations


async def drop_listen_connection(bus, database_url: str) -> int:
    """PostgreSQL ends the store's listen connection (as a restart or an admin would): its pid."""
    import asyncpg

    dropped = bus.connection_pid
    conn = await asyncpg.connect(database_url)
    try:
        assert await conn.fetchval("SELECT pg_terminate_backend($1)", dropped)
    finally:
        await conn.close()
    return dropped

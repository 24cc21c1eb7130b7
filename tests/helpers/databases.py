"""Databases of their own for tests that migrate or break one."""

from __future__ import annotations

import uuid
from contextlib import asynccontextmanager

import asyncpg

from palimpsest.store import db


@asynccontextmanager
async def empty_database(database_url: str):
    """A database of its own, dropped afterwards: migrations run on it from nothing."""
    name = f"pal_schema_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(database_url)
    await admin.execute(f"CREATE DATABASE {name}")
    pool = await db.create_pool(database_url.rsplit("/", 1)[0] + f"/{name}")
    try:
        yield pool
    finally:
        await pool.close()
        await admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
        await admin.close()

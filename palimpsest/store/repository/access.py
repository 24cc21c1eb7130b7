"""Who may read or write a session, and the checks every part of the repository shares.

Every write to a session locks its row, checks ownership and `expected_revision`, and bumps the
revision in the same transaction, so two writers can never interleave unnoticed.
"""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg

from palimpsest.shared.auth import Identity
from palimpsest.shared.errors import Aborted, InvalidArgument, NotFound
from palimpsest.store.db import Connection


def check_revision(session_id: uuid.UUID, revision: int, expected_revision: int | None) -> None:
    if expected_revision is not None and revision != expected_revision:
        raise Aborted(
            f"session {session_id} is at revision {revision}, not the expected {expected_revision}: "
            "another writer changed it; reload and retry"
        )


async def lock_session(
    conn: Connection, session_id: uuid.UUID, identity: Identity, expected_revision: int | None
) -> asyncpg.Record:
    """The session's row, locked for this transaction, after the access and revision checks."""
    row = await conn.fetchrow(
        "SELECT owner, revision, next_seq, hot_count, hot_bytes FROM sessions WHERE id = $1 FOR UPDATE",
        session_id,
    )
    if row is None:
        raise NotFound(f"session {session_id} not found")
    identity.require_access(row["owner"], str(session_id))
    check_revision(session_id, row["revision"], expected_revision)
    return row


async def readable(conn: Connection, session_id: uuid.UUID, identity: Identity) -> asyncpg.Record:
    """The session's row, when the caller may read it."""
    row = await conn.fetchrow("SELECT * FROM sessions WHERE id = $1", session_id)
    if row is None:
        raise NotFound(f"session {session_id} not found")
    identity.require_access(row["owner"], str(session_id))
    return row


def visible(identity: Identity, params: list[Any]) -> str:
    """A WHERE fragment limiting sessions to the caller's (admins and auth-off see all)."""
    if not identity.enforced or identity.is_admin:
        return "true"
    params.append(identity.sub)
    return f"s.owner = ${len(params)}"


def rows_affected(status: str) -> int:
    """The row count of a command status ("UPDATE 3", "INSERT 0 2")."""
    return int(status.split()[-1])


def like_pattern(text: str) -> str:
    """A substring ILIKE pattern matching `text` literally."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def parse_session_id(value: str, field: str = "session_id") -> uuid.UUID:
    if not value:
        raise InvalidArgument(field, "required")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidArgument(field, f"{value!r} is not a session id (a UUID)") from None

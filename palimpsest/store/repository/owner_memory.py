"""What the agent remembers about each owner: owner_memory (the owner's revision and id sequence),
owner_memory_entries, and owner_memory_pending (a tainted conversation's writes, held for the
owner's approval). Every change locks the owner's row, checks `expected_revision` and the caps, and
moves the revision in the same transaction; a held write moves nothing until it is approved.

Which entry an edit names and whether the result fits the caps are plain functions (``find_entry``,
``check_caps``), tested without a database.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from palimpsest.shared.errors import Aborted, FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from palimpsest.shared.owner_memory import snapshot
from palimpsest.shared.validation import capped
from palimpsest.store.db import Connection, fetch_one

ACTIONS = ("add", "replace", "remove")
# How much of an entry an error quotes.
QUOTED_CHARS = 80


@dataclass(frozen=True)
class MemoryCaps:
    """What one owner may keep: entries, their characters together, and held writes."""

    max_entries: int
    max_chars: int
    max_pending: int


@dataclass(frozen=True)
class Entry:
    id: int
    text: str


@dataclass(frozen=True)
class MemoryEdit:
    """One change as EditMemory (or an approved held write) asks it."""

    action: str  # one of ACTIONS
    text: str = ""
    entry_id: int = 0
    old_text: str = ""


# -- the rules -----------------------------------------------------------------------------------
def find_entry(entries: Sequence[Entry], entry_id: int, old_text: str) -> Entry:
    """The entry an edit names: by id, or else the one entry containing ``old_text`` (any case; one
    that is exactly it wins over entries that only contain it)."""
    if entry_id:
        for entry in entries:
            if entry.id == entry_id:
                return entry
        raise NotFound(f"memory entry {entry_id} not found (ids: {_ids(entries)})")
    needle = " ".join(old_text.split()).lower()
    if not needle:
        raise InvalidArgument("old_text", "name the entry: its entry_id, or old_text that exactly one entry contains")
    found = [e for e in entries if needle in " ".join(e.text.split()).lower()]
    exact = [e for e in found if " ".join(e.text.split()).lower() == needle]
    if len(exact) == 1 or len(found) == 1:
        return (exact or found)[0]
    if not found:
        raise NotFound(f"no memory entry contains {capped(old_text, QUOTED_CHARS)!r} (ids: {_ids(entries)})")
    raise InvalidArgument(
        "old_text",
        f"{len(found)} entries contain {capped(old_text, QUOTED_CHARS)!r} "
        f"(ids {', '.join(str(e.id) for e in found)}): give its entry_id, or more "
        "of its text",
    )


def _ids(entries: Sequence[Entry]) -> str:
    return ", ".join(str(e.id) for e in entries) or "none: the memory is empty"


def check_caps(texts: Sequence[str], caps: MemoryCaps) -> None:
    """Refuse a memory past the owner's caps, naming the setting."""
    if caps.max_entries and len(texts) > caps.max_entries:
        raise ResourceExhausted(
            f"memory holds at most {caps.max_entries} entries (PALIMPSEST_MEMORY_MAX_ENTRIES); remove or "
            "merge entries first"
        )
    chars = sum(len(t) for t in texts)
    if caps.max_chars and chars > caps.max_chars:
        raise ResourceExhausted(
            f"memory would hold {chars:,} characters, past the {caps.max_chars:,} it may hold "
            "(PALIMPSEST_MEMORY_MAX_CHARS); shorten or remove entries first"
        )


def checked_text(text: str) -> str:
    """An entry's text as stored: without surrounding whitespace, never empty."""
    stripped = text.strip()
    if not stripped:
        raise InvalidArgument("text", "required: the entry's text")
    return stripped


def texts_after(entries: Sequence[Entry], edit: MemoryEdit, target: Entry | None) -> list[str]:
    """The entries' texts once ``edit`` is applied (``target``: the entry it names)."""
    if edit.action == "add":
        return [e.text for e in entries] + [edit.text]
    assert target is not None
    if edit.action == "replace":
        return [edit.text if e.id == target.id else e.text for e in entries]
    return [e.text for e in entries if e.id != target.id]


# -- the tables ----------------------------------------------------------------------------------
@dataclass
class Memory:
    revision: int
    entries: list[asyncpg.Record]
    pending: list[asyncpg.Record]


@dataclass
class EditResult:
    revision: int
    entry: asyncpg.Record | None = None  # written (add, replace) or removed
    held: asyncpg.Record | None = None


_ENTRY_COLUMNS = "id, text, session_id, created_at, updated_at"
_PENDING_COLUMNS = "id, action, entry_id, old_text, text, session_id, created_at"


async def memory_snapshot(conn: Connection, owner: str | None) -> dict[str, Any]:
    """The owner's memory as a session holds it (see palimpsest.shared.owner_memory)."""
    row = await conn.fetchrow(
        "SELECT m.revision, array_remove(array_agg(e.text ORDER BY e.id), NULL) AS texts"
        "  FROM owner_memory m LEFT JOIN owner_memory_entries e ON e.owner = m.owner"
        " WHERE m.owner = $1 GROUP BY m.revision",
        owner,
    )
    return snapshot(row["revision"], row["texts"]) if row is not None else snapshot(0, [])


class OwnerMemory:
    def __init__(self, pool: asyncpg.Pool, caps: MemoryCaps) -> None:
        self.pool = pool
        self.caps = caps

    async def read(self, owner: str) -> Memory:
        async with self.pool.acquire() as conn:
            revision = await conn.fetchval("SELECT revision FROM owner_memory WHERE owner = $1", owner)
            entries = await conn.fetch(
                f"SELECT {_ENTRY_COLUMNS} FROM owner_memory_entries WHERE owner = $1 ORDER BY id", owner
            )
            pending = await conn.fetch(
                f"SELECT {_PENDING_COLUMNS} FROM owner_memory_pending WHERE owner = $1 ORDER BY id", owner
            )
        return Memory(revision or 0, list(entries), list(pending))

    async def edit(
        self, owner: str, edit: MemoryEdit, *, expected_revision: int | None, session_id: uuid.UUID | None, hold: bool
    ) -> EditResult:
        """Apply ``edit``, or (``hold``) keep it for the owner's approval: checked the same way
        first, so the model hears at once of an entry it misnamed or a memory that is full."""
        async with self.pool.acquire() as conn, conn.transaction():
            revision, next_id = await self._lock(conn, owner, expected_revision)
            entries = await self._entries(conn, owner)
            target = find_entry(entries, edit.entry_id, edit.old_text) if edit.action != "add" else None
            if edit.action != "remove":
                check_caps(texts_after(entries, edit, target), self.caps)
            if hold:
                held = await self._hold(conn, owner, next_id, edit, target, session_id)
                return EditResult(revision, held=held)
            entry = await self._apply(conn, owner, next_id, edit, target, session_id)
            return EditResult(await self._bump(conn, owner, next_id + (edit.action == "add")), entry=entry)

    async def approve(self, owner: str, pending_id: int, expected_revision: int | None) -> EditResult:
        """A held write, applied as if it were made now (the caps and its entry checked again)."""
        async with self.pool.acquire() as conn, conn.transaction():
            revision, next_id = await self._lock(conn, owner, expected_revision)
            held = await conn.fetchrow(
                f"SELECT {_PENDING_COLUMNS} FROM owner_memory_pending WHERE owner = $1 AND id = $2", owner, pending_id
            )
            if held is None:
                raise NotFound(f"held memory write {pending_id} not found (approved or rejected already?)")
            edit = MemoryEdit(held["action"], held["text"], held["entry_id"] or 0)
            entries = await self._entries(conn, owner)
            target = None
            if edit.action != "add":
                target = next((e for e in entries if e.id == edit.entry_id), None)
                if target is None:
                    raise FailedPrecondition(
                        f"memory entry {edit.entry_id}, which held write {pending_id} changes, "
                        "is gone: reject the write"
                    )
            if edit.action != "remove":
                check_caps(texts_after(entries, edit, target), self.caps)
            entry = await self._apply(conn, owner, next_id, edit, target, held["session_id"])
            await conn.execute("DELETE FROM owner_memory_pending WHERE owner = $1 AND id = $2", owner, pending_id)
            return EditResult(await self._bump(conn, owner, next_id + (edit.action == "add")), entry=entry)

    async def reject(self, owner: str, pending_id: int) -> None:
        dropped = await self.pool.fetchval(
            "DELETE FROM owner_memory_pending WHERE owner = $1 AND id = $2 RETURNING id", owner, pending_id
        )
        if dropped is None:
            raise NotFound(f"held memory write {pending_id} not found (approved or rejected already?)")

    # -- steps of a change ----------------------------------------------------------------------
    @staticmethod
    async def _lock(conn: Connection, owner: str, expected_revision: int | None) -> tuple[int, int]:
        """(revision, next id) of the owner's memory, its row locked for this transaction."""
        await conn.execute("INSERT INTO owner_memory (owner) VALUES ($1) ON CONFLICT (owner) DO NOTHING", owner)
        row = await fetch_one(conn, "SELECT revision, next_id FROM owner_memory WHERE owner = $1 FOR UPDATE", owner)
        if expected_revision is not None and row["revision"] != expected_revision:
            raise Aborted(
                f"memory is at revision {row['revision']}, not the expected {expected_revision}: it "
                "changed meanwhile; read it again and retry"
            )
        return row["revision"], row["next_id"]

    @staticmethod
    async def _entries(conn: Connection, owner: str) -> list[Entry]:
        rows = await conn.fetch("SELECT id, text FROM owner_memory_entries WHERE owner = $1 ORDER BY id", owner)
        return [Entry(r["id"], r["text"]) for r in rows]

    async def _hold(
        self,
        conn: Connection,
        owner: str,
        next_id: int,
        edit: MemoryEdit,
        target: Entry | None,
        session_id: uuid.UUID | None,
    ) -> asyncpg.Record:
        waiting = await conn.fetchval("SELECT count(*) FROM owner_memory_pending WHERE owner = $1", owner)
        if self.caps.max_pending and waiting >= self.caps.max_pending:
            raise ResourceExhausted(
                f"{waiting} memory writes already wait for the owner's approval, the most kept "
                "(PALIMPSEST_MEMORY_MAX_PENDING); the owner must approve or reject them first"
            )
        await conn.execute("UPDATE owner_memory SET next_id = $2 WHERE owner = $1", owner, next_id + 1)
        return await fetch_one(
            conn,
            "INSERT INTO owner_memory_pending (owner, id, action, entry_id, old_text, text, session_id)"
            f" VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING {_PENDING_COLUMNS}",
            owner,
            next_id,
            edit.action,
            target.id if target else None,
            target.text if target else "",
            edit.text,
            session_id,
        )

    @staticmethod
    async def _apply(
        conn: Connection, owner: str, next_id: int, edit: MemoryEdit, target: Entry | None, session_id: uuid.UUID | None
    ) -> asyncpg.Record:
        if edit.action == "add":
            return await fetch_one(
                conn,
                f"INSERT INTO owner_memory_entries (owner, id, text, session_id) VALUES ($1, $2, $3, $4)"
                f" RETURNING {_ENTRY_COLUMNS}",
                owner,
                next_id,
                edit.text,
                session_id,
            )
        assert target is not None
        if edit.action == "replace":
            return await fetch_one(
                conn,
                "UPDATE owner_memory_entries SET text = $3, session_id = $4, updated_at = now()"
                f" WHERE owner = $1 AND id = $2 RETURNING {_ENTRY_COLUMNS}",
                owner,
                target.id,
                edit.text,
                session_id,
            )
        return await fetch_one(
            conn,
            f"DELETE FROM owner_memory_entries WHERE owner = $1 AND id = $2 RETURNING {_ENTRY_COLUMNS}",
            owner,
            target.id,
        )

    @staticmethod
    async def _bump(conn: Connection, owner: str, next_id: int) -> int:
        return await conn.fetchval(
            "UPDATE owner_memory SET revision = revision + 1, next_id = $2, updated_at = now()"
            " WHERE owner = $1 RETURNING revision",
            owner,
            next_id,
        )

"""Sessions and their messages: the sessions row (counters, revision), session_messages (the hot
window), session_messages_archive (rows moved out past it) and applied_appends (idempotent appends).

Every write locks the session's row, checks ownership and `expected_revision`, and bumps the
revision in the same transaction (see access), so two writers can never interleave unnoticed.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import asyncpg

from palimpsest.shared.auth import Identity
from palimpsest.shared.errors import NotFound
from palimpsest.store import convert
from palimpsest.store.convert import INSERT_COLUMNS
from palimpsest.store.db import Connection, commit_one, fetch_one
from palimpsest.store.repository.access import (
    check_revision,
    lock_session,
    readable,
    rows_affected,
    visible,
)
from palimpsest.store.repository.calibration import EXACT_FIELDS, forget_baseline
from palimpsest.store.repository.hot_window import HotWindowArchive
from palimpsest.store.repository.memory import insert_chunks
from palimpsest.store.repository.message_rows import new_rows_bytes
from palimpsest.store.repository.owner_memory import memory_snapshot
from palimpsest.store.repository.session_base import PREVIEW_CHARS, HotWindow
from palimpsest.store.repository.session_reads import Page, SessionRead, SessionReads
from palimpsest.store.repository.token_counts import write_token_counts
from palimpsest.v1 import common_pb2

PLANNING_LOG_CAP = 20

_INSERT_SQL = f"INSERT INTO session_messages ({INSERT_COLUMNS}) VALUES ({', '.join(f'${i}' for i in range(1, 26))})"
_ROW_FIELDS = [c.strip() for c in INSERT_COLUMNS.split(",")]
_APPEND_SQL = (
    "SELECT * FROM append_messages($1, $2, $3, $4, $5::session_messages[], $6, $7, $8, $9, $10, $11, $12, $13, $14)"
)


# A retry comes within its writer's deadline (seconds to minutes); a day of keys is plenty.
APPEND_KEY_DAYS = 1


@dataclass(frozen=True)
class Report:
    """A model call's report written with the append of its answer (see ModelReport)."""

    baseline: dict[str, Any] | None = None
    prompt_cut: bool = False
    observation: tuple[str, int, int, dict[str, int]] | None = None  # model, chars, tokens, exact shape
    context_token_count: int | None = None
    token_digest: str = ""
    token_counts: Sequence[tuple[int, int, str]] = ()  # seq, tokens, content md5


@dataclass
class AppendResult:
    seqs: list[int]
    revision: int
    archived: int
    context_truncated: bool = False
    session_changed: bool = False  # see AppendMessagesResponse.session_changed


__all__ = ["AppendResult", "HotWindow", "Page", "Report", "SessionRead", "Sessions"]


class Sessions(SessionReads, HotWindowArchive):
    """Sessions, their messages and the archive: create, append (idempotently), read, compress, trim.

    Reads are SessionReads', the hot window's moves HotWindowArchive's; the writes are here."""

    async def create_session(
        self,
        identity: Identity,
        *,
        profile_id: str,
        name: str,
        provider: str,
        model: str,
        external_refs: list[dict[str, Any]],
        metadata: dict[str, Any],
    ) -> asyncpg.Record:
        owner = identity.owner_for_new_session
        async with self.pool.acquire() as conn, conn.transaction():
            await self.usage.check_session_count(conn, owner)
            # The owner's memory as the session's prompts carry it until its first compression.
            memory = await memory_snapshot(conn, owner)
            return await fetch_one(
                conn,
                "INSERT INTO sessions (id, owner, profile_id, name, provider, model, external_refs, metadata,"
                " memory_snapshot) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING *",
                uuid.uuid4(),
                owner,
                profile_id,
                name,
                provider,
                model,
                external_refs,
                metadata,
                memory,
            )

    async def mark_untrusted(self, session_id: uuid.UUID) -> None:
        """Sticky: the session has taken in outside content (a file put into it). The revision moves
        the one time the flag does, so a copy of the session kept elsewhere (the Agent's warm one)
        is known stale; a session already flagged is not written at all."""
        async with self.pool.acquire() as conn:
            await conn.execute(
                "UPDATE sessions SET untrusted_ingested = true, revision = revision + 1"
                " WHERE id = $1 AND NOT untrusted_ingested",
                session_id,
            )

    # -- writes ----------------------------------------------------------------------------
    async def append_messages(
        self,
        identity: Identity,
        session_id: uuid.UUID,
        messages: Sequence[common_pb2.Message],
        expected_revision: int | None,
        idempotency_key: str = "",
        report: Report | None = None,
        expected_next_seq: int | None = None,
        tool_runs: Sequence[dict[str, Any]] = (),
    ) -> AppendResult:
        """One statement (the append_messages function, functions.sql): the checks, the
        rows, the counters, the report, the tool runs (``convert.tool_run_row``s, for the audit log)
        and the key in one round trip and its commit. An answer's append stands between the model's
        last token and the client's stream_end. Tool runs alone (no messages) change nothing else."""
        now = datetime.now(timezone.utc)
        rows = [dict(zip(_ROW_FIELDS, convert.message_row(session_id, 0, m, now))) for m in messages]
        preview = next((m.content for m in messages if m.role == "user" and m.content), "")[:PREVIEW_CHARS]
        adding = sum(m.ByteSize() for m in messages)
        quotas = self.usage.quotas.max_bytes > 0 and adding > 0
        quota_owner = identity.sub if quotas else None
        while True:
            allowance = await self.usage.allowance(self.pool, quota_owner) if quota_owner is not None else None
            row = await commit_one(
                self.pool,
                _APPEND_SQL,
                session_id,
                _only_owner(identity),
                expected_revision,
                expected_next_seq,
                rows,
                now,
                preview,
                idempotency_key,
                APPEND_KEY_DAYS,
                quota_owner,
                allowance,
                adding,
                _report_json(report),
                list(tool_runs) or None,
            )
            if row["status"] != "quota_owner":
                break
            quota_owner = row["owner"]  # another owner's session (an admin's write): their allowance
        status = row["status"]
        if status == "not_found":
            raise NotFound(f"session {session_id} not found")
        if status == "forbidden":
            identity.require_access(row["owner"], str(session_id))
        if status == "stale":
            check_revision(session_id, row["revision"], expected_revision)
        if status == "quota":
            self.usage.refuse(row["owner"], adding, allowance or 0)
        if status == "replayed":
            return AppendResult(seqs=list(row["seqs"]), revision=row["revision"], archived=0, session_changed=True)
        if status != "ok":
            raise AssertionError(f"append_messages answered {status!r}")
        if quota_owner is not None:
            self.usage.record(quota_owner, adding)
        archived = 0
        if self._over_hot_window(row["hot_count"], row["hot_bytes"]):
            archived = await self._archive_if_over(session_id)
        return AppendResult(
            seqs=list(row["seqs"]),
            revision=row["revision"],
            archived=archived,
            context_truncated=bool(row["truncated"]),
            session_changed=bool(row["changed"]),
        )

    async def claim_turn(
        self, identity: Identity, session_id: uuid.UUID, holder: str, ttl_seconds: int, release: bool
    ) -> tuple[bool, str, float]:
        """(granted, the holder when not, its seconds left). The claim is the holder's when the
        session's turn is free, expired, or already its own; the revision stays (a claim is not a
        change to the session, and must not make the holder's next write stale)."""
        async with self.pool.acquire() as conn, conn.transaction():
            await readable(conn, session_id, identity)
            if release:
                await conn.execute(
                    "UPDATE sessions SET turn_holder = '', turn_until = NULL WHERE id = $1 AND turn_holder = $2",
                    session_id,
                    holder,
                )
                return True, "", 0.0
            row = await fetch_one(
                conn,
                """
                SELECT turn_holder, coalesce(turn_until > now(), false) AS live,
                       greatest(0, extract(epoch FROM turn_until - now()))::float8 AS left
                  FROM sessions WHERE id = $1 FOR UPDATE
                """,
                session_id,
            )
            if row["live"] and row["turn_holder"] not in ("", holder):
                return False, row["turn_holder"], row["left"] or 0.0
            await conn.execute(
                "UPDATE sessions SET turn_holder = $2, turn_until = now() + make_interval(secs => $3) WHERE id = $1",
                session_id,
                holder,
                float(ttl_seconds),
            )
            return True, "", float(ttl_seconds)

    async def update_session(
        self, identity: Identity, session_id: uuid.UUID, changes: dict[str, Any], expected_revision: int | None
    ) -> asyncpg.Record:
        async with self.pool.acquire() as conn, conn.transaction():
            await lock_session(conn, session_id, identity, expected_revision)
            current = await fetch_one(conn, "SELECT * FROM sessions WHERE id = $1", session_id)
            sets: dict[str, Any] = {}
            for key in ("name", "pinned", "profile_id", "context_token_count", "provider", "model"):
                if key in changes:
                    sets[key] = changes[key]
            if "metadata" in changes:
                merged = dict(current["metadata"])
                for key, value in changes["metadata"].items():
                    if value is None:
                        merged.pop(key, None)
                    else:
                        merged[key] = value
                sets["metadata"] = merged
            if "external_refs" in changes:
                sets["external_refs"] = changes["external_refs"](current["external_refs"])
            if changes.get("untrusted_ingested"):
                sets["untrusted_ingested"] = True
            if changes.get("episode_untrusted"):
                sets["episode_untrusted"] = True
            if changes.get("sandboxed"):
                sets["sandboxed"] = True
            if "planning_log" in changes:
                sets["planning_logs"] = (list(current["planning_logs"]) + [changes["planning_log"]])[-PLANNING_LOG_CAP:]
            columns = list(sets)
            assignments = ", ".join(f"{c} = ${i + 2}" for i, c in enumerate(columns))
            return await fetch_one(
                conn,
                f"UPDATE sessions SET {assignments}{',' if assignments else ''} revision = revision + 1"
                " WHERE id = $1 RETURNING *",
                session_id,
                *[sets[c] for c in columns],
            )

    async def set_context_flag(
        self,
        identity: Identity,
        session_id: uuid.UUID,
        seqs: list[int],
        is_context: bool,
        expected_revision: int | None,
    ) -> tuple[int, int]:
        async with self.pool.acquire() as conn, conn.transaction():
            await lock_session(conn, session_id, identity, expected_revision)
            updated = await self._set_flag(conn, session_id, seqs, is_context)
            revision = await self._bump(conn, session_id)
        return updated, revision

    @staticmethod
    async def _set_flag(conn: Connection, session_id: uuid.UUID, seqs: list[int], is_context: bool) -> int:
        # Deliberately no filter on is_display: context-only rows (older summaries) must flip too.
        total = 0
        for table in ("session_messages", "session_messages_archive"):
            status = await conn.execute(
                f"UPDATE {table} SET is_context = $3 WHERE session_id = $1 AND seq = ANY($2::bigint[])",
                session_id,
                seqs,
                is_context,
            )
            total += rows_affected(status)
        return total

    async def commit_compression(
        self,
        identity: Identity,
        session_id: uuid.UUID,
        *,
        demote_seqs: list[int],
        summary: common_pb2.Message | None,
        marker: common_pb2.Message | None,
        context_token_count: int,
        chunks: Sequence[common_pb2.RawChunk],
        expected_revision: int | None,
        archive: bool,
        replacements: Sequence[common_pb2.Message] = (),
    ) -> dict[str, int]:
        now = datetime.now(timezone.utc)
        async with self.pool.acquire() as conn, conn.transaction():
            locked = await lock_session(conn, session_id, identity, expected_revision)
            await self._set_flag(conn, session_id, demote_seqs, False)
            result = {"summary_seq": 0, "marker_seq": 0}
            added: list[tuple[int, common_pb2.Message]] = []

            def place(message: common_pb2.Message, key: str = "", **flags: bool) -> None:
                """The next seq for a row the commit adds, with the flags that say what it is."""
                for name, value in {**flags, "explicit_flags": True}.items():
                    setattr(message, name, value)
                seq = locked["next_seq"] + len(added)
                if key:
                    result[key] = seq
                added.append((seq, message))

            if summary is not None:
                place(summary, "summary_seq", is_summary=True, is_context=True, is_display=False)
            for replacement in replacements:  # each stands where the row it replaces stood (its `replaces`)
                place(replacement, is_context=True, is_display=False)
            if marker is not None:
                place(marker, "marker_seq", is_compression=True, is_context=False, is_display=True)
            next_seq = locked["next_seq"] + len(added)
            await conn.executemany(_INSERT_SQL, [convert.message_row(session_id, s, m, now) for s, m in added])
            result["chunks_indexed"] = await insert_chunks(conn, session_id, chunks)
            # The prompt is rewritten here anyway: the owner's memory as it is now joins it, the one
            # moment a change of memory can reach a running session without costing Ollama its prefix.
            # Not at a commit that only puts previews in place (a turn's results pruned as it ends):
            # that rewrites the prompt's tail, and a new memory message would rewrite all of it.
            only_previews = summary is None and bool(replacements)
            memory = None if only_previews else await memory_snapshot(conn, locked["owner"])
            updated = await fetch_one(
                conn,
                f"""
                UPDATE sessions SET revision = revision + 1, next_seq = $2, last_active = $3,
                       context_token_count = $4, display_count = display_count + $5,
                       hot_count = hot_count + $6, hot_bytes = hot_bytes + added.bytes,
                       message_bytes = message_bytes + added.bytes,
                       memory_snapshot = COALESCE($8, memory_snapshot)
                  FROM (SELECT {new_rows_bytes("$7")} AS bytes) added
                 WHERE id = $1 RETURNING revision, hot_count, hot_bytes
                """,
                session_id,
                next_seq,
                now,
                context_token_count,
                1 if marker is not None else 0,
                len(added),
                locked["next_seq"],
                memory,
            )
            result["revision"] = updated["revision"]
            # The context just shrank: the last real prompt size no longer describes it.
            await forget_baseline(conn, session_id)
            result["archived"] = 0
            if archive and self._over_hot_window(updated["hot_count"], updated["hot_bytes"]):
                result["archived"] = await self._archive_overflow(conn, session_id)
        return result

    async def delete_session(self, identity: Identity, session_id: uuid.UUID) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            await lock_session(conn, session_id, identity, None)
            # Messages, archive, chunks, shares and baselines go with it (ON DELETE CASCADE).
            await conn.execute("DELETE FROM sessions WHERE id = $1", session_id)
        self.usage.forget()

    async def cleanup_sessions(self, identity: Identity, older_than_days: int) -> list[str]:
        params: list[Any] = [older_than_days]
        callers = visible(identity, params)
        rows = await self.pool.fetch(
            f"DELETE FROM sessions s WHERE s.last_active < now() - make_interval(days => $1) AND {callers}"
            " RETURNING s.id"
            if older_than_days > 0
            else f"DELETE FROM sessions s WHERE ($1::int = 0) AND {callers} RETURNING s.id",
            *params,
        )
        self.usage.forget()
        return [str(r["id"]) for r in rows]

    async def set_token_counts(
        self,
        identity: Identity,
        session_id: uuid.UUID,
        token_digest: str,
        counts: Sequence[common_pb2.TokenCount],
    ) -> int:
        """Store counts made by one tokenizer, each only on the row whose content it was made from
        (its md5): a size check counts what its caller sent, and a caller without access to a row
        could otherwise put any count on it. Counts are derived data, not content: the revision
        stays, so a count written beside a turn never makes that turn's next write ABORTED. The
        session's row is locked first, as every writer of its rows does: a count written beside a
        compression's commit, each updating the other's rows in its own order, deadlocked."""
        async with self.pool.acquire() as conn, conn.transaction():
            await readable(conn, session_id, identity)
            await conn.execute("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE", session_id)
            updated = await write_token_counts(conn, session_id, token_digest, counts)
        return updated

    async def existing_ids(self, ids: list[str]) -> set[str]:
        rows = await self.pool.fetch("SELECT id FROM sessions WHERE id = ANY($1::uuid[])", ids)
        return {str(r["id"]) for r in rows}


def _only_owner(identity: Identity) -> str | None:
    """The one owner whose sessions the caller may write; None: any (see Identity.can_access)."""
    return None if identity.can_access(None) else identity.sub


def _report_json(report: Report | None) -> dict[str, Any] | None:
    """A report as the append function reads it (see functions.sql)."""
    if report is None:
        return None
    out: dict[str, Any] = {
        "prompt_cut": report.prompt_cut,
        "token_digest": report.token_digest,
        "token_counts": [list(c) for c in report.token_counts],
    }
    if report.context_token_count is not None:
        out["context_token_count"] = report.context_token_count
    if report.baseline is not None:
        out["baseline"] = {k: report.baseline[k] for k in ("tokens", "through_seq", "model")}
    if report.observation is not None:
        model, chars, tokens, exact = report.observation
        out["observation"] = {
            "model": model,
            "chars": chars,
            "tokens": tokens,
            **{name: exact.get(name, 0) for name in EXACT_FIELDS},
        }
    return out

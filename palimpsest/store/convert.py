"""Rows ↔ protobuf messages for the SessionStore: one place that knows both shapes."""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import PurePosixPath
from typing import Any

import asyncpg
from google.protobuf import timestamp_pb2

from palimpsest.shared.external_refs import ExternalRef
from palimpsest.shared.owner_memory import snapshot_proto
from palimpsest.shared.structs import from_struct, to_struct
from palimpsest.shared.validation import EARLIEST, LATEST
from palimpsest.store.redaction import redact_arguments, redact_text
from palimpsest.v1 import common_pb2, session_store_pb2

# A row as asyncpg reads it.
Row = asyncpg.Record | Mapping[str, Any]

log = logging.getLogger("palimpsest.store")

MESSAGE_COLUMNS = (
    "seq, role, content, thinking, tool_calls, tool_call_id, name, images, files, metadata, "
    "is_context, is_display, is_plan, is_compression, is_summary, is_compression_critical, is_recall, "
    "elapsed_seconds, tool_call_count, token_count, created_at, breadcrumbs, replaces_first, replaces_last"
)
INSERT_COLUMNS = "session_id, " + MESSAGE_COLUMNS
VALID_ROLES = frozenset({"system", "user", "assistant", "tool"})


def timestamp(dt: datetime) -> timestamp_pb2.Timestamp:
    """A stored time as a Timestamp, inside the range requests are held to (validation.EARLIEST to
    LATEST), so whatever the store reads back it would also take. Rows written before that range
    was enforced can hold year 1, which asyncpg stored as '-infinity' and reads back as a naive
    datetime.min, or 'infinity': such a time reads as the nearest end of the range (the earliest is
    the epoch, which clients take for unset) and is logged once, and no read of its session fails."""
    if dt.tzinfo is None:  # only asyncpg's ±infinity: every column is timestamptz
        dt = dt.replace(tzinfo=timezone.utc)
    inside = min(max(dt, EARLIEST), LATEST)
    if inside != dt:
        _out_of_range_read(dt, inside)
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(inside)
    return ts


_said_out_of_range = False


def _out_of_range_read(stored: datetime, read: datetime) -> None:
    global _said_out_of_range
    if not _said_out_of_range:
        _said_out_of_range = True
        log.warning(
            "a stored time, %s, is outside what the store takes (written before times were checked): "
            "read as %s; any more such times are read the same way without saying so",
            stored.isoformat(),
            read.isoformat(),
        )


def to_datetime(ts: timestamp_pb2.Timestamp | None) -> datetime | None:
    if ts is None or (ts.seconds == 0 and ts.nanos == 0):
        return None
    return ts.ToDatetime(tzinfo=timezone.utc)


def tool_calls_json(message: common_pb2.Message) -> list[dict[str, str]]:
    """Tool calls as stored: arguments redacted so secrets never reach the database."""
    return [{"id": c.id, "name": c.name, "arguments": redact_arguments(c.arguments_json)} for c in message.tool_calls]


def message_row(session_id: uuid.UUID, seq: int, message: common_pb2.Message, now: datetime) -> tuple[Any, ...]:
    """The INSERT values for one appended message (flags default to context + display)."""
    explicit = message.explicit_flags
    replaces = message.replaces if message.HasField("replaces") else None
    return (
        session_id,
        seq,
        message.role,
        message.content,
        message.thinking,
        tool_calls_json(message),
        message.tool_call_id,
        message.name,
        list(message.images),
        list(message.files),
        from_struct(message.metadata) if message.HasField("metadata") else {},
        message.is_context if explicit else True,
        message.is_display if explicit else True,
        message.is_plan,
        message.is_compression,
        message.is_summary,
        message.is_compression_critical,
        message.is_recall,
        message.elapsed_seconds,
        message.tool_call_count or len(message.tool_calls),
        message.token_count,
        to_datetime(message.created_at) or now,  # (unset, or the epoch: a zero Timestamp)
        list(message.breadcrumbs),
        replaces.first if replaces else None,
        replaces.last if replaces else None,
    )


# A session folder is named by the session's id (files.py).
_SESSION_FOLDER = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)


def session_file_name(path: str) -> str:
    """A message's file as its name, when it is a path into a session folder on the store's host
    (messages written before file paths became names); anything else as the client wrote it."""
    pure = PurePosixPath(path)
    if pure.is_absolute() and _SESSION_FOLDER.fullmatch(pure.parent.name):
        return pure.name
    return path


def message_from_row(row: Row, *, archived: bool = False) -> common_pb2.Message:
    message = common_pb2.Message(
        seq=row["seq"],
        role=row["role"],
        content=row["content"],
        thinking=row["thinking"],
        tool_call_id=row["tool_call_id"],
        name=row["name"],
        images=list(row["images"] or []),
        files=[session_file_name(path) for path in row["files"] or []],
        is_context=row["is_context"],
        is_display=row["is_display"],
        is_plan=row["is_plan"],
        is_compression=row["is_compression"],
        is_summary=row["is_summary"],
        is_compression_critical=row["is_compression_critical"],
        is_recall=row["is_recall"],
        elapsed_seconds=row["elapsed_seconds"],
        tool_call_count=row["tool_call_count"],
        token_count=row["token_count"],
        breadcrumbs=list(row["breadcrumbs"] or []),
        archived=archived,
        explicit_flags=True,
    )
    for call in row["tool_calls"] or []:
        message.tool_calls.add(
            id=call.get("id", ""), name=call.get("name", ""), arguments_json=call.get("arguments", "")
        )
    if row["metadata"]:
        message.metadata.update(row["metadata"])
    message.created_at.CopyFrom(timestamp(row["created_at"]))
    if row["replaces_first"] is not None:
        message.replaces.first = row["replaces_first"]
        message.replaces.last = row["replaces_last"]
    return message


def external_ref_to_json(ref: ExternalRef) -> dict[str, Any]:
    return {
        "kind": ref.kind,
        "uri": ref.uri,
        "created_by": ref.created_by,
        "read_only": ref.read_only,
        "created_at": ref.created_at.isoformat() if ref.created_at else None,
    }


def external_ref_to_proto(data: dict[str, Any]) -> common_pb2.ExternalRef:
    ref = common_pb2.ExternalRef(
        kind=data["kind"], uri=data["uri"], created_by=data["created_by"], read_only=bool(data.get("read_only"))
    )
    if data.get("created_at"):
        ref.created_at.CopyFrom(timestamp(datetime.fromisoformat(data["created_at"])))
    return ref


def session_from_row(row: Row) -> common_pb2.Session:
    session = common_pb2.Session(
        id=str(row["id"]),
        profile_id=row["profile_id"],
        owner=row["owner"] or "",
        name=row["name"],
        pinned=row["pinned"],
        provider=row["provider"],
        model=row["model"],
        context_token_count=row["context_token_count"],
        revision=row["revision"],
        next_seq=row["next_seq"],
        untrusted_ingested=row["untrusted_ingested"],
        episode_untrusted=row["episode_untrusted"],
        sandboxed=row.get("sandboxed", False),
        display_message_count=row["display_count"],
        external_refs=[external_ref_to_proto(r) for r in row["external_refs"] or []],
        planning_logs=[to_struct(log) for log in row["planning_logs"] or []],
    )
    session.created_at.CopyFrom(timestamp(row["created_at"]))
    session.last_active.CopyFrom(timestamp(row["last_active"]))
    if row["metadata"]:
        session.metadata.update(row["metadata"])
    if row["memory_snapshot"] is not None:
        session.memory.CopyFrom(snapshot_proto(row["memory_snapshot"]))
    return session


def summary_from_row(row: Row) -> common_pb2.SessionSummary:
    summary = common_pb2.SessionSummary(
        id=str(row["id"]),
        profile_id=row["profile_id"],
        owner=row["owner"] or "",
        name=row["name"],
        pinned=row["pinned"],
        provider=row["provider"],
        model=row["model"],
        display_message_count=row["display_count"],
        preview=row["preview"],
        context_token_count=row["context_token_count"],
        revision=row["revision"],
        untrusted_ingested=row["untrusted_ingested"],
    )
    summary.created_at.CopyFrom(timestamp(row["created_at"]))
    summary.last_active.CopyFrom(timestamp(row["last_active"]))
    return summary


def chunk_from_row(row: Row) -> common_pb2.RawChunk:
    chunk = common_pb2.RawChunk(
        id=row["id"],
        session_id=str(row["session_id"]),
        content=row["content"],
        content_hash=row["content_hash"],
        turn_range=common_pb2.SeqRange(first=row["first_seq"], last=row["last_seq"]),
        breadcrumbs=list(row["breadcrumbs"] or []),
        score=float(row["score"]) if "score" in row.keys() and row["score"] is not None else 0.0,
        similarity=float(row["similarity"]) if "similarity" in row.keys() and row["similarity"] is not None else 0.0,
    )
    if row["first_at"]:
        chunk.first_at.CopyFrom(timestamp(row["first_at"]))
    if row["last_at"]:
        chunk.last_at.CopyFrom(timestamp(row["last_at"]))
    return chunk


# How the log names a run's outcome (the table's CHECK lists the same words).
OUTCOME_NAMES = {
    session_store_pb2.TOOL_RUN_OUTCOME_OK: "ok",
    session_store_pb2.TOOL_RUN_OUTCOME_ERROR: "error",
    session_store_pb2.TOOL_RUN_OUTCOME_REFUSED: "refused",
    session_store_pb2.TOOL_RUN_OUTCOME_STOPPED: "stopped",
}
_OUTCOMES = {name: value for value, name in OUTCOME_NAMES.items()}
# What the log keeps of a run's error: enough to audit; the whole text is in the stored result.
# (Of its arguments the append function keeps 8,000 characters, cut after redaction.)
TOOL_RUN_ERROR_CHARS = 500


def tool_run_row(run: session_store_pb2.ToolRun) -> dict[str, Any]:
    """A tool run as the append function writes it (functions.sql): arguments redacted as stored
    tool calls' are (a stored call's come from its row, redacted already), the error text by the
    same rules and cut to what the log keeps."""
    error = redact_text(run.error)
    return {
        "turn_id": run.turn_id,
        "call_id": run.call_id,
        "is_subagent": run.is_subagent,
        "tool": run.tool,
        "arguments": "" if run.call_seq else redact_arguments(run.arguments_json),
        "call_seq": run.call_seq,
        "started_at": run.started_at.ToDatetime(tzinfo=timezone.utc).isoformat(),
        "duration_seconds": run.duration_seconds,
        "outcome": OUTCOME_NAMES[run.outcome],
        "bytes_in": run.bytes_in,
        "bytes_out": run.bytes_out,
        "error": error if len(error) <= TOOL_RUN_ERROR_CHARS else error[: TOOL_RUN_ERROR_CHARS - 1] + "…",
    }


def tool_run_from_row(row: Row) -> session_store_pb2.ToolRun:
    run = session_store_pb2.ToolRun(
        seq=row["seq"],
        turn_id=row["turn_id"],
        call_id=row["call_id"],
        is_subagent=row["is_subagent"],
        tool=row["tool"],
        arguments_json=row["arguments"],
        call_seq=row["call_seq"],
        duration_seconds=row["duration_seconds"],
        outcome=_OUTCOMES[row["outcome"]],
        bytes_in=row["bytes_in"],
        bytes_out=row["bytes_out"],
        error=row["error"],
    )
    run.started_at.CopyFrom(timestamp(row["started_at"]))
    return run


_MEMORY_ACTIONS = {
    "add": session_store_pb2.MEMORY_ACTION_ADD,
    "replace": session_store_pb2.MEMORY_ACTION_REPLACE,
    "remove": session_store_pb2.MEMORY_ACTION_REMOVE,
}


def memory_entry(row: Row) -> session_store_pb2.MemoryEntry:
    entry = session_store_pb2.MemoryEntry(
        id=row["id"], text=row["text"], session_id=str(row["session_id"]) if row["session_id"] else ""
    )
    entry.created_at.CopyFrom(timestamp(row["created_at"]))
    entry.updated_at.CopyFrom(timestamp(row["updated_at"]))
    return entry


def pending_memory_write(row: Row) -> session_store_pb2.PendingMemoryWrite:
    held = session_store_pb2.PendingMemoryWrite(
        id=row["id"],
        action=_MEMORY_ACTIONS[row["action"]],
        entry_id=row["entry_id"] or 0,
        old_text=row["old_text"],
        text=row["text"],
        session_id=str(row["session_id"]) if row["session_id"] else "",
    )
    held.created_at.CopyFrom(timestamp(row["created_at"]))
    return held


def dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)

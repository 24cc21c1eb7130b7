"""The snapshot of an owner's memory a session holds: written by the SessionStore into the session's
metadata when the session is created and at each of its compressions, read by the Agent to build the
memory message. Between two compressions it does not change, so the prompt's beginning stays
byte-identical and Ollama reuses what it evaluated of it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf import struct_pb2

# The metadata key; the store's own (UpdateSession refuses it).
SNAPSHOT_KEY = "memory_snapshot"


def snapshot(revision: int, texts: Sequence[str]) -> dict[str, Any]:
    """The owner's memory at ``revision``, its entries' texts oldest first."""
    return {"revision": revision, "entries": list(texts)}


def snapshot_entries(metadata: struct_pb2.Struct | Mapping[str, Any]) -> list[str]:
    """The entries a session's snapshot holds; none when it has none (a session from before memory,
    until its next compression) or when it is malformed."""
    if SNAPSHOT_KEY not in metadata:
        return []
    held = metadata[SNAPSHOT_KEY]
    entries = held["entries"] if isinstance(held, struct_pb2.Struct | Mapping) and "entries" in held else None
    if not isinstance(entries, struct_pb2.ListValue | list):
        return []
    return [text for text in entries if isinstance(text, str) and text.strip()]


def snapshot_revision(metadata: struct_pb2.Struct | Mapping[str, Any]) -> int | None:
    """The memory revision the session's snapshot was taken at (None: it holds none)."""
    if SNAPSHOT_KEY not in metadata:
        return None
    held = metadata[SNAPSHOT_KEY]
    revision = held["revision"] if isinstance(held, struct_pb2.Struct | Mapping) and "revision" in held else None
    return int(revision) if isinstance(revision, int | float) else None

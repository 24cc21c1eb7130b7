"""The snapshot of an owner's memory a session holds (Session.memory): written by the SessionStore
when the session is created and at each of its compressions, read by the Agent to build the memory
message. Between two compressions it does not change, so the prompt's beginning stays byte-identical
and Ollama reuses what it evaluated of it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from palimpsest.v1 import common_pb2


def snapshot(revision: int, texts: Sequence[str]) -> dict[str, Any]:
    """The owner's memory at ``revision`` as the sessions table keeps it, its entries oldest first."""
    return {"revision": revision, "entries": list(texts)}


def snapshot_proto(stored: Mapping[str, Any]) -> common_pb2.MemorySnapshot:
    return common_pb2.MemorySnapshot(
        revision=int(stored.get("revision") or 0),
        entries=[t for t in stored.get("entries") or [] if isinstance(t, str)],
    )

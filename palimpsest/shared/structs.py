"""google.protobuf.Struct ↔ plain dicts, the one conversion every service uses."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format, struct_pb2


def to_struct(data: dict[str, Any] | None) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    if data:
        struct.update(data)
    return struct


def from_struct(struct: struct_pb2.Struct | None) -> dict[str, Any]:
    return json_format.MessageToDict(struct) if struct is not None else {}

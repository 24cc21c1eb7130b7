"""Small helpers the built-in tools share: argument reading, timestamps, Struct conversion."""

from __future__ import annotations

import re
from datetime import UTC
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any

from google.protobuf import timestamp_pb2

from services.agent.tools.base import ToolResult
from services.shared.file_policy import parse_file_link
from services.shared.structs import from_struct, to_struct  # noqa: F401 — the tools' one import site


class ToolInputError(Exception):
    """The model's arguments cannot be used; the message names the field and says what to send."""


def error(text: str) -> ToolResult:
    """A refusal the model should read and correct; our own words, so it taints nothing."""
    return ToolResult(content=text, is_error=True, untrusted=False)


def text_arg(args: dict[str, Any], name: str, *, required: bool = False, default: str = "") -> str:
    value = args.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise ToolInputError(f"'{name}' is required")
        return default
    return str(value).strip()


def int_arg(args: dict[str, Any], name: str, *, default: int, low: int, high: int) -> int:
    value = args.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise ToolInputError(f"'{name}' must be a whole number")
    if not low <= value <= high:
        raise ToolInputError(f"'{name}' must be between {low} and {high}, got {int(value)}")
    return int(value)


def when(ts: timestamp_pb2.Timestamp) -> str:
    """A protobuf timestamp as minutes in UTC; '?' when unset."""
    if not ts.seconds and not ts.nanos:
        return "?"
    return ts.ToDatetime(tzinfo=UTC).strftime("%Y-%m-%d %H:%M UTC")


def shorten(text: str, limit: int) -> str:
    """At most `limit` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    return text[:limit] + f" […{len(text) - limit} more chars]"


def role_and_content(message: Any) -> tuple[str, str]:
    """Role and text of a context message, whether a protobuf Message or an Ollama-style dict."""
    if isinstance(message, dict):
        return str(message.get("role") or ""), str(message.get("content") or "")
    return str(getattr(message, "role", "") or ""), str(getattr(message, "content", "") or "")


_UUID = re.compile(r"^[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$")


def file_name(path: str, session_id: str) -> str:
    """The stored name behind `path`: `image_2.png`, `session_files/<id>/report.pdf` (a notice's
    path), an absolute path ending so, or a file link. A path into another session's folder is
    refused rather than silently read from this one."""
    text = path.strip().strip("'\"`")
    linked = parse_file_link(text)
    if linked is not None:
        folder, name = linked
    else:
        pure = PureWindowsPath(text) if "\\" in text else PurePosixPath(text)
        folder, name = pure.parent.name, pure.name
    if not name or name in (".", ".."):
        raise ToolInputError(f"'path' {path!r} does not name a file")
    if _UUID.match(folder) and session_id and folder.lower() != session_id.lower():
        raise ToolInputError(f"{path!r} belongs to another session; only this session's files can be used")
    return name

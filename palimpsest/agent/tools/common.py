"""Small helpers the built-in tools share: argument reading, timestamps, Struct conversion."""

from __future__ import annotations

import re
from datetime import UTC
from typing import Any

from google.protobuf import timestamp_pb2

from palimpsest.agent.tools.base import ToolResult
from palimpsest.shared.file_policy import parse_file_link

# The tools' one import site for these (re-exported: `as` says so to mypy and ruff).
from palimpsest.shared.structs import from_struct as from_struct
from palimpsest.shared.structs import to_struct as to_struct
from palimpsest.shared.workspace_paths import BadPath, workspace_path


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


_STORE_LAYOUT = re.compile(r"(?:^|/)session_files/([^/]+)/(.+)$")


def file_name(path: str, session_id: str, cwd: str = "") -> str:
    """The workspace path behind `path`: a workspace path (`image_2.png`, `src/app.py`, resolved from
    ``cwd``; `/workspace/…` as commands see it), an older notice's `session_files/<id>/report.pdf`, or
    a file link. A path into another session's files is refused rather than read from this one."""
    text = path.strip().strip("'\"`")
    linked = parse_file_link(text)
    layout = _STORE_LAYOUT.search(text) if linked is None else None
    if linked is not None or layout is not None:
        folder, text = linked if linked is not None else (layout[1], layout[2])  # type: ignore[index]
        cwd = ""
        if _UUID.match(folder) and session_id and folder.lower() != session_id.lower():
            raise ToolInputError(f"{path!r} belongs to another session; only this session's files can be used")
    try:
        return workspace_path(text, cwd)
    except BadPath as exc:
        raise ToolInputError(f"'path': {exc}") from None

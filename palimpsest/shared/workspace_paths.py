"""Where a file lives in a session's workspace: a relative POSIX path (`notes.txt`, `src/app.py`),
checked before anything is opened. The SessionStore stores files under these paths and the Agent's
file tools resolve what a model asks for with the same rules, so a path the tools accept is one the
store keeps. Pure functions.

A model's arguments are untrusted (a prompt injection can ask for any path): absolute paths (but the
sandbox's own `/workspace/…`), `..` above the workspace, NUL and control characters, invisible
format characters, Windows device names and over-long names are refused with a reason the model can
act on, never quietly changed.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import PurePosixPath

MAX_COMPONENT_BYTES = 255
MAX_PATH_BYTES = 1024
MAX_DEPTH = 32
# Where run_command sees the workspace: a model that writes that prefix means the same file.
MOUNT = "/workspace"
# The store's own bookkeeping beside the files (digests, uploads under way, the token that changes with
# every change): never a workspace path.
CHANGES_NAME = ".palimpsest-changes"
RESERVED_NAMES = frozenset({".sha256", CHANGES_NAME})
RESERVED_PREFIXES = (".upload-",)
_DEVICES = frozenset({"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10))})
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class BadPath(ValueError):
    """A path the workspace does not take; the message says why, for the model to act on."""


def _invisible(text: str) -> bool:
    """Format characters (zero-width, bidi controls): a name that does not read as what it is."""
    return any(unicodedata.category(c) == "Cf" for c in text)


def workspace_path(raw: str, cwd: str = "", *, allow_root: bool = False) -> str:
    """``raw`` resolved from ``cwd`` (itself a workspace path) as a normalized workspace path,
    e.g. ``workspace_path("../lib/x.py", "src")`` → ``"lib/x.py"``; "" is the workspace itself
    (only with ``allow_root``). Raises BadPath."""
    if not isinstance(raw, str) or not raw.strip():
        raise BadPath("the path is empty: give a path inside the workspace, e.g. 'notes.txt'")
    if "\x00" in raw:
        raise BadPath(f"{raw!r} holds a NUL byte")
    if _CONTROL.search(raw) or _invisible(raw):
        raise BadPath(f"{raw!r} holds control or invisible characters")
    if "\\" in raw:
        raise BadPath(f"{raw!r} uses '\\': workspace paths are written with '/', e.g. 'src/app.py'")
    if raw == MOUNT or raw.startswith(MOUNT + "/"):
        raw, cwd = raw[len(MOUNT) :].lstrip("/") or ".", ""
    elif raw.startswith("/") or re.match(r"[A-Za-z]:", raw):
        raise BadPath(
            f"{raw!r} is absolute: give a path inside the workspace, relative to it "
            f"(e.g. 'src/app.py', or {MOUNT}/src/app.py)"
        )
    parts: list[str] = [p for p in cwd.split("/") if p] if cwd else []
    for part in raw.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise BadPath(f"{raw!r} leads out of the workspace")
            parts.pop()
            continue
        _check_component(part, raw)
        parts.append(part)
    if not parts and not allow_root:
        raise BadPath(f"{raw!r} is the workspace itself, not a file in it")
    if len(parts) > MAX_DEPTH:
        raise BadPath(f"{raw!r} is more than {MAX_DEPTH} folders deep")
    path = "/".join(parts)
    if len(path.encode()) > MAX_PATH_BYTES:
        raise BadPath(f"the path is longer than {MAX_PATH_BYTES} bytes")
    return path


def _check_component(part: str, raw: str) -> None:
    if len(part.encode()) > MAX_COMPONENT_BYTES:
        raise BadPath(f"a name in {raw!r} is longer than {MAX_COMPONENT_BYTES} bytes")
    if part in RESERVED_NAMES or part.startswith(RESERVED_PREFIXES):
        raise BadPath(f"{part!r} is a name the store keeps for itself")
    if part.split(".", 1)[0].rstrip(" ").lower() in _DEVICES:
        raise BadPath(f"{part!r} is a device name on Windows: choose another name")
    if part.endswith((" ", ".")):
        raise BadPath(f"{part!r} ends with a space or a dot")


def is_workspace_path(text: str) -> bool:
    """``text`` is already a normalized workspace path (what the store lists)."""
    try:
        return workspace_path(text) == text
    except BadPath:
        return False


def matches(path: str, pattern: str) -> bool:
    """Glob match of a workspace path: `*` stays in one folder, `**` crosses folders, a pattern
    without a folder part matches the name anywhere (`*.py`)."""
    if "/" not in pattern:
        return PurePosixPath(path).match(pattern)
    return _glob_regex(pattern).fullmatch(path) is not None


def _glob_regex(pattern: str) -> re.Pattern[str]:
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out))

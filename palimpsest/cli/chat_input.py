"""Reading what the user types in `pal chat`: multi-line messages and pasted image paths. Pure functions."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote

FENCE = '"""'
CONTINUATION = "\\"
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp"})

ReadLine = Callable[[str], str]


def read_message(read_line: ReadLine, prompt: str, more: str) -> str | None:
    """One message, or None at end of input.

    A line ending with a backslash continues on the next line; a line starting with three double quotes
    opens a block that runs until a line ending with three double quotes. End of input inside a
    block or continuation sends what was typed so far.
    """
    try:
        first = read_line(prompt)
    except EOFError:
        return None
    if first.lstrip().startswith(FENCE):
        return _read_block(read_line, first.lstrip()[len(FENCE) :], more)
    lines: list[str] = []
    line = first
    while line.endswith(CONTINUATION):
        lines.append(line[: -len(CONTINUATION)])
        try:
            line = read_line(more)
        except EOFError:
            line = ""
            break
    lines.append(line)
    return "\n".join(lines)


def _read_block(read_line: ReadLine, opening: str, more: str) -> str:
    stripped = opening.rstrip()
    if stripped.endswith(FENCE):  # """a one-line block"""
        return stripped[: -len(FENCE)]
    lines = [opening] if opening.strip() else []
    while True:
        try:
            line = read_line(more)
        except EOFError:
            break
        if line.rstrip().endswith(FENCE):
            last = line.rstrip()[: -len(FENCE)]
            if last.strip():
                lines.append(last)
            break
        lines.append(line)
    return "\n".join(lines)


def _tokens(text: str) -> list[str]:
    # Terminals paste dropped files quoted or with escaped spaces; prose with apostrophes is not shell syntax.
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def image_paths_in(text: str) -> list[Path]:
    """Existing image files named in the text (as a terminal pastes a dropped file), in order, once each."""
    found: list[Path] = []
    for token in _tokens(text):
        token = token.strip("'\"")
        if token.startswith("file://"):
            token = unquote(token[len("file://") :])
        path = Path(token).expanduser()
        if path.suffix.lower() in IMAGE_SUFFIXES and path not in found and path.is_file():
            found.append(path)
    return found


def parse_command(text: str) -> tuple[str, str] | None:
    """`/name rest` → ("name", "rest"); None for an ordinary message (also for `//…`, a literal slash)."""
    stripped = text.strip()
    if not stripped.startswith("/") or stripped.startswith("//") or "\n" in stripped:
        return None
    name, _, rest = stripped[1:].partition(" ")
    if not name or "/" in name:  # a path like /tmp/x.png is a message, not a command
        return None
    return name.lower(), rest.strip()

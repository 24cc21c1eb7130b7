"""The file tools: read_file, write_file, edit_file, list_files and grep over the session's workspace
(palimpsest.agent.workspace), addressed by workspace paths resolved from the turn's working directory.

Every path goes through palimpsest.shared.workspace_paths first: what leaves the workspace, names a
device or hides characters is refused with a reason the model can act on. A result that shows a
file's content is as trusted as the file: content the store does not know to be the conversation's
own (an upload, a host file, a networked command's output) taints the conversation when read.
"""

from __future__ import annotations

import asyncio
import difflib
from dataclasses import dataclass
from typing import Any

import regex

from palimpsest.agent.tools.base import Reach, ToolContext, ToolResult
from palimpsest.agent.tools.common import ToolInputError, error, int_arg, text_arg
from palimpsest.agent.workspace import Workspace
from palimpsest.shared.content_types import content_type
from palimpsest.shared.errors import PalimpsestError
from palimpsest.shared.workspace_paths import BadPath, matches, workspace_path

# What one read shows at most: lines, characters of one line, and characters in all (about a
# sixth of an 8k window, where one message's share of the view is cut anyway).
READ_LINES = 2_000
LINE_CHARS = 2_000
READ_MIN_CHARS = 4_000
READ_MAX_CHARS = 60_000
# How much of a file decides that it is binary, and how much a tool reads at all.
SNIFF = 8_192
TEXT_MAX_BYTES = 16 * 1024 * 1024
LIST_MAX = 500
GREP_DEFAULT_MATCHES = 100
GREP_MAX_MATCHES = 500
GREP_LINE_CHARS = 300
# A model's regular expression runs against time: a catastrophic one is stopped, not waited for.
GREP_SECONDS = 2.0


@dataclass(frozen=True)
class Located:
    workspace: Workspace
    path: str


async def _locate(
    args: dict[str, Any], ctx: ToolContext, key: str = "path", *, allow_root: bool = False, default: str | None = None
) -> Located:
    if ctx.workspace is None:
        raise ToolInputError("this run has no session, so it has no workspace")
    raw = text_arg(args, key, required=default is None, default=default or "")
    try:
        path = workspace_path(raw or ".", ctx.cwd, allow_root=allow_root)
    except BadPath as exc:
        raise ToolInputError(f"'{key}': {exc}") from None
    await ctx.workspace.ready(ctx.turn_key)
    return Located(ctx.workspace, path)


def _missing(where: Located, tool: str) -> ToolResult:
    if where.workspace.is_folder(where.path):
        return error(f"{tool}: {where.path} is a folder; list it with list_files")
    close = difflib.get_close_matches(where.path, list(where.workspace.files), n=5, cutoff=0.5)
    hint = (
        f" Did you mean: {', '.join(close)}?"
        if close
        else (" The workspace is empty." if not where.workspace.files else " list_files shows what is there.")
    )
    return error(f"{tool}: there is no file {where.path!r} in the workspace.{hint}")


def _is_binary(head: bytes) -> bool:
    if b"\x00" in head:
        return True
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start < len(head) - 4  # (a multi-byte character cut at the end of the sample is text)
    return False


def read_budget(window: int) -> int:
    """Characters one read shows: about a sixth of the window at ~3 characters a token."""
    return max(READ_MIN_CHARS, min(READ_MAX_CHARS, window // 6 * 3))


def numbered(lines: list[str], first: int) -> str:
    return "\n".join(
        f"{n:>6}\t{line if len(line) <= LINE_CHARS else line[:LINE_CHARS] + ' […line cut]'}"
        for n, line in enumerate(lines, first)
    )


class ReadFileTool:
    name = "read_file"
    reach = Reach.SESSION  # the session's own workspace
    description = (
        "Read a text file of the workspace, with line numbers. Give `offset` (first line, from 1) and "
        "`limit` (lines) for a part of a long file; a long read says where to go on. Images are looked at "
        "with image_view; binary files are described, not shown."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "Path in the workspace, e.g. notes.txt or src/app.py."},
            "offset": {"type": "integer", "description": "First line to read, counted from 1 (default 1)."},
            "limit": {"type": "integer", "description": f"How many lines at most (default {READ_LINES})."},
        },
        "required": ["path"],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            where = await _locate(args, ctx)
            offset = int_arg(args, "offset", default=1, low=1, high=10**9)
            limit = int_arg(args, "limit", default=READ_LINES, low=1, high=READ_LINES)
        except ToolInputError as exc:
            return error(f"read_file: {exc}")
        entry = where.workspace.entry(where.path)
        if entry is None:
            return _missing(where, "read_file")
        head = await asyncio.to_thread(where.workspace.read_bytes, where.path, SNIFF)
        kind = content_type(where.path, head)
        if kind.startswith("image/"):
            return ToolResult(
                content=f"{where.path} is an image ({kind}, {entry.size:,} bytes): look at it with image_view.",
                untrusted=False,
                metadata={"path": where.path},
            )
        if _is_binary(head) or entry.size > TEXT_MAX_BYTES:
            what = "binary" if _is_binary(head) else f"over {TEXT_MAX_BYTES // (1024 * 1024)} MB"
            return ToolResult(
                content=f"{where.path} is {what} ({kind or 'unknown type'}, {entry.size:,} bytes); "
                "its content is not shown. A command can inspect it (file, head, unzip -l).",
                untrusted=False,
                metadata={"path": where.path, "size": entry.size},
            )
        data = await asyncio.to_thread(where.workspace.read_bytes, where.path)
        lines = data.decode("utf-8", errors="replace").splitlines()
        total = len(lines)
        if total and offset > total:
            return error(f"read_file: offset {offset} is past the end: {where.path} has {total} lines")
        budget = read_budget(ctx.window)
        shown: list[str] = []
        used = 0
        for line in lines[offset - 1 : offset - 1 + limit]:
            cost = min(len(line), LINE_CHARS) + 8
            if shown and used + cost > budget:
                break
            shown.append(line)
            used += cost
        last = offset + len(shown) - 1
        text = numbered(shown, offset) if shown else "(empty file)"
        if last < total:
            text += f"\n[lines {offset}–{last} of {total}; the file goes on: read_file with offset={last + 1}]"
        return ToolResult(
            content=text,
            untrusted=entry.outside,
            metadata={"path": where.path, "lines": [offset, last], "total_lines": total},
        )


class WriteFileTool:
    name = "write_file"
    reach = Reach.SESSION  # the session's own workspace
    description = (
        "Write a text file in the workspace, creating its folders as needed and replacing the file if it "
        "exists. For a change to part of a file, edit_file is safer."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "Path in the workspace, e.g. src/app.py."},
            "content": {"type": "string", "description": "The whole content of the file."},
        },
        "required": ["path", "content"],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            where = await _locate(args, ctx)
            content = args.get("content")
            if not isinstance(content, str):
                raise ToolInputError("'content' must be a string")
        except ToolInputError as exc:
            return error(f"write_file: {exc}")
        if where.workspace.is_folder(where.path) and where.path not in where.workspace.files:
            return error(f"write_file: {where.path} is a folder in the workspace; give a file's path")
        existed = where.workspace.entry(where.path) is not None
        data = content.encode()
        try:
            async with where.workspace.lock:
                await where.workspace.write(where.path, data)
        except PalimpsestError as exc:
            return error(f"write_file: {where.path} was not written: {exc}")
        lines = content.count("\n") + (1 if content and not content.endswith("\n") else 0)
        return ToolResult(
            content=f"{'Replaced' if existed else 'Created'} {where.path} ({len(data):,} bytes, {lines} lines).",
            untrusted=False,
            metadata={"path": where.path, "bytes": len(data)},
        )


class EditFileTool:
    name = "edit_file"
    reach = Reach.SESSION  # the session's own workspace
    description = (
        "Replace an exact piece of text in a workspace file. `old_string` must appear exactly once (include "
        "enough surrounding lines to make it unique), or set `replace_all` to change every occurrence."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "Path in the workspace."},
            "old_string": {"type": "string", "description": "The exact text to replace, whitespace included."},
            "new_string": {"type": "string", "description": "What replaces it."},
            "replace_all": {"type": "boolean", "description": "Replace every occurrence (default false)."},
        },
        "required": ["path", "old_string", "new_string"],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            where = await _locate(args, ctx)
            old, new = args.get("old_string"), args.get("new_string")
            if not isinstance(old, str) or not old:
                raise ToolInputError("'old_string' must be the non-empty text to replace")
            if not isinstance(new, str):
                raise ToolInputError("'new_string' must be a string")
            if old == new:
                raise ToolInputError("'old_string' and 'new_string' are the same: nothing would change")
        except ToolInputError as exc:
            return error(f"edit_file: {exc}")
        entry = where.workspace.entry(where.path)
        if entry is None:
            return _missing(where, "edit_file")
        async with where.workspace.lock:
            data = await asyncio.to_thread(where.workspace.read_bytes, where.path)
            if _is_binary(data[:SNIFF]):
                return error(f"edit_file: {where.path} is binary; only text files are edited")
            text = data.decode("utf-8", errors="replace")
            count = text.count(old)
            if count == 0:
                hint = " (it differs in whitespace or line breaks)" if _squeezed(old) in _squeezed(text) else ""
                return error(
                    f"edit_file: the text to replace is not in {where.path}{hint}; read_file shows "
                    "the file as it is now"
                )
            if count > 1 and args.get("replace_all") is not True:
                at = _line_numbers(text, old)
                return error(
                    f"edit_file: the text appears {count} times in {where.path} (lines "
                    f"{', '.join(map(str, at[:10]))}{'…' if len(at) > 10 else ''}): include more "
                    "surrounding text to pick one, or set replace_all"
                )
            updated = text.replace(old, new)
            try:
                await where.workspace.write(where.path, updated.encode())
            except PalimpsestError as exc:
                return error(f"edit_file: {where.path} was not written: {exc}")
        first = _line_numbers(updated, new)[0] if new else _line_numbers(text, old)[0]
        around = updated.splitlines()[max(0, first - 3) : first + new.count("\n") + 2]
        return ToolResult(
            content=f"Edited {where.path}: {count} replacement{'s' if count != 1 else ''}.\n"
            f"{numbered(around, max(1, first - 2))}",
            untrusted=entry.outside,
            metadata={"path": where.path, "replacements": count},
        )


def _squeezed(text: str) -> str:
    return " ".join(text.split())


def _line_numbers(text: str, needle: str) -> list[int]:
    found, start = [], 0
    while (at := text.find(needle, start)) != -1:
        found.append(text.count("\n", 0, at) + 1)
        start = at + max(1, len(needle))
    return found or [1]


class ListFilesTool:
    name = "list_files"
    reach = Reach.SESSION  # the session's own workspace
    description = (
        "List the workspace's files with their sizes. `pattern` is a glob (`*.py` matches anywhere, "
        "`src/**/*.ts` by path); `path` limits it to a folder."
    )
    parameters = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "Glob, e.g. *.py or docs/**/*.md (default: every file)."},
            "path": {"type": "string", "description": "Folder to list (default: the working folder)."},
        },
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            where = await _locate(args, ctx, allow_root=True, default=".")
            pattern = text_arg(args, "pattern", default="")
        except ToolInputError as exc:
            return error(f"list_files: {exc}")
        prefix = f"{where.path}/" if where.path else ""
        found = sorted(
            (path, entry)
            for path, entry in where.workspace.files.items()
            if path.startswith(prefix) and (not pattern or matches(path[len(prefix) :], pattern))
        )
        place = where.path or "the workspace"
        if not found:
            return ToolResult(
                content=f"No files in {place}{f' match {pattern!r}' if pattern else ''}.", untrusted=False
            )
        lines = [
            f"{len(found)} file{'s' if len(found) != 1 else ''} in {place}"
            + (f" matching {pattern!r}" if pattern else "")
            + ":"
        ]
        lines += [f"{path}  ({entry.size:,} bytes)" for path, entry in found[:LIST_MAX]]
        if len(found) > LIST_MAX:
            lines.append(f"[… {len(found) - LIST_MAX} more: narrow it with `pattern` or `path`]")
        return ToolResult(
            content="\n".join(lines),
            untrusted=any(e.outside for _, e in found[:LIST_MAX]),
            metadata={"files": len(found)},
        )


class GrepTool:
    name = "grep"
    reach = Reach.SESSION  # the session's own workspace
    description = (
        "Search the workspace's text files for a regular expression; returns path:line: text for each "
        "match. `glob` limits the files (e.g. *.py), `path` the folder."
    )
    parameters = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "Regular expression (Python syntax)."},
            "path": {"type": "string", "description": "Folder or file to search (default: the working folder)."},
            "glob": {"type": "string", "description": "Only files matching this glob, e.g. *.py."},
            "ignore_case": {"type": "boolean"},
            "max_matches": {"type": "integer", "description": f"At most this many (default {GREP_DEFAULT_MATCHES})."},
        },
        "required": ["pattern"],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            where = await _locate(args, ctx, allow_root=True, default=".")
            raw = text_arg(args, "pattern", required=True)
            glob = text_arg(args, "glob", default="")
            cap = int_arg(args, "max_matches", default=GREP_DEFAULT_MATCHES, low=1, high=GREP_MAX_MATCHES)
            try:
                pattern = regex.compile(raw, regex.IGNORECASE if args.get("ignore_case") is True else 0)
            except regex.error as exc:
                raise ToolInputError(f"'pattern' is not a valid regular expression: {exc}") from None
        except ToolInputError as exc:
            return error(f"grep: {exc}")
        workspace = where.workspace
        prefix = f"{where.path}/" if where.path else ""
        paths = sorted(
            p for p in workspace.files if (p == where.path or p.startswith(prefix)) and (not glob or matches(p, glob))
        )
        try:
            hits, outside, searched = await asyncio.to_thread(_grep, workspace, paths, pattern, cap)
        except TimeoutError:
            return error(f"grep: the expression took longer than {GREP_SECONDS:g} s on one line; simplify it")
        place = where.path or "the workspace"
        if not hits:
            return ToolResult(
                content=f"No match for {raw!r} in {searched} file{'s' if searched != 1 else ''} of {place}.",
                untrusted=False,
            )
        text = "\n".join(hits[:cap])
        if len(hits) > cap:
            text += f"\n[more matches past {cap}: narrow the search, or raise max_matches]"
        return ToolResult(content=text, untrusted=outside, metadata={"matches": min(len(hits), cap)})


# What can match a line alone but not the same line inside its file: anchors and look-arounds.
_LINE_BOUND = regex.compile(r"\\[AZzG]|\(\?|\$|(?<!\[)\^")


def whole_file_filter(pattern: regex.Pattern) -> regex.Pattern | None:
    """The pattern as one search over a whole file that finds something wherever a line of the
    file has a match (it may find more: `\\s` spans lines), so files without one are skipped in a
    single search rather than line by line; None when the pattern could match a line alone."""
    return None if _LINE_BOUND.search(pattern.pattern) else pattern


def _grep(workspace: Workspace, paths: list[str], pattern: regex.Pattern, cap: int) -> tuple[list[str], bool, int]:
    """(match lines, one cap past: to say there are more), whether a matching file is outside
    content, and how many text files were searched."""
    hits: list[str] = []
    outside = False
    searched = 0
    prefilter = whole_file_filter(pattern)
    for path in paths:
        entry = workspace.files[path]
        if entry.size > TEXT_MAX_BYTES:
            continue
        data = workspace.read_bytes(path)
        if _is_binary(data[:SNIFF]):
            continue
        searched += 1
        text = data.decode("utf-8", errors="replace")
        if prefilter is not None and not prefilter.search(text, timeout=GREP_SECONDS):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if pattern.search(line, timeout=GREP_SECONDS):
                shown = line if len(line) <= GREP_LINE_CHARS else line[:GREP_LINE_CHARS] + "…"
                hits.append(f"{path}:{number}: {shown}")
                outside = outside or entry.outside
                if len(hits) > cap:
                    return hits, outside, searched
    return hits, outside, searched


FILE_TOOLS = (ReadFileTool(), WriteFileTool(), EditFileTool(), ListFilesTool(), GrepTool())

"""Breadcrumbs and verbatim chunks of the history compression takes out of the context.

Breadcrumbs are what a later search will be typed with: paths, links, identifiers, tickets,
commands and amounts. They come from the summary's KEYS line and from the dropped text itself,
so the hard-truncate path, which writes no summary, still leaves them.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from google.protobuf.timestamp_pb2 import Timestamp

from palimpsest.compressor.planner import split_turns
from palimpsest.compressor.prefilter import Needs, has_digit, may_match
from palimpsest.v1.common_pb2 import Message

ENTITY_CAP = 40
ENTITY_SCAN_CHARS = 20_000
ENTITY_PIECE_CHARS = 4_000
BREADCRUMB_CAP = 60
# About a screenful: long enough to hold one exchange, short enough to embed and show as a hit.
CHUNK_CHARS = 4_000

_COMMAND_WORDS = (
    "git",
    "make",
    "pip",
    "pip3",
    "npm",
    "npx",
    "yarn",
    "docker",
    "kubectl",
    "python",
    "python3",
    "pytest",
    "uv",
    "cargo",
    "go",
    "helm",
    "terraform",
    "curl",
    "grpcurl",
)
_CMD = "|".join(_COMMAND_WORDS)
_TRAILING_PUNCTUATION = ".,;:!?)]}'\""

# What a piece must hold for a pattern to match in it (see prefilter): a piece that lacks what a
# pattern needs is not scanned by it.
_CASE_HUMP = re.compile(r"[A-Z](?<=[a-z0-9][A-Z])")  # [a-z0-9][A-Z]
_DOTTED_JOIN = re.compile(r"\.(?<=\w\.)[A-Za-z_]")  # \w\.[A-Za-z_]

# Earlier patterns win where matches overlap: a URL is not also a path, a path is not also a
# dotted name, a command is not also a snake_case identifier. A pattern with a ``cmd`` group
# yields that group (the command without its ``$ `` or backticks).
_PATTERNS: tuple[tuple[str, re.Pattern[str], Needs], ...] = (
    ("url", re.compile(r"https?://[^\s<>\"'`]+"), ("://",)),
    ("command", re.compile(r"(?m)^[ \t]*\$ (?P<cmd>[^\n]+)"), ("$ ",)),
    ("command", re.compile(rf"`(?P<cmd>(?:{_CMD}) [^`\n]+)`"), ("`",)),
    ("path", re.compile(r"\b[A-Za-z]:\\[^\s\"'<>|]+"), (":\\",)),
    ("path", re.compile(r"(?<![\w/:.~])(?:~|\.{1,2})?/[\w.\-]+(?:/[\w.\-]+)*/?"), ("/",)),
    ("path", re.compile(r"(?<![\w/])(?:[\w.\-]+/)+[\w\-]+\.[A-Za-z0-9]{1,8}\b"), ("/",)),
    ("ticket", re.compile(r"\b[A-Z][A-Z0-9]+-\d+\b"), ("-",)),
    ("ticket", re.compile(r"(?<![\w&#])#\d+\b"), ("#",)),
    ("amount", re.compile(r"[$€£¥][^\S\n]?\d(?:[\d,]*\d)?(?:\.\d+)?(?:[^\S\n]?(?:k|K|M|bn|B)\b)?"), tuple("$€£¥")),
    ("amount", re.compile(r"\b\d(?:[\d,]*\d)?(?:\.\d+)?%"), ("%",)),
    (
        "amount",
        re.compile(
            r"\b\d(?:[\d,]*\d)?(?:\.\d+)?[^\S\n]?(?:[KMGTP]i?B|kB|bytes|ms|sec|seconds|minutes|hours|days"
            r"|tokens|px|USD|EUR|GBP)\b"
        ),
        has_digit,
    ),
    ("hash", re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,64}\b"), has_digit),
    ("dotted", re.compile(r"\b[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+\b"), _DOTTED_JOIN),
    ("identifier", re.compile(r"\b[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+\b"), _CASE_HUMP),  # CamelCase
    ("identifier", re.compile(r"\b[a-z][a-z0-9]*(?:[A-Z][a-z0-9]*)+\b"), _CASE_HUMP),  # camelCase
    ("identifier", re.compile(r"\b_*[A-Za-z][A-Za-z0-9]*(?:_+[A-Za-z0-9]+)+_*\b"), ("_",)),  # snake_case
)


def _keep_dotted(name: str) -> bool:
    # "e.g" and "i.e" are not names; a real dotted name has a part longer than a letter.
    return any(len(part) > 1 for part in name.split("."))


def _clean(kind: str, entity: str) -> str:
    # A link or path at the end of a sentence must not keep the sentence's full stop or comma.
    if kind in ("url", "path"):
        return entity.strip().rstrip(_TRAILING_PUNCTUATION)
    return entity.strip()


def extract_entities(text: str, cap: int = ENTITY_CAP) -> list[str]:
    """Searchable entities of ``text``, deduplicated, in order of first appearance, at most ``cap``.

    Read a piece (whole lines) at a time, stopping once ``cap`` are found: only the first ones are
    kept, and every pattern over 40,000 characters of dropped history took ~19 ms a compression.
    No pattern matches across a line break, so the pieces find what the whole text would."""
    entities: list[str] = []
    seen: set[str] = set()
    for piece in _line_pieces(text, ENTITY_PIECE_CHARS):
        for value in _entities_in_order(piece):
            if value not in seen:
                seen.add(value)
                entities.append(value)
                if len(entities) >= cap:
                    return entities
    return entities


def _line_pieces(text: str, size: int) -> Iterable[str]:
    """``text`` in pieces of about ``size`` characters, each ending at a line break (or the end)."""
    start = 0
    while start < len(text):
        end = text.find("\n", start + size)
        end = len(text) if end < 0 else end + 1
        yield text[start:end]
        start = end


def _entities_in_order(text: str) -> list[str]:
    """Every entity match of ``text`` (earlier patterns winning overlaps), by position."""
    taken = _Spans()
    found: list[tuple[int, str]] = []
    verdicts: dict[int, bool] = {}  # patterns share a prefilter: each is run once on the text
    for kind, pattern, needs in _PATTERNS:
        if id(needs) not in verdicts:
            verdicts[id(needs)] = may_match(needs, text)
        if not verdicts[id(needs)]:
            continue
        for match in pattern.finditer(text):
            group = "cmd" if "cmd" in pattern.groupindex else 0
            start, end = match.span(group)
            if taken.overlaps(start, end):
                continue
            value = _clean(kind, match.group(group))
            if not value or (kind == "dotted" and not _keep_dotted(value)):
                continue
            # A command claims its whole match (the backticks too), so no part is re-read.
            taken.add(*match.span())
            found.append((start, value))
    found.sort(key=lambda item: item[0])
    return [value for _, value in found]


def entity_source(messages: Sequence[Message]) -> str:
    """The text entities are looked for in: each message's first ENTITY_SCAN_CHARS. A few dozen
    entities are kept of all of them, and a 15 MB tool output scanned whole took minutes."""
    return "\n".join(m.content[:ENTITY_SCAN_CHARS] for m in messages)


class _Spans:
    """The claimed parts of a text as disjoint sorted spans (overlapping claims merged), so an
    overlap check is a binary search, not a scan: a scan made entity extraction quadratic in the
    matches of a long log."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []  # sorted too: the spans are disjoint

    def overlaps(self, start: int, end: int) -> bool:
        i = bisect.bisect_left(self._starts, end)  # spans starting before `end`
        return i > 0 and self._ends[i - 1] > start

    def add(self, start: int, end: int) -> None:
        lo = bisect.bisect_right(self._ends, start)  # the first span ending after `start`
        hi = bisect.bisect_left(self._starts, end)  # past the last span starting before `end`
        if lo < hi:
            start, end = min(start, self._starts[lo]), max(end, self._ends[hi - 1])
        self._starts[lo:hi] = [start]
        self._ends[lo:hi] = [end]


def merge_breadcrumbs(keys: Iterable[str], entities: Iterable[str], cap: int = BREADCRUMB_CAP) -> list[str]:
    """The summary's keys first, then extracted entities; case-insensitive dedupe, ``cap`` at most."""
    merged: list[str] = []
    seen: set[str] = set()
    for item in list(keys) + list(entities):
        value = item.strip()
        folded = value.casefold()
        if not value or folded in seen:
            continue
        seen.add(folded)
        merged.append(value)
        if len(merged) >= cap:
            break
    return merged


@dataclass(frozen=True)
class ChunkData:
    """One verbatim chunk of demoted history, ready for the store's raw-history index."""

    content: str
    content_hash: str  # hex sha256 of content: the store skips a chunk it already holds
    first_seq: int
    last_seq: int
    first_at: Timestamp | None  # the earliest and latest of its messages' created_at, when known
    last_at: Timestamp | None
    breadcrumbs: list[str]


def render_verbatim(message: Message) -> str:
    """A message as ``role: content`` plus its tool calls, nothing cut."""
    role = f"tool ({message.name})" if message.role == "tool" and message.name else message.role
    lines = [f"{role}: {message.content}"]
    for call in message.tool_calls:
        lines.append(f"  tool call {call.name}: {call.arguments_json}")
    if message.images:
        lines.append(f"  [{len(message.images)} image(s)]")
    return "\n".join(lines)


def _stamp_key(message: Message) -> tuple[int, int]:
    return message.created_at.seconds, message.created_at.nanos


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _chunk(parts: list[tuple[str, Message]], breadcrumbs: list[str]) -> ChunkData:
    content = "\n\n".join(text for text, _ in parts)
    messages = [m for _, m in parts]
    # Compared as (seconds, nanos), not converted: a datetime per message was a tenth of a commit.
    stamped = [m for m in messages if m.created_at.seconds or m.created_at.nanos]  # unset or the epoch: unknown
    return ChunkData(
        content=content,
        content_hash=hashlib.sha256(content.encode("utf-8")).hexdigest(),
        first_seq=min(m.seq for m in messages),
        last_seq=max(m.seq for m in messages),
        first_at=min(stamped, key=_stamp_key).created_at if stamped else None,
        last_at=max(stamped, key=_stamp_key).created_at if stamped else None,
        breadcrumbs=list(breadcrumbs),
    )


def chunk_messages(
    messages: Sequence[Message], breadcrumbs: Sequence[str], max_chars: int = CHUNK_CHARS
) -> list[ChunkData]:
    """Demoted messages as verbatim chunks, one turn per chunk, split past ``max_chars``.

    Summaries are skipped: they are not raw history, and the history they stand for was
    indexed when they were written. A single message longer than ``max_chars`` is cut into
    consecutive pieces, so no text is lost.
    """
    crumbs = list(breadcrumbs)
    chunks: list[ChunkData] = []
    for turn in split_turns([m for m in messages if not m.is_summary]):
        current: list[tuple[str, Message]] = []
        size = 0
        for message in turn:
            for piece in _pieces(render_verbatim(message), max_chars):
                if current and size + 2 + len(piece) > max_chars:
                    chunks.append(_chunk(current, crumbs))
                    current, size = [], 0
                size += (2 if current else 0) + len(piece)
                current.append((piece, message))
        if current:
            chunks.append(_chunk(current, crumbs))
    return chunks

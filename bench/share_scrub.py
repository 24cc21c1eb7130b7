"""What scrubbing a share costs: GetShared masks ids and cuts paths in every string of a page (up to
32 MB), so its time per MB is the price a share holder's read adds. Pure CPU; no database."""

from __future__ import annotations

import random
import time
import uuid
from pathlib import Path

from bench._common import table
from palimpsest.store.shared_view import shared_message
from palimpsest.v1 import common_pb2

NEEDS_POSTGRES = False
MB = 1 << 20
SESSION = str(uuid.UUID(int=7))


def prose(size: int) -> str:
    """The README, repeated: words, code, URLs and a path now and then."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    return (text * (size // len(text) + 1))[:size]


def dense(size: int) -> str:
    """Every few words an id, a path, a digest or a URL: a tool log at its worst."""
    rng = random.Random(3)
    words = [
        "ok",
        "/var/log/app/server.log",
        SESSION,
        str(uuid.UUID(int=8)),
        "ab" * 32,
        "https://x.example/a/b",
        "retry",
        '{"status": 200}',
    ]
    out, length = [], 0
    while length < size:
        word = rng.choice(words)
        out.append(word)
        length += len(word) + 1
    return " ".join(out)[:size]


def ms_per_mb(text: str, messages: int) -> float:
    """Scrub ``text`` cut into ``messages`` tool results (as GetShared does a page), ms per MB."""
    step = len(text) // messages
    page = [common_pb2.Message(role="tool", name="run", content=text[i : i + step]) for i in range(0, len(text), step)]
    started = time.perf_counter()
    for message in page:
        shared_message(message, SESSION)
    return (time.perf_counter() - started) * 1e3 / (len(text) / MB)


async def run(args) -> str:
    size = 2 * MB if args.quick else 16 * MB
    rows = [
        [kind, f"{size // MB}", f"{ms_per_mb(make(size), 500):.0f}"]
        for kind, make in (("prose (the README)", prose), ("dense: an id, a path or a URL every few words", dense))
    ]
    return table(["text", "MB", "ms per MB"], rows) + (
        "\n\nOne page of 500 messages scrubbed as `GetShared` does (ids masked, paths cut, in every string)."
    )

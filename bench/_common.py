"""Helpers shared by the benchmarks: the database server, a fresh database per run, a SessionStore
on port 0, percentiles, markdown tables, machine facts and realistic chat text."""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import random
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import grpc

from palimpsest.v1 import session_store_pb2, session_store_pb2_grpc

BENCH_DATA_DIR_ROOT = Path("/var/lib/palimpsest-bench")


# -- the database server ---------------------------------------------------------------------
def default_data_dir() -> Path:
    """As root the embedded server runs as its own user (`palimpsest-pg`, see PALIMPSEST_DATA_DIR in the
    README) and needs a folder made for it, never a home whose permissions it would have to widen."""
    if os.name == "posix" and os.geteuid() == 0:
        return BENCH_DATA_DIR_ROOT
    import platformdirs

    return Path(platformdirs.user_data_dir("palimpsest")).with_name("palimpsest-bench")


@dataclass
class Server:
    url: str  # the server's maintenance database; benchmarks make their own databases on it
    embedded: object | None = None  # the EmbeddedPostgres we started, stopped at the end
    description: str = ""
    keep_databases: bool = False  # leave each benchmark's database behind, for EXPLAIN ANALYZE afterwards

    def stop(self) -> None:
        if self.embedded is not None:
            self.embedded.stop()


def start_server(database_url: str | None, data_dir: Path | None, keep: bool) -> Server:
    if database_url:
        return Server(url=database_url, description=f"given server {redact_url(database_url)}")
    from palimpsest.shared.embedded_pg import EmbeddedPostgres

    embedded = EmbeddedPostgres(Path(data_dir or default_data_dir()))
    already_running = embedded.pgdata.exists() and embedded.running_port() is not None
    url = embedded.start()
    started_here = not already_running and not keep
    return Server(
        url=url,
        embedded=embedded if started_here else None,
        description=f"embedded PostgreSQL, data {embedded.pgdata}",
    )


def redact_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        parts = parts._replace(netloc=netloc)
    return urlunsplit(parts)


def with_database(url: str, database: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{database}"))


@asynccontextmanager
async def fresh_database(server: Server, label: str) -> AsyncIterator[str]:
    """CREATE DATABASE bench_<label>_<random> on the server, yield its URL, drop it afterwards."""
    name = f"bench_{re.sub(r'[^a-z0-9_]', '_', label.lower())}_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(server.url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = with_database(server.url, name)
    try:
        yield url
    finally:
        if server.keep_databases:
            logging.getLogger("bench").warning("kept database %s", redact_url(url))
        else:
            admin = await asyncpg.connect(server.url)
            try:
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            finally:
                await admin.close()


@asynccontextmanager
async def running_store(dsn: str, **overrides) -> AsyncIterator[tuple[object, session_store_pb2_grpc.SessionStoreStub]]:
    """A real SessionStore on a loopback port 0 against `dsn`, and a stub on a real channel.
    Memory search is lexical unless `embed_model` is given: whatever answers on Ollama's default
    port must not make a benchmark's numbers (store_memory measures the semantic tier itself)."""
    from palimpsest.shared.settings import Settings
    from palimpsest.store.app import start_store

    with tempfile.TemporaryDirectory(prefix="palimpsest-bench-files-") as files_root:
        settings = replace(
            Settings(),
            database_url=dsn,
            files_root=Path(files_root),
            file_sweep_interval_s=3600,
            **({"embed_model": ""} | overrides),
        )
        running = await start_store(settings, port=0, dsn=dsn)
        try:
            async with grpc.aio.insecure_channel(running.address) as channel:
                yield running, session_store_pb2_grpc.SessionStoreStub(channel)
        finally:
            await running.stop(0)


async def checkpoint(conn: asyncpg.Connection) -> None:
    """Flush dirty pages so one measured block does not pay for the writes of the one before."""
    try:
        await conn.execute("CHECKPOINT")
    except asyncpg.PostgresError:  # not a superuser: measure anyway
        pass


# -- numbers and tables ----------------------------------------------------------------------
def percentile(values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile (p in 0..100), as numpy's default."""
    data = sorted(values)
    if not data:
        return float("nan")
    k = (len(data) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (k - lo)


def p50(values: Sequence[float]) -> float:
    return statistics.median(values)


def ms(seconds: float) -> str:
    value = seconds * 1000
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def human_bytes(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(cells[0], widths)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    for row in cells[1:]:  # numbers right-aligned, text left-aligned
        lines.append(
            "| " + " | ".join(c.rjust(w) if c[:1].isdigit() else c.ljust(w) for c, w in zip(row, widths)) + " |"
        )
    return "\n".join(lines)


def load_average() -> str:
    try:
        return "{:.1f} / {:.1f} / {:.1f}".format(*os.getloadavg())
    except OSError:
        return "unknown"


async def machine_summary(server: Server) -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem_kb = int(
            next(
                line.split()[1]
                for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")
            )
        )
        memory = f"{mem_kb / 1024 / 1024:.1f} GiB RAM"
    except (OSError, StopIteration, ValueError):
        memory = "RAM unknown"
    conn = await asyncpg.connect(server.url)
    try:
        version = await conn.fetchval("SHOW server_version")
        settings = {
            r["name"]: r["setting"] + (r["unit"] or "")
            for r in await conn.fetch(
                "SELECT name, setting, unit FROM pg_settings WHERE name = ANY($1::text[])",
                ["shared_buffers", "max_parallel_workers_per_gather", "synchronous_commit"],
            )
        }
    finally:
        await conn.close()
    shared = settings.get("shared_buffers", "?")
    if shared.endswith("8kB") and shared[:-3].isdigit():
        shared = f"{int(shared[:-3]) * 8 // 1024} MB"
    return "\n".join(
        [
            (
                f"- machine: {os.cpu_count()} cores{f' ({model})' if model else ''}, {memory}, "
                f"{platform.system()} {platform.release()}, Python {platform.python_version()}; "
                f"load average {load_average()} at start (other work on the machine skews the numbers)"
            ),
            (
                f"- PostgreSQL {version} ({server.description}); shared_buffers {shared}, "
                f"max_parallel_workers_per_gather {settings.get('max_parallel_workers_per_gather', '?')}, "
                f"synchronous_commit {settings.get('synchronous_commit', '?')}"
            ),
        ]
    )


# -- realistic chat text ---------------------------------------------------------------------
_COMPONENTS = [
    "build server",
    "login page",
    "export job",
    "payment form",
    "search index",
    "upload endpoint",
    "nightly backup",
    "report generator",
    "mobile app",
    "billing service",
    "staging cluster",
    "data pipeline",
    "email worker",
    "config loader",
    "checkout flow",
    "image resizer",
    "auth middleware",
    "cache layer",
    "test suite",
    "deployment script",
    "dashboard",
    "migration script",
    "queue consumer",
    "spreadsheet macro",
    "cron job",
]
_FAILURES = [
    "times out",
    "returns an empty response",
    "crashes with a stack trace",
    "hangs for minutes",
    "uses far too much memory",
    "silently drops rows",
    "logs a permission error",
    "gets slower every day",
    "fails only on the first run",
    "produces duplicated entries",
    "rejects valid input",
    "leaks file handles",
]
_ACTIONS = [
    "restart the container",
    "change the timeout",
    "upgrade the library",
    "rotate the credentials",
    "switch to the new branch",
    "clear the cache",
    "increase the batch size",
    "rerun the migration",
    "turn on verbose logging",
    "pin the dependency",
    "move the job to another machine",
    "split the file",
]
_CAUSES = [
    "holds a connection open longer than the pool allows",
    "reads the whole file into memory before parsing it",
    "retries without any backoff",
    "runs before the previous step has finished writing",
    "compares timestamps in two different time zones",
    "caches a stale value after the settings change",
    "opens a new client for every request",
    "sorts the rows in Python instead of in the database",
    "swallows the original exception and raises a generic one",
    "depends on the order of a dictionary",
]
_FIXES = [
    "add an explicit timeout to the outbound call",
    "stream the input in chunks",
    "add exponential backoff",
    "wait for the previous step with a lock",
    "normalize every timestamp to UTC at the boundary",
    "invalidate the cache when the settings change",
    "reuse a single client for the whole process",
    "push the sort into the query",
    "keep the original exception as the cause",
    "make the ordering explicit",
]
_CHECKS = [
    "the error disappears from the logs",
    "the memory graph stays flat",
    "the job finishes within a minute",
    "the row counts match on both sides",
    "the retry counter stops climbing",
    "the latency drops back",
]
_USER_TEMPLATES = [
    "Can you help me figure out why the {c} {f} after I {a}?",
    "I tried to {a} but the {c} still {f}.",
    "Since yesterday the {c} {f}, and nobody on the team changed anything.",
    "Here is the part of the log that looks suspicious: the {c} {f} right after we {a}.",
    "Is there a quick way to check whether the {c} {cause}?",
    "What would you change first: {fix}, or {fix2}?",
    "We have a deadline on Friday, so I would prefer a small change over a rewrite.",
    "The {c} worked fine last week, before we decided to {a}.",
    "Could this be related to the fact that we {a} every night?",
    "I am not sure I understand the second step, can you explain it with an example?",
    "Thanks, that helped. One more thing: the {c} {f} when two users do it at the same time.",
    "Would it be safer to {a} first and only then look at the {c}?",
]
_ASSISTANT_TEMPLATES = [
    "The most likely cause is that the {c} {cause}.",
    "I would start by trying to {fix}, then check that {check}.",
    "If that does not help, the next suspect is the {c2}, which {cause2}.",
    "A quick way to confirm it is to {a} on a copy of the data and watch whether {check}.",
    "You do not need a rewrite for this: it is usually enough to {fix}.",
    "Keep in mind that the {c} {f} only under load, so test it with realistic traffic.",
    "Here is a small plan. First, {fix}. Second, {fix2}. Finally, verify that {check}.",
    "This pattern is common when a service {cause}; the symptom is exactly that it {f}.",
    "Once the change is deployed, leave verbose logging on for a day so that you can see whether {check}.",
    "To answer your question directly: yes, it is safer to {a} first, as long as you keep a backup.",
    "The second step means that the {c} should {fix}, instead of doing it on every request.",
    "When two users hit the {c} at the same time, it {cause}, which is why it {f}.",
]


class Chatter:
    """Deterministic, realistic-looking user/assistant messages of a requested length."""

    def __init__(self, seed: int, pool: int = 4000):
        self.rng = random.Random(seed)
        self.user = [self._fill(self.rng.choice(_USER_TEMPLATES)) for _ in range(pool)]
        self.assistant = [self._fill(self.rng.choice(_ASSISTANT_TEMPLATES)) for _ in range(pool)]

    def _fill(self, template: str) -> str:
        r = self.rng
        return template.format(
            c=r.choice(_COMPONENTS),
            c2=r.choice(_COMPONENTS),
            f=r.choice(_FAILURES),
            a=r.choice(_ACTIONS),
            cause=r.choice(_CAUSES),
            cause2=r.choice(_CAUSES),
            fix=r.choice(_FIXES),
            fix2=r.choice(_FIXES),
            check=r.choice(_CHECKS),
        )

    def message(self, role: str, min_chars: int, max_chars: int, extra: Sequence[str] = ()) -> str:
        """Whole sentences up to a random length in [min_chars, max_chars]; `extra` sentences mixed in."""
        sentences = self.user if role == "user" else self.assistant
        target = self.rng.randint(min_chars, max_chars)
        parts: list[str] = []
        length = sum(len(e) + 1 for e in extra)
        while length < target:
            s = sentences[self.rng.randrange(len(sentences))]
            if parts and length + len(s) + 1 > max_chars:
                break
            parts.append(s)
            length += len(s) + 1
        for e in extra:
            parts.insert(self.rng.randint(0, len(parts)), e)
        return " ".join(parts)

    def turn(self, min_chars: int = 300, max_chars: int = 800) -> tuple[str, str]:
        return self.message("user", min_chars, max_chars), self.message("assistant", min_chars, max_chars)


async def gather_limited(coros, limit: int):
    sem = asyncio.Semaphore(limit)

    async def one(c):
        async with sem:
            return await c

    return await asyncio.gather(*(one(c) for c in coros))


@asynccontextmanager
async def processes(specs: list[tuple[str, dict[str, str]]]):
    """Start services as their own processes (so two replicas really use two cores)."""
    procs = []
    try:
        for module, env in specs:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", module],
                    env={**os.environ, **env},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        yield procs
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


async def wait_ready(address: str) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for _ in range(300):
            try:
                if (await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)).status == 1:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{address} did not become ready")


def evaluated_tokens(bodies: list[dict]) -> list[int]:
    """The prompt tokens Ollama evaluates for each chat request in order: its prompt less the
    longest run of leading messages (with the same tools) it shares with the request before,
    which Ollama keeps evaluated (its prefix cache holds one conversation per slot)."""
    from ollama_sim.prompt import count_prompt_tokens

    evaluated = []
    previous: tuple[list, object] = ([], None)
    for body in bodies:
        messages, tools = body.get("messages") or [], body.get("tools")
        shared = 0
        if tools == previous[1]:
            while shared < min(len(messages), len(previous[0])) and messages[shared] == previous[0][shared]:
                shared += 1
        reused = count_prompt_tokens(messages[:shared], tools) if shared else 0
        evaluated.append(max(0, count_prompt_tokens(messages, tools) - reused))
        previous = (messages, tools)
    return evaluated


async def compressions(store, session_id: str) -> tuple[dict[str, int], list[int]]:
    """(compressions by method, the turn each one the window called for ran in), from the markers
    in the display history."""
    session = (
        await store.GetSession(
            session_store_pb2.GetSessionRequest(session_id=session_id, view=session_store_pb2.SESSION_VIEW_DISPLAY)
        )
    ).session
    methods: dict[str, int] = {}
    turns: list[int] = []
    turn = 0
    for m in session.messages:
        found = re.match(r"turn (\d+):", m.content) if m.role == "user" else None
        if found:
            turn = int(found.group(1))
        if m.is_compression:
            method = m.metadata["method"] if "method" in m.metadata else "?"
            # A turn's results pruned as it ended: not for a full window, no LLM call, and the next
            # prompt changes only from that turn on; counted apart, never a re-fire.
            at_end = "reason" in m.metadata and m.metadata["reason"] == "turnend"
            method = "prune at turn end" if at_end else method
            methods[method] = methods.get(method, 0) + 1
            if not at_end:
                turns.append(turn)
            if os.environ.get("COMPACTION_TRACE"):  # each compression, to see what drives them
                meta = {k: m.metadata[k] for k in ("reason", "tokens_before", "tokens_after") if k in m.metadata}
                logging.getLogger("bench.compaction").warning("turn %d: %s %s", turn, method, meta)
    return methods, turns


def refires(turns: list[int]) -> int:
    return sum(1 for a, b in zip(turns, turns[1:]) if b - a <= 3)

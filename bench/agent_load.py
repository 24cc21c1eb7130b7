"""What readers cost the Agent and the users beside them, with the three services as processes and
auth on (two users):

- slow readers: 10 clients each start a turn with a long answer and never read their stream; the
  Agent's resident memory before, at its peak while the turns run, and once they have ended (each
  answer stored whole), at two sizes of PALIMPSEST_STREAM_KEEP_MB;
- many watchers: Bob's turn quiet, then beside Alice, who runs turns in two of her sessions and
  attempts 1,500 WatchSession streams on her ten (over the caps, most are refused).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc

from bench import _common
from ollama_sim import OllamaSimulator, Reply
from palimpsest.shared.auth import make_token
from palimpsest.shared.ports import free_port
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import agent_pb2_grpc, session_store_pb2_grpc
from palimpsest.v1 import session_store_pb2 as store_pb
from tests.helpers.fault_services import Service

NEEDS_POSTGRES = True
SECRET = "bench-agent-load-secret-0123456789abcdef"
PROFILES = {
    "profiles": [
        {
            "id": "bench",
            "model": "qwen3.6",
            "context_window": 8192,
            "think_enabled": False,
            "memory_recall_enabled": False,
        }
    ]
}
SLOW_READERS = 10
WATCHERS = 1_500
WATCHED_SESSIONS = 10  # user A's sessions, its watchers spread over them
NEIGHBOUR_TURNS, QUICK_NEIGHBOUR_TURNS = 12, 4


def credentials(user: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {make_token(user, SECRET)}"),)


def responder(body) -> Reply:
    """`long N`: N words at once; anything else: a short answer streamed at a model's pace."""
    users = [m.get("content", "") for m in body.get("messages") or [] if m.get("role") == "user"]
    prompt = users[-1] if users else ""
    if prompt.startswith("long "):
        return Reply(text=" ".join(f"w{i}" for i in range(int(prompt.split()[1]))))
    return Reply(text=" ".join(f"word{i}" for i in range(20)), chunk_delay=0.01)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@asynccontextmanager
async def services(server, label: str, logs: Path, env: dict[str, str] | None = None):
    """Store, Compressor and Agent as processes (auth on), the simulator in this process; yields the
    simulator, the Agent's process and stubs on the Agent and the store."""
    with OllamaSimulator() as sim, tempfile.TemporaryDirectory() as tmp:
        sim.set_responder(responder)
        profiles = Path(tmp) / "profiles.json"
        profiles.write_text(json.dumps(PROFILES))
        async with _common.fresh_database(server, label) as dsn:
            ports = {name: free_port() for name in ("store", "compressor", "agent")}
            common = {
                **os.environ,
                "DATABASE_URL": dsn,
                "OLLAMA_HOST": sim.url,
                "PALIMPSEST_PROFILES": str(profiles),
                "PALIMPSEST_DATA_DIR": tmp,
                "PALIMPSEST_FILES_ROOT": str(Path(tmp) / "files"),
                "PALIMPSEST_AUTH_ENABLED": "1",
                "PALIMPSEST_JWT_SECRET": SECRET,
                "PALIMPSEST_SESSION_TITLES": "0",
                "PALIMPSEST_EMBED_MODEL": "",
                **{f"PALIMPSEST_{name.upper()}_ADDR": f"127.0.0.1:{port}" for name, port in ports.items()},
                **(env or {}),
            }
            running = [
                Service(module, ports[name], common, logs / f"{label}-{name}.log")
                for name, module in (
                    ("store", "palimpsest.store"),
                    ("compressor", "palimpsest.compressor"),
                    ("agent", "palimpsest.agent"),
                )
            ]
            try:
                for service in running:
                    await service.start()
                async with (
                    grpc.aio.insecure_channel(running[2].address) as agent,
                    grpc.aio.insecure_channel(running[0].address) as store,
                ):
                    yield (
                        sim,
                        running[2],
                        agent_pb2_grpc.AgentStub(agent),
                        session_store_pb2_grpc.SessionStoreStub(store),
                    )
            finally:
                for service in reversed(running):
                    service.stop_now()


async def turn(agent, user: str, text: str, session_id: str = "") -> tuple[str, float]:
    """A turn read to its end: (its session, seconds from the request to stream_end)."""
    started = time.perf_counter()
    session = session_id
    async for event in agent.RunStream(
        pb.RunStreamRequest(session_id=session_id, profile_id="bench", text=text),
        metadata=credentials(user),
        timeout=120,
    ):
        session = session or event.session_id
    return session, time.perf_counter() - started


async def answered(store, user: str, session_id: str, words: int) -> bool:
    messages = (
        await store.GetSession(
            store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_DISPLAY),
            metadata=credentials(user),
        )
    ).session.messages
    return bool(messages) and messages[-1].role == "assistant" and len(messages[-1].content.split()) == words


async def slow_readers(server, logs: Path, words: int, keep_mb: int) -> list[object]:
    async with services(server, "agent_slow_readers", logs, {"PALIMPSEST_STREAM_KEEP_MB": str(keep_mb)}) as (
        sim,
        agent_process,
        agent,
        store,
    ):
        await turn(agent, "alice", "warm up")
        before = rss_mb(agent_process.proc.pid)
        peak = before
        sessions = [
            (
                await store.CreateSession(
                    store_pb.CreateSessionRequest(profile_id="bench"), metadata=credentials("alice")
                )
            ).session.id
            for _ in range(SLOW_READERS)
        ]
        calls = [
            agent.RunStream(
                pb.RunStreamRequest(session_id=s, profile_id="bench", text=f"long {words}"),
                metadata=credentials("alice"),
            )
            for s in sessions
        ]  # never read
        started = time.perf_counter()
        while not all([await answered(store, "alice", s, words) for s in sessions]):
            peak = max(peak, rss_mb(agent_process.proc.pid))
            if time.perf_counter() - started > 600:
                raise RuntimeError("the slow readers' turns did not end within 10 minutes")
            await asyncio.sleep(0.2)  # a sample of the Agent's memory
        ended = rss_mb(agent_process.proc.pid)
        for call in calls:
            call.cancel()
        return [
            SLOW_READERS,
            f"{words:,}",
            keep_mb,
            f"{before:.0f}",
            f"{peak:.0f}",
            f"{ended:.0f}",
            f"{time.perf_counter() - started:.0f}",
        ]


@asynccontextmanager
async def busy(agent, user: str, session_ids: list[str]):
    """The user's sessions each running turns back to back while the block runs."""
    running = True

    async def turns(session_id: str) -> None:
        while running:
            await turn(agent, user, "hello", session_id)

    tasks = [asyncio.create_task(turns(s)) for s in session_ids]
    try:
        yield
    finally:
        running = False
        await asyncio.gather(*tasks)


@dataclass
class Watchers:
    calls: list[grpc.aio.UnaryStreamCall]
    refused: int = 0  # RESOURCE_EXHAUSTED
    seconds: float = 0.0  # until each was in place or refused

    @property
    def open(self) -> int:
        return sum(not call.done() for call in self.calls)


@asynccontextmanager
async def watchers(address: str, user: str, session_ids: list[str], count: int):
    """``count`` WatchSession streams attempted at once over the user's sessions, each read as its
    events come, until the block ends."""
    channels = [grpc.aio.insecure_channel(address) for _ in range(10)]
    stubs = [agent_pb2_grpc.AgentStub(c) for c in channels]
    calls: list[grpc.aio.UnaryStreamCall] = []
    seen = Watchers(calls)
    settled = asyncio.Semaphore(0)

    async def watch(i: int) -> None:
        call = stubs[i % len(stubs)].WatchSession(
            pb.WatchSessionRequest(session_id=session_ids[i % len(session_ids)]), metadata=credentials(user)
        )
        calls.append(call)
        await call.initial_metadata()  # in place, or refused
        settled.release()
        try:
            async for _ in call:
                pass
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                seen.refused += 1
        except asyncio.CancelledError:
            pass

    started = time.perf_counter()
    readers = [asyncio.create_task(watch(i)) for i in range(count)]
    try:
        for _ in range(count):
            await settled.acquire()
        seen.seconds = time.perf_counter() - started
        yield seen
    finally:
        for call in calls:
            call.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        for channel in channels:
            await channel.close()


async def neighbour(server, logs: Path, turns: int) -> list[list[object]]:
    """Bob's turn (p50 of ``turns``), quiet and beside Alice's load; Alice's sessions stay hers."""
    async with services(server, "agent_watchers", logs) as (sim, agent_process, agent, store):
        await turn(agent, "bob", "warm up")
        sessions = [
            (
                await store.CreateSession(
                    store_pb.CreateSessionRequest(profile_id="bench"), metadata=credentials("alice")
                )
            ).session.id
            for _ in range(WATCHED_SESSIONS)
        ]

        async def bob() -> float:
            return statistics.median([(await turn(agent, "bob", "hello"))[1] for _ in range(turns)])

        quiet = await bob()
        async with busy(agent, "alice", sessions[:2]):
            alice_busy = await bob()
        async with watchers(agent_process.address, "alice", sessions, WATCHERS) as attempt:
            watched = await bob()
            async with busy(agent, "alice", sessions[:2]):
                watched_busy = await bob()
            opened, refused = attempt.open, attempt.refused  # (the refusals long answered by now)
        quiet = (quiet + await bob()) / 2  # before and after, against drift on a shared machine
        tracebacks = agent_process.log.read_text(errors="replace").count("Traceback")
    return [
        ["quiet", f"{quiet * 1000:.0f}", "1.00", "", "", ""],
        ["her 2 sessions busy", f"{alice_busy * 1000:.0f}", f"{alice_busy / quiet:.2f}", "", "", ""],
        [
            f"attempts {WATCHERS:,} watchers",
            f"{watched * 1000:.0f}",
            f"{watched / quiet:.2f}",
            f"{opened:,}",
            f"{refused:,}",
            f"{attempt.seconds:.1f}",
        ],
        [
            f"attempts {WATCHERS:,} watchers, her 2 sessions busy",
            f"{watched_busy * 1000:.0f}",
            f"{watched_busy / quiet:.2f}",
            "",
            "",
            "",
        ],
        [f"tracebacks in the Agent's log after they left: {tracebacks}", "", "", "", "", ""],
    ]


async def run(args) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp)
        runs = [(20_000, 64)] if args.quick else [(20_000, 64), (100_000, 64), (100_000, 16)]
        memory = [await slow_readers(args.server, logs, words, keep_mb) for words, keep_mb in runs]
        watchers = await neighbour(args.server, logs, QUICK_NEIGHBOUR_TURNS if args.quick else NEIGHBOUR_TURNS)
    return "\n\n".join(
        [
            "### Slow readers: the Agent's resident memory (MB)",
            _common.table(
                [
                    "clients not reading",
                    "words per answer",
                    "PALIMPSEST_STREAM_KEEP_MB",
                    "before",
                    "peak",
                    "after the turns",
                    "seconds",
                ],
                memory,
            ),
            f"### Bob's turn while Alice attempts {WATCHERS:,} WatchSession streams on her {WATCHED_SESSIONS} sessions",
            _common.table(
                [
                    "Alice",
                    "Bob's turn, p50 (ms)",
                    "against quiet",
                    "watchers open",
                    "refused",
                    "seconds until each was open or refused",
                ],
                watchers,
            ),
        ]
    )

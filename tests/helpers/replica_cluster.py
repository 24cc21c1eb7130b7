"""Two replicas of each service as real processes on one PostgreSQL, with clients balanced across
them and replicas killed under load: what the replica test (tests/system/test_replicas.py) and its bench
(`python -m bench replicas`, the full minute) share.

What is checked, from what the clients saw and what the store holds:
- lost replies: turns whose client saw `stream_end` COMPLETED whose answer is not stored exactly once;
- overlapping turns: a session whose stored messages interleave two turns (a turn's user message,
  then another turn's message, then the first turn's answer) — what two turns at once on one
  session leave behind, since each turn writes its user message first and its answer last;
- Stop from either Agent: a turn running on one Agent stopped by a Stop sent to the other.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from palimpsest.shared.ports import free_port
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import agent_pb2_grpc, session_store_pb2_grpc
from palimpsest.v1 import session_store_pb2 as store_pb
from tests.helpers.fault_services import PROMPT, Service, answer_to, prompt_for

END = pb.StreamEndReason
TURN_DEADLINE_S = 45.0  # no stream may take longer, whatever is killed: a hang fails the run
CLAIM_TTL_S = 3  # a killed Agent's claims run out this soon (30 s in production)


@dataclass
class Cluster:
    stores: list[Service]
    compressors: list[Service]
    agents: list[Service]

    def kinds(self) -> dict[str, list[Service]]:
        return {"SessionStore": self.stores, "Compressor": self.compressors, "Agent": self.agents}

    def all(self) -> list[Service]:
        return [*self.stores, *self.compressors, *self.agents]

    @staticmethod
    def targets(services: list[Service]) -> str:
        """A comma list of replicas: the channel balances round-robin over them."""
        return ",".join(s.address for s in services)

    async def start(self) -> None:
        await asyncio.gather(*(s.start() for s in self.stores))
        await asyncio.gather(*(s.start() for s in [*self.compressors, *self.agents]))

    def stop_now(self) -> None:
        for service in reversed(self.all()):
            service.stop_now()


def cluster(
    database_url: str,
    ollama_url: str,
    profiles: str,
    data_dir: Path,
    logs: Path,
    replicas: int = 2,
    replica_events: bool = True,
) -> Cluster:
    ports = {kind: [free_port() for _ in range(replicas)] for kind in ("store", "compressor", "agent")}
    stores = ",".join(f"127.0.0.1:{p}" for p in ports["store"])
    compressors = ",".join(f"127.0.0.1:{p}" for p in ports["compressor"])
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "DATABASE_URL": database_url,
        "OLLAMA_HOST": ollama_url,
        "PALIMPSEST_PROFILES": profiles,
        "PALIMPSEST_DATA_DIR": str(data_dir),  # the tokenizer cache
        "PALIMPSEST_FILES_ROOT": str(logs / "files"),  # one folder for both stores, as one shared volume
        "PALIMPSEST_SHARE_KEY": "replica-test-share-key-0123456789abcdef",  # the same on every store
        "PALIMPSEST_STORE_ADDR": stores,
        "PALIMPSEST_COMPRESSOR_ADDR": compressors,
        "PALIMPSEST_TURN_CLAIMS": "true",
        "PALIMPSEST_TURN_CLAIM_TTL_SECONDS": str(CLAIM_TTL_S),
        "PALIMPSEST_REPLICA_EVENTS": str(replica_events).lower(),
        "PALIMPSEST_RPC_TIMEOUT_SECONDS": "5",
        "PALIMPSEST_REPLY_WRITE_DEADLINE_SECONDS": "30",
        "PALIMPSEST_GRACE_SECONDS": "2",
    }
    env.pop("PALIMPSEST_AUTH_ENABLED", None)

    def service(kind: str, module: str, i: int, own: dict[str, str]) -> Service:
        return Service(module, ports[kind][i], {**env, **own}, logs / f"{kind}{i}.log")

    return Cluster(
        stores=[
            service("store", "palimpsest.store", i, {"PALIMPSEST_STORE_ADDR": f"127.0.0.1:{p}"})
            for i, p in enumerate(ports["store"])
        ],
        compressors=[
            service("compressor", "palimpsest.compressor", i, {"PALIMPSEST_COMPRESSOR_LISTEN": f"127.0.0.1:{p}"})
            for i, p in enumerate(ports["compressor"])
        ],
        agents=[
            service("agent", "palimpsest.agent", i, {"PALIMPSEST_AGENT_ADDR": f"127.0.0.1:{p}"})
            for i, p in enumerate(ports["agent"])
        ],
    )


async def kill_and_restart(service: Service, down_until) -> None:
    """SIGKILL, then (once ``down_until()`` returns) start it again where it was."""
    await service.signal(signal.SIGKILL)
    await down_until()
    await service.start()


# -- the load --------------------------------------------------------------------------------
@dataclass
class Turn:
    session_id: str
    prompt: str
    end: pb.StreamEnd | None = None
    broken: str = ""  # the stream failed (its Agent killed): no stream_end came
    seconds: float = 0.0  # from the request to the stream's end (for the bench, never asserted)

    @property
    def completed(self) -> bool:
        return self.end is not None and self.end.reason == END.STREAM_END_REASON_COMPLETED


@dataclass
class Load:
    """Sessions each running one turn after another through ``agent`` (a balanced stub) until stopped."""

    agent: agent_pb2_grpc.AgentStub
    session_ids: list[str]
    words: int = 6
    turns: list[Turn] = field(default_factory=list)
    _running: bool = True
    _tags: itertools.count = field(default_factory=itertools.count)
    _progress: asyncio.Condition = field(default_factory=asyncio.Condition)
    _tasks: list[asyncio.Task] = field(default_factory=list)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._session(i, s)) for i, s in enumerate(self.session_ids)]

    @property
    def completed(self) -> int:
        return sum(t.completed for t in self.turns)

    async def until_completed(self, count: int, timeout: float = 120.0) -> None:
        """Wait until ``count`` turns have completed in all."""
        async with self._progress:
            await asyncio.wait_for(self._progress.wait_for(lambda: self.completed >= count), timeout)

    async def more(self, count: int) -> None:
        await self.until_completed(self.completed + count)

    async def stop(self) -> list[Turn]:
        self._running = False
        await asyncio.wait_for(asyncio.gather(*self._tasks), TURN_DEADLINE_S + 10)
        return self.turns

    async def _session(self, index: int, session_id: str) -> None:
        while self._running:
            turn = Turn(session_id, prompt_for(f"s{index}n{next(self._tags)}", self.words))
            self.turns.append(turn)
            began = time.perf_counter()
            try:
                async for event in self.agent.RunStream(
                    pb.RunStreamRequest(session_id=session_id, text=turn.prompt), timeout=TURN_DEADLINE_S
                ):
                    if event.HasField("stream_end") and not event.is_subagent:
                        turn.end = event.stream_end
            except grpc.aio.AioRpcError as exc:
                turn.broken = exc.code().name
            turn.seconds = time.perf_counter() - began
            async with self._progress:
                self._progress.notify_all()


# -- what the store holds --------------------------------------------------------------------
def turn_tag(text: str) -> str | None:
    found = PROMPT.search(text)
    if found:
        return found[2]
    return text.split(":", 1)[0].removeprefix("turn ") if text.startswith("turn ") else None


def overlaps(messages: list) -> int:
    """Turns whose messages another turn's messages cut in two (0 when turns never ran at once)."""
    closed: set[str] = set()
    current = None
    cut = 0
    for message in messages:
        tag = turn_tag(message.content)
        if tag is None or tag == current:
            continue
        if tag in closed:
            cut += 1  # this turn wrote again after another turn had written
        if current is not None:
            closed.add(current)
        current = tag
    return cut


@dataclass
class Checked:
    sessions: int
    turns: int
    completed: int
    lost: int
    overlapping: int


async def check(store: session_store_pb2_grpc.SessionStoreStub, turns: list[Turn]) -> Checked:
    lost = overlapping = 0
    by_session: dict[str, list[Turn]] = {}
    for turn in turns:
        by_session.setdefault(turn.session_id, []).append(turn)
    for session_id, its_turns in by_session.items():
        session = (
            await store.GetSession(
                store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_FULL), timeout=30
            )
        ).session
        answers = [m.content for m in session.messages if m.role == "assistant" and "partial" not in m.metadata]
        lost += sum(answers.count(answer_to(t.prompt)) != 1 for t in its_turns if t.completed)
        overlapping += overlaps(list(session.messages))
    return Checked(len(by_session), len(turns), sum(t.completed for t in turns), lost, overlapping)


# -- Stop from either Agent ------------------------------------------------------------------
async def stop_from_the_other_agent(runs_on: str, stops_from: str, store) -> bool:
    """A long turn on the Agent at ``runs_on``, stopped by a Stop sent to ``stops_from``: True when
    that Stop said it stopped the turn and the turn's stream ended STOPPED."""
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="small"), timeout=30)).session
    async with grpc.aio.insecure_channel(runs_on) as running, grpc.aio.insecure_channel(stops_from) as other:
        call = agent_pb2_grpc.AgentStub(running).RunStream(
            pb.RunStreamRequest(session_id=session.id, text=prompt_for("stopped", 400)), timeout=TURN_DEADLINE_S
        )
        while not (event := await call.read()).HasField("text_delta"):
            assert event is not grpc.aio.EOF
        stopped = await agent_pb2_grpc.AgentStub(other).Stop(pb.StopRequest(session_id=session.id), timeout=30)
        end = None
        while (event := await call.read()) is not grpc.aio.EOF:
            if event.HasField("stream_end"):
                end = event.stream_end
    return stopped.stopped and end is not None and end.reason == END.STREAM_END_REASON_STOPPED


async def create_sessions(store, count: int) -> list[str]:
    return [
        (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="small"), timeout=30)).session.id
        for _ in range(count)
    ]

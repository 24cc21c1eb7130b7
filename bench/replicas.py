"""The replica run for a full minute: 2 SessionStores, 2 Compressors and 2 Agents as separate
processes on one PostgreSQL, 40 sessions running turns back to back through a round-robin channel
over the Agents, while one replica of each service in turn is killed (SIGKILL) and started again;
then what the store holds is checked (tests/helpers/replica_cluster.py, shared with tests/system/test_replicas.py).
Also what the session bus (PALIMPSEST_REPLICA_EVENTS) costs: the same load without kills, on and off."""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench import _common
from ollama_sim import OllamaSimulator
from palimpsest.shared.channels import open_channel
from palimpsest.shared.settings import Settings
from palimpsest.v1 import agent_pb2_grpc, session_store_pb2_grpc
from tests.conftest import TEST_PROFILES
from tests.helpers import replica_cluster as rc
from tests.helpers.fault_services import responder

NEEDS_POSTGRES = True
SESSIONS = 40


async def _at(started: float, second: float) -> None:
    await asyncio.sleep(max(0.0, started + second - time.perf_counter()))


async def _with_cluster(server, label: str, replica_events: bool, work):
    with OllamaSimulator() as sim, tempfile.TemporaryDirectory() as tmp:
        sim.set_responder(responder)
        profiles = Path(tmp) / "profiles.json"
        profiles.write_text(json.dumps(TEST_PROFILES))
        async with _common.fresh_database(server, label) as dsn:
            cluster = rc.cluster(
                dsn,
                sim.url,
                str(profiles),
                _common.default_data_dir() / "replicas",
                Path(tmp),
                replica_events=replica_events,
            )
            settings = Settings()
            try:
                await cluster.start()
                agents = open_channel(cluster.targets(cluster.agents), settings)
                stores = open_channel(cluster.targets(cluster.stores), settings)
                try:
                    store = session_store_pb2_grpc.SessionStoreStub(stores)
                    load = rc.Load(agent_pb2_grpc.AgentStub(agents), await rc.create_sessions(store, SESSIONS))
                    return await work(cluster, store, load)
                finally:
                    await agents.close()
                    await stores.close()
            finally:
                cluster.stop_now()


async def chaos(server, seconds: float) -> str:
    async def work(cluster, store, load):
        started = time.perf_counter()
        load.start()
        kills = 0
        for i, replicas in enumerate(cluster.kinds().values()):  # each kind down for an eighth of the run
            await _at(started, seconds * (0.1 + 0.25 * i))
            await rc.kill_and_restart(replicas[0], lambda i=i: _at(started, seconds * (0.225 + 0.25 * i)))
            kills += 1
        first, second = (a.address for a in cluster.agents)
        stops = await asyncio.gather(
            rc.stop_from_the_other_agent(first, second, store), rc.stop_from_the_other_agent(second, first, store)
        )
        await _at(started, seconds)
        turns = await load.stop()
        elapsed = time.perf_counter() - started
        checked = await rc.check(store, turns)
        broken = Counter(t.broken for t in turns if t.broken)
        return [
            [
                checked.sessions,
                checked.turns,
                checked.completed,
                ", ".join(f"{n} {code}" for code, n in broken.items()) or "0",
                kills,
                checked.lost,
                checked.overlapping,
                f"{sum(stops)} of 2",
                f"{elapsed:.0f}",
            ]
        ]

    rows = await _with_cluster(server, "replicas", True, work)
    down = seconds * 0.125
    return (
        "Replica run: 2 SessionStores, 2 Compressors, 2 Agents (separate processes) on one PostgreSQL, turn "
        f"claims and the session bus on; {SESSIONS} sessions running turns back to back (answers of 6 words, "
        "0.1 s a word) through a round-robin channel over the Agents; one SessionStore, then one Compressor, "
        f"then one Agent killed with SIGKILL and started again {down:.1f} s later (an eighth of the run). "
        "Broken: streams of the killed Agent (UNAVAILABLE, no stream_end: not acknowledged). "
        "Stop: a turn on each Agent stopped by a Stop sent to the other. Seconds: until the last turn ended.\n\n"
        + _common.table(
            [
                "sessions",
                "turns",
                "completed",
                "broken",
                "kills",
                "lost replies",
                "concurrent turns on one session",
                "Stop from the other Agent",
                "seconds",
            ],
            rows,
        )
    )


async def bus_cost(server, seconds: float) -> str:
    rows = []
    for on in (False, True):

        async def work(cluster, store, load):
            load.start()
            await load.until_completed(SESSIONS)  # past the first turns' one-time loads
            first = len(load.turns)
            await asyncio.sleep(seconds)  # the measured span
            turns = (await load.stop())[first:]
            times = sorted(t.seconds for t in turns if t.completed)
            return [
                [
                    "on" if on else "off",
                    len(times),
                    f"{len(times) / seconds:.1f}",
                    f"{statistics.median(times):.2f}",
                    f"{times[int(len(times) * 0.95)]:.2f}",
                ]
            ]

        rows += await _with_cluster(server, f"bus_{on}", on, work)
    return (
        f"What the session bus costs: the same {SESSIONS} sessions and cluster without kills, "
        f"{seconds:.0f} s measured after every session's first turn, PALIMPSEST_REPLICA_EVENTS off and on "
        "(on: every event of every turn published once more, through a store and PostgreSQL NOTIFY, "
        "to both Agents).\n\n"
        + _common.table(["session bus", "turns completed", "turns/s", "turn p50 (s)", "turn p95 (s)"], rows)
    )


async def run(args) -> str:
    seconds = 20.0 if args.quick else 60.0
    return await chaos(args.server, seconds) + "\n\n" + await bus_cost(args.server, seconds / 2)

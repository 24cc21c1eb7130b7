"""The replica test on loopback: 2 SessionStores, 2 Compressors and 2 Agents as separate processes on
one PostgreSQL, turn claims and the session bus on, clients balanced across the Agents (and the
Agents across the stores and Compressors). 40 sessions run turns back to back while one replica of
each service in turn is killed with SIGKILL and started again. What must hold: no reply a client
saw completed is missing from the store, no two turns of one session ever ran at once, and a Stop
sent to either Agent stops a turn running on the other.

Synchronised on progress only (turns completed, processes serving); `python -m bench replicas` runs
the same for a full minute and prints the table the README shows."""

from __future__ import annotations

import asyncio
import signal

import pytest

from palimpsest.shared.channels import open_channel
from palimpsest.v1 import agent_pb2_grpc, session_store_pb2_grpc
from tests.helpers import replica_cluster as rc
from tests.helpers.fault_services import responder

SESSIONS = 40


@pytest.fixture
async def cluster(database_url, ollama_sim, profiles_file, base_settings, tmp_path):
    running = rc.cluster(database_url, ollama_sim.url, profiles_file, base_settings.data_dir, tmp_path)
    ollama_sim.set_responder(responder)
    try:
        await running.start()
        yield running
    finally:
        running.stop_now()
        ollama_sim.set_responder(None)


async def test_two_replicas_of_each_service_lose_no_reply_and_never_overlap_turns_while_each_is_killed(
    cluster, base_settings
):
    agents = open_channel(cluster.targets(cluster.agents), base_settings)
    stores = open_channel(cluster.targets(cluster.stores), base_settings)
    store = session_store_pb2_grpc.SessionStoreStub(stores)
    try:
        load = rc.Load(agent_pb2_grpc.AgentStub(agents), await rc.create_sessions(store, SESSIONS))
        load.start()
        await load.until_completed(SESSIONS // 2)
        # One replica of each killed a few turns apart, so each dies amid turns that use it, then
        # all three started again once the others have carried the load on their own.
        for replicas in cluster.kinds().values():
            await replicas[0].signal(signal.SIGKILL)
            await load.more(3)
        await load.more(10)
        await asyncio.gather(*(replicas[0].start() for replicas in cluster.kinds().values()))
        await load.more(10)  # the restarted ones take their share again
        first, second = (a.address for a in cluster.agents)
        stops = await asyncio.gather(
            rc.stop_from_the_other_agent(first, second, store), rc.stop_from_the_other_agent(second, first, store)
        )
        turns = await load.stop()
        checked = await rc.check(store, turns)
    finally:
        await agents.close()
        await stores.close()
    assert checked.lost == 0, checked
    assert checked.overlapping == 0, checked
    assert stops == [True, True]
    assert checked.sessions == SESSIONS and checked.completed >= SESSIONS // 2 + 3 * 3 + 10 + 10, checked


def test_the_overlap_check_sees_two_turns_written_into_each_other():
    """The check the replica test relies on, fed the history that two turns at once leave."""
    from palimpsest.v1 import common_pb2

    def history(*texts):
        return [common_pb2.Message(content=t) for t in texts]

    apart = history("count to 3 (turn a)", "turn a: 1 2 3", "count to 3 (turn b)", "turn b: 1 2 3")
    killed = history("count to 3 (turn a)", "count to 3 (turn b)", "turn b: 1 2 3")  # a's Agent died
    at_once = history("count to 3 (turn a)", "count to 3 (turn b)", "turn a: 1 2 3", "turn b: 1 2 3")
    # Each of the two wrote again after the other had: two cuts.
    assert (rc.overlaps(apart), rc.overlaps(killed), rc.overlaps(at_once)) == (0, 0, 2)

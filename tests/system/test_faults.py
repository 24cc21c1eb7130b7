"""Real faults under load, with real processes: each service runs as `python -m services.<name>`
and is stopped with SIGTERM or killed with SIGKILL while turns are in flight; its PostgreSQL (a
throwaway embedded server of this module) is stopped and started again. What must hold: every
stream ends, an answer the client saw completed is stored exactly once, a turn that did not
complete has no complete answer stored, and everything works again once the part is back.

Synchronisation is on events only: turns reaching their first token or their end, a process
exiting, a health check answering."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from dataclasses import dataclass, field

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from palimpsest.shared.ports import free_port
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import agent_pb2_grpc, session_store_pb2_grpc
from palimpsest.v1 import session_store_pb2 as store_pb
from tests.helpers.fault_services import GRACE_S, REPO, Service, answer_to, prompt_for, responder
from tests.helpers.waiting import until

END = pb.StreamEndReason
TURN_DEADLINE_S = 45.0  # no stream may take longer, whatever the fault: a hang fails the test


# -- processes -------------------------------------------------------------------------------


@dataclass
class System:
    store: Service
    compressor: Service
    agent: Service
    database: object  # the throwaway EmbeddedPostgres

    def all(self) -> list[Service]:
        return [self.store, self.compressor, self.agent]


@pytest.fixture(scope="module")
def throwaway_pg(worker_id):
    """A PostgreSQL of this module (per xdist worker) that a test may stop: the suite's shared one
    must never be. Kept between runs (initdb once), stopped at the end."""
    from palimpsest.shared.embedded_pg import EmbeddedPostgres
    from tests.conftest import _test_pg_dir

    pg = EmbeddedPostgres(_test_pg_dir() / f"throwaway-{worker_id}", started_here=True)
    pg.start()
    pg.started_here = True  # ours even when a crashed earlier run left it running
    yield pg
    pg.stop()


@pytest.fixture(scope="module")
async def system(throwaway_pg, ollama_sim, profiles_file, base_settings, tmp_path_factory):
    logs = tmp_path_factory.mktemp("fault-logs")
    ports = {name: free_port() for name in ("store", "compressor", "agent")}
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "DATABASE_URL": throwaway_pg.url(),
        "PALIMPSEST_STORE_ADDR": f"127.0.0.1:{ports['store']}",
        "PALIMPSEST_COMPRESSOR_ADDR": f"127.0.0.1:{ports['compressor']}",
        "PALIMPSEST_AGENT_ADDR": f"127.0.0.1:{ports['agent']}",
        "OLLAMA_HOST": ollama_sim.url,
        "PALIMPSEST_PROFILES": profiles_file,
        "PALIMPSEST_DATA_DIR": str(base_settings.data_dir),  # the suite's tokenizer cache
        "PALIMPSEST_FILES_ROOT": str(tmp_path_factory.mktemp("fault-files")),
        "PALIMPSEST_GRACE_SECONDS": str(GRACE_S),
        # Past the longest outage these tests make on a loaded machine: PostgreSQL stays down until
        # all 16 answers of a staggered load are generated, then starts (25 s was passed under load,
        # and an answer the deadline gave up on was reported, rightly, as not stored).
        "PALIMPSEST_REPLY_WRITE_DEADLINE_SECONDS": "40",
        "PALIMPSEST_RPC_TIMEOUT_SECONDS": "5",
    }
    env.pop("PALIMPSEST_AUTH_ENABLED", None)
    running = System(
        *(
            Service(module, ports[name], env, logs / f"{name}.log")
            for name, module in (
                ("store", "palimpsest.store"),
                ("compressor", "palimpsest.compressor"),
                ("agent", "palimpsest.agent"),
            )
        ),
        database=throwaway_pg,
    )
    try:
        await running.store.start()
        await asyncio.gather(running.compressor.start(), running.agent.start())
        yield running
    finally:
        for service in reversed(running.all()):
            service.stop_now()


@pytest.fixture
async def clients(system, ollama_sim, base_settings):
    """Stubs on the Agent and the store; the simulator answers every turn by its prompt."""
    from palimpsest.shared.server import channel_options

    ollama_sim.clear()
    ollama_sim.set_responder(responder)
    for service in system.all():  # a test that failed halfway may have left one down
        if service.proc is None or service.proc.poll() is not None:
            await service.start()
    # The services' own reconnect backoff (2 s at most): a restarted service is found soon.
    options = channel_options(base_settings)
    async with (
        grpc.aio.insecure_channel(system.agent.address, options=options) as agent_channel,
        grpc.aio.insecure_channel(system.store.address, options=options) as store_channel,
    ):
        yield agent_pb2_grpc.AgentStub(agent_channel), session_store_pb2_grpc.SessionStoreStub(store_channel)
    ollama_sim.set_responder(None)


# -- turns under load ------------------------------------------------------------------------
@dataclass
class Outcome:
    """What the client of one turn saw."""

    prompt: str
    session_id: str = ""
    end: pb.StreamEnd | None = None
    errors: list[pb.ErrorEvent] = field(default_factory=list)
    broken: grpc.aio.AioRpcError | None = None  # the stream itself failed: no stream_end came

    @property
    def answer(self) -> str:
        return answer_to(self.prompt)

    @property
    def completed(self) -> bool:
        return self.end is not None and self.end.reason == END.STREAM_END_REASON_COMPLETED


class Load:
    """Turns running at once; events say when they have begun answering and when they ended."""

    def __init__(self, agent, lengths: list[int], tag: str):
        self.outcomes = [Outcome(prompt_for(f"{tag}{i}", words)) for i, words in enumerate(lengths)]
        self.answering = 0
        self.ended = 0
        self._changed = asyncio.Condition()
        self.tasks = [asyncio.create_task(self._turn(agent, o)) for o in self.outcomes]

    async def _turn(self, agent, outcome: Outcome) -> None:
        seen_text = False
        try:
            async for event in agent.RunStream(pb.RunStreamRequest(text=outcome.prompt), timeout=TURN_DEADLINE_S):
                outcome.session_id = outcome.session_id or event.session_id
                if event.HasField("text_delta") and not seen_text:
                    seen_text = True
                    await self._count("answering")
                elif event.HasField("error"):
                    outcome.errors.append(event.error)
                elif event.HasField("stream_end") and not event.is_subagent:
                    outcome.end = event.stream_end
        except grpc.aio.AioRpcError as exc:
            outcome.broken = exc
        await self._count("ended")

    async def _count(self, what: str) -> None:
        async with self._changed:
            setattr(self, what, getattr(self, what) + 1)
            self._changed.notify_all()

    async def until(self, what: str, count: int) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: getattr(self, what) >= count), TURN_DEADLINE_S)

    async def finished(self) -> list[Outcome]:
        await asyncio.wait_for(asyncio.gather(*self.tasks), TURN_DEADLINE_S + 5)
        return self.outcomes


async def stored_answers(store, outcome: Outcome) -> tuple[int, int]:
    """(complete answers, partial answers) stored in the turn's session."""
    session = (
        await store.GetSession(
            store_pb.GetSessionRequest(session_id=outcome.session_id, view=store_pb.SESSION_VIEW_FULL)
        )
    ).session
    answers = [m for m in session.messages if m.role == "assistant"]
    partial = [m for m in answers if "partial" in m.metadata]
    complete = [m for m in answers if "partial" not in m.metadata and m.content == outcome.answer]
    return len(complete), len(partial)


async def assert_stored_exactly_once_or_told(store, outcomes: list[Outcome]) -> dict[str, int]:
    """The promise to the client, turn by turn; returns how the turns ended, for the report."""
    tally = {"completed": 0, "stopped": 0, "error": 0, "broken": 0}
    for o in outcomes:
        assert o.end is not None or o.broken is not None, f"{o.prompt}: the stream neither ended nor failed"
        if not o.session_id:  # refused before a session existed: nothing to look at
            tally["broken"] += 1
            continue
        complete, _ = await stored_answers(store, o)
        if o.completed:
            tally["completed"] += 1
            assert complete == 1, f"{o.prompt}: completed, and its answer is stored {complete} times"
        elif o.end is not None:
            tally["stopped" if o.end.reason == END.STREAM_END_REASON_STOPPED else "error"] += 1
            assert complete == 0, f"{o.prompt}: ended {END.Name(o.end.reason)}, yet its whole answer is stored"
            if o.end.reason == END.STREAM_END_REASON_ERROR and o.end.text == o.answer:
                assert any("not stored" in e.message for e in o.errors), f"{o.prompt}: not told {o.errors}"
        else:
            tally["broken"] += 1
            assert complete <= 1, f"{o.prompt}: the stream broke, and its answer is stored {complete} times"
    return tally


async def a_turn_works(agent, store, session_id: str = "") -> None:
    outcome = Outcome(prompt_for("after", 3), session_id=session_id)
    async for event in agent.RunStream(
        pb.RunStreamRequest(session_id=session_id, text=outcome.prompt), timeout=TURN_DEADLINE_S, wait_for_ready=True
    ):
        outcome.session_id = outcome.session_id or event.session_id
        if event.HasField("stream_end"):
            outcome.end = event.stream_end
    assert outcome.completed, outcome.end
    assert (await stored_answers(store, outcome))[0] == 1


def staggered(turns: int, shortest: int = 6) -> list[int]:
    """Answer lengths (words) that end one after another: the fault lands amid final writes."""
    return [shortest + i for i in range(turns)]


# -- the faults ------------------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
async def test_the_store_going_away_amid_final_writes_loses_and_duplicates_nothing(system, clients, ollama_sim, sig):
    agent, store = clients
    load = Load(agent, staggered(16), tag=f"store{sig}x")
    await load.until("ended", 4)  # the rest are answering or writing their answers
    code = await system.store.signal(sig)
    if sig == signal.SIGTERM:
        assert code == 0, system.store.tail()
    await every_answer_generated(ollama_sim, 16)  # so every final write meets the store away
    await system.store.start()
    tally = await assert_stored_exactly_once_or_told(store, await load.finished())
    # The Agent waits for the store to return: every answer of this load lands, once.
    assert tally["completed"] == 16, tally
    await a_turn_works(agent, store)


async def test_sigterm_on_the_store_refuses_new_calls_and_lets_the_one_in_flight_finish(system, clients):
    import asyncpg

    from palimpsest.v1 import common_pb2

    _, store = clients
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="small"))).session
    blocker = await asyncpg.connect(system.database.url())
    try:
        # The test holds the session's row lock: the store's append waits on it, in flight for real.
        hold = blocker.transaction()
        await hold.start()
        await blocker.execute("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE", uuid.UUID(session.id))
        append = asyncio.ensure_future(
            store.AppendMessages(
                store_pb.AppendMessagesRequest(
                    session_id=session.id, messages=[common_pb2.Message(role="user", content="in flight")]
                ),
                timeout=30,
            )
        )
        assert await until(lambda: waiting_on_a_lock(blocker)), "the append never reached PostgreSQL"
        system.store.proc.send_signal(signal.SIGTERM)

        async def refused() -> bool:
            try:
                await store.ListSessions(store_pb.ListSessionsRequest(profile_id="small", page_size=1), timeout=2)
                return False
            except grpc.aio.AioRpcError as exc:
                return exc.code() == grpc.StatusCode.UNAVAILABLE

        assert await until(refused), "the stopping store still took new calls"
        assert not append.done()
        await hold.rollback()
    finally:
        await blocker.close()
    assert len((await append).seqs) == 1
    assert await asyncio.to_thread(system.store.proc.wait, GRACE_S + 10) == 0
    await system.store.start()
    # This channel may still be backing off from the refused connections of the restart: wait for it.
    stored = (
        await store.GetSession(
            store_pb.GetSessionRequest(session_id=session.id, view=store_pb.SESSION_VIEW_FULL),
            wait_for_ready=True,
            timeout=30,
        )
    ).session
    assert [m.content for m in stored.messages] == ["in flight"]


async def waiting_on_a_lock(conn) -> bool:
    return (
        await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        > 0
    )


async def test_postgresql_stopped_and_started_under_load_loses_and_duplicates_nothing(system, clients, ollama_sim):
    agent, store = clients
    load = Load(agent, staggered(16), tag="pgx")
    await load.until("ended", 4)
    await asyncio.to_thread(stop_database, system.database)
    await wait_health(system.store, health_pb2.HealthCheckResponse.NOT_SERVING)  # the store saw it go
    await every_answer_generated(ollama_sim, 16)
    await asyncio.to_thread(system.database.start)
    await system.store.serving()
    tally = await assert_stored_exactly_once_or_told(store, await load.finished())
    assert tally["completed"] == 16, tally
    await a_turn_works(agent, store)


async def test_sigterm_on_the_agent_finishes_short_turns_and_stops_long_ones_cleanly(system, clients):
    agent, store = clients
    # Half end well within the grace period, half would outlast it.
    load = Load(agent, [6] * 6 + [200] * 6, tag="agentterm")
    await load.until("answering", 12)
    assert await system.agent.signal(signal.SIGTERM) == 0, system.agent.tail()
    outcomes = await load.finished()
    tally = await assert_stored_exactly_once_or_told(store, outcomes)
    assert tally == {"completed": 6, "stopped": 6, "error": 0, "broken": 0}, tally
    for o in outcomes[6:]:  # what the client saw of a stopped answer is kept, marked partial
        assert (await stored_answers(store, o))[1] == 1
    await system.agent.start()
    await a_turn_works(agent, store, outcomes[-1].session_id)


async def test_kill_9_of_the_agent_ends_every_stream_and_leaves_sessions_usable(system, clients):
    agent, store = clients
    load = Load(agent, staggered(12, shortest=20), tag="agentkill")
    await load.until("answering", 12)
    await system.agent.signal(signal.SIGKILL)
    outcomes = await load.finished()
    tally = await assert_stored_exactly_once_or_told(store, outcomes)
    assert tally["broken"] == 12, tally
    await system.agent.start()
    await asyncio.gather(*(a_turn_works(agent, store, o.session_id) for o in outcomes))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
async def test_the_compressor_going_away_under_load_fails_no_turn(system, clients, sig):
    agent, store = clients
    load = Load(agent, staggered(12), tag=f"comp{sig}x")
    await load.until("answering", 12)
    await system.compressor.signal(sig)
    # Turns begun while it is away go on without it, and say so once.
    away = Load(agent, staggered(4), tag=f"away{sig}x")
    outcomes = await load.finished() + await away.finished()
    await system.compressor.start()
    tally = await assert_stored_exactly_once_or_told(store, outcomes)
    assert tally["completed"] == 16, tally
    assert all(any("without compression" in e.message for e in o.errors) for o in away.outcomes)
    await a_turn_works(agent, store)


async def test_a_frozen_compressor_costs_one_turn_its_deadline_and_is_used_again_once_it_thaws(system, clients):
    """SIGSTOP: the Compressor's connections stay open and nothing answers. The first turn waits
    one deadline (PALIMPSEST_RPC_TIMEOUT_SECONDS, 5 s here) for its size check; the turns after it go on
    without the Compressor at once, their error event saying it is not called; after SIGCONT a
    health check finds it back and turns use it again."""
    from palimpsest.agent.compressor_breaker import NOT_CALLED

    agent, store = clients

    async def used_again() -> bool:
        outcome = (await Load(agent, [3], tag="thawedx").finished())[0]
        return outcome.completed and not outcome.errors

    # An earlier test's Compressor kill may have left the breaker open: start from one in use.
    assert await until(used_again, TURN_DEADLINE_S)
    system.compressor.proc.send_signal(signal.SIGSTOP)
    try:
        first = (await Load(agent, [6], tag="frozen0x").finished())[0]
        later = [(await Load(agent, [6], tag=f"frozen{i}x").finished())[0] for i in range(1, 4)]
    finally:
        system.compressor.proc.send_signal(signal.SIGCONT)
    for outcome in (first, *later):
        assert outcome.completed and (await stored_answers(store, outcome))[0] == 1, outcome
    assert [e.code for e in first.errors] == ["UNAVAILABLE"] and NOT_CALLED not in first.errors[0].message
    assert all([e.code for e in o.errors] == ["UNAVAILABLE"] and NOT_CALLED in o.errors[0].message for o in later), [
        o.errors for o in later
    ]
    assert await until(used_again, TURN_DEADLINE_S)


def stop_database(pg) -> None:
    """pg_ctl stop, failing loudly (EmbeddedPostgres.stop stays quiet: it runs at exits)."""
    pg._run("pg_ctl", "-D", str(pg.pgdata), "-w", "-m", "fast", "stop")


async def every_answer_generated(ollama_sim, count: int) -> None:
    """The simulator has streamed `count` whole answers: their turns are at their final write."""
    assert await asyncio.to_thread(
        ollama_sim.wait_until, lambda: sum(c.completed for c in ollama_sim.chats) >= count, TURN_DEADLINE_S
    )


async def wait_health(service: Service, status: int, timeout: float = 20.0) -> None:
    """Until the service says `status`: its health Watch streams every change, so no polling."""
    async with grpc.aio.insecure_channel(service.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        try:
            async for reply in health.Watch(health_pb2.HealthCheckRequest(), timeout=timeout):
                if reply.status == status:
                    return
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
    raise AssertionError(f"{service.module} health never became {status}")

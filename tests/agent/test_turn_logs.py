"""The turn logs ResumeStream reads from, on their own: replay and live follow, what is kept (time,
budget, the bus's gaps) and what a reader is told when it asks for more than that."""

from __future__ import annotations

import asyncio
import tracemalloc

import pytest

from palimpsest.agent.turn_logs import EVENT_OVERHEAD, LOST_AFTER_S, Behind, TurnLogs
from palimpsest.shared.errors import NotFound, OutOfRange, Unavailable
from palimpsest.v1 import agent_pb2 as pb


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def text(seq: int, words: str = "w", turn: str = "t1", session: str = "s1") -> pb.AgentEvent:
    return pb.AgentEvent(session_id=session, turn_id=turn, seq=seq, text_delta=pb.TextDelta(text=words))


def end(seq: int, turn: str = "t1", session: str = "s1", *, subagent: bool = False) -> pb.AgentEvent:
    return pb.AgentEvent(
        session_id=session,
        turn_id=turn,
        seq=seq,
        is_subagent=subagent,
        stream_end=pb.StreamEnd(reason=pb.STREAM_END_REASON_COMPLETED, text="all"),
    )


def cost(event: pb.AgentEvent) -> int:
    """What the logs count an event at: its bytes and what holding them costs."""
    return event.ByteSize() + EVENT_OVERHEAD


def logs(keep_s: float = 60.0, budget: int = 1 << 20) -> tuple[TurnLogs, Clock]:
    clock = Clock()
    return TurnLogs(keep_s, budget, clock), clock


async def collect(turns: TurnLogs, log, after_seq: int) -> list[int]:
    return [pb.AgentEvent.FromString(payload).seq async for payload in turns.follow(log, after_seq)]


async def test_a_reader_gets_what_it_missed_then_follows_live_to_stream_end():
    turns, _ = logs()
    for seq in (1, 2, 3):
        turns.record(text(seq), local=True)
    log = turns.find("s1", "t1")
    reader = asyncio.create_task(collect(turns, log, 1))
    await asyncio.sleep(0)  # the reader has the replay and waits for more
    assert not reader.done()
    turns.record(text(4), local=True)
    turns.record(end(5, subagent=True), local=True)  # a sub-agent's end is not the turn's
    turns.record(text(6), local=True)
    turns.record(end(7), local=True)
    assert await asyncio.wait_for(reader, 5) == [2, 3, 4, 5, 6, 7]
    assert await collect(turns, log, 7) == []  # a reader that has it all ends at once
    assert await collect(turns, turns.find("s1"), 0) == [1, 2, 3, 4, 5, 6, 7]  # latest turn of the session


async def test_asking_past_the_end_or_behind_what_is_kept_is_out_of_range():
    turns, _ = logs()
    for seq in (1, 2):
        turns.record(text(seq), local=True)
    log = turns.find("s1", "t1")
    log.check(2)
    with pytest.raises(OutOfRange, match="after_seq: turn t1 is at seq 2"):
        log.check(5)  # no client has seen seq 5 of this turn
    turns.record(end(3), local=True)
    with pytest.raises(OutOfRange, match="after_seq: turn t1 is at seq 3"):
        log.check(5)


async def test_ended_turns_are_kept_for_keep_s_then_not_found():
    turns, clock = logs(keep_s=30)
    turns.record(text(1), local=True)
    turns.record(end(2), local=True)
    clock.now += 29
    assert turns.find("s1").turn_id == "t1"
    clock.now += 2
    with pytest.raises(NotFound, match="no turn of session s1 is kept by this Agent"):
        turns.find("s1")
    with pytest.raises(NotFound, match="turn t1 of session s1 is not kept"):
        turns.find("s1", "t1")
    assert turns.bytes == 0


async def test_a_running_turn_here_is_kept_however_long_it_runs():
    turns, clock = logs(keep_s=30)
    turns.record(text(1), local=True)
    clock.now += 3600
    turns.record(text(1, turn="t2", session="s2"), local=True)  # another turn: a chance to expire
    assert turns.find("s1").turn_id == "t1"


async def test_a_turn_that_ends_without_its_stream_end_tells_its_readers():
    turns, _ = logs()
    turns.record(text(1), local=True)
    log = turns.find("s1")
    reader = asyncio.create_task(collect(turns, log, 0))
    await asyncio.sleep(0)
    turns.ended("t1")  # its task was cancelled: the Agent is stopping
    with pytest.raises(Unavailable, match="ended without its stream_end"):
        await asyncio.wait_for(reader, 5)


async def test_a_turn_is_found_only_under_its_own_session():
    turns, _ = logs()
    turns.record(text(1, turn="t1", session="s1"), local=True)
    with pytest.raises(NotFound):
        turns.find("s2", "t1")  # the caller may read s2, which says nothing of s1's turns
    turns.record(text(1, turn="t2", session="s1"), local=True)
    assert turns.find("s1").turn_id == "t2"  # the latest
    assert turns.find("s1", "t1").turn_id == "t1"  # an earlier one, still kept


async def test_watcher_only_events_and_events_without_a_turn_are_not_kept():
    turns, _ = logs()
    turns.record(pb.AgentEvent(session_id="s1", turn_id="t1", turn_started=pb.TurnStarted(text="hi")), local=True)
    turns.record(pb.AgentEvent(session_id="s1", seq=1, text_delta=pb.TextDelta(text="x")), local=True)
    with pytest.raises(NotFound):
        turns.find("s1")


async def test_over_budget_ended_turns_go_first_oldest_first():
    size = cost(text(1, "x" * 100))
    turns, _ = logs(budget=size * 10)
    for turn in ("t1", "t2"):  # t1 ends first
        for seq in (1, 2):
            turns.record(text(seq, "x" * 100, turn=turn, session=turn), local=True)
        turns.ended(turn)
    for seq in range(1, 8):  # 11 events' worth: one ended turn must go
        turns.record(text(seq, "x" * 100, turn="t3", session="t3"), local=True)
    with pytest.raises(NotFound):
        turns.find("t1")
    assert turns.find("t2").first_seq == 1 and turns.find("t3").first_seq == 1
    assert turns.bytes <= size * 10


async def test_over_budget_the_largest_running_turn_gives_up_its_oldest_events():
    size = cost(text(1, "x" * 100))
    turns, _ = logs(budget=size * 5)
    turns.record(text(1, "x" * 100, turn="t1", session="s1"), local=True)  # a small turn
    for seq in range(1, 9):
        turns.record(text(seq, "x" * 100, turn="t2", session="s2"), local=True)  # a big one
    small, big = turns.find("s1"), turns.find("s2")
    assert small.first_seq == 1 and big.last_seq == 8 and big.first_seq > 1
    assert turns.bytes <= size * 5
    with pytest.raises(OutOfRange, match=f"kept from seq {big.first_seq} on"):
        big.check(big.first_seq - 2)
    big.check(big.first_seq - 1)  # everything after it is here


async def test_a_reader_that_falls_behind_the_budget_is_told_not_given_a_hole():
    size = cost(text(1, "x" * 100))
    turns, _ = logs(budget=size * 4)
    turns.record(text(1, "x" * 100), local=True)
    log = turns.find("s1")
    seen: list[int] = []
    stalled = asyncio.Event()

    async def slow_reader() -> None:
        async for payload in turns.follow(log, 0):
            seen.append(pb.AgentEvent.FromString(payload).seq)
            if len(seen) == 2:  # a client that stops reading after its second event
                stalled.set()
                await asyncio.Event().wait()

    reader = asyncio.create_task(slow_reader())
    turns.record(text(2, "x" * 100), local=True)
    await stalled.wait()
    for seq in range(3, 12):  # the turn streams on past the budget
        turns.record(text(seq, "x" * 100), local=True)
    reader.cancel()
    assert seen == [1, 2]
    with pytest.raises(Behind, match="fell behind turn t1: its events are kept from seq"):
        await collect(turns, log, 2)  # picking up again from where it stopped: gone, and said so


async def test_the_bus_losing_events_restarts_the_kept_run_from_the_next_whole_one():
    turns, _ = logs()
    for seq in (1, 2, 4, 5):  # seq 3 never arrived over the bus
        turns.record(text(seq), local=False)
    turns.record(text(4), local=False)  # heard twice: once kept
    log = turns.find("s1")
    with pytest.raises(OutOfRange, match="kept from seq 4 on"):
        log.check(1)
    turns.record(end(6), local=False)
    assert await collect(turns, log, 3) == [4, 5, 6]
    assert turns.bytes == sum(cost(e) for e in (text(4), text(5), end(6)))


async def test_another_replicas_running_turn_is_kept_while_it_says_it_runs_whatever_keep_s():
    turns, clock = logs(keep_s=0)  # nothing kept after a turn ends; a running one is kept all the same
    turns.record(text(1), local=False)
    for _ in range(10):
        clock.now += LOST_AFTER_S - 1
        turns.heard_alive("t1")
        assert turns.find("s1").turn_id == "t1"
    log = turns.find("s1")
    reader = asyncio.create_task(collect(turns, log, 0))
    turns.record(text(2), local=False)
    turns.record(end(3), local=False)
    assert await asyncio.wait_for(reader, 5) == [1, 2, 3]
    with pytest.raises(NotFound):
        turns.find("s1")  # ended, and kept 0 s


async def test_another_replicas_turn_not_heard_of_is_lost_and_its_readers_told():
    turns, clock = logs()
    turns.record(text(1), local=False)
    log = turns.find("s1")
    clock.now += LOST_AFTER_S
    with pytest.raises(NotFound, match="lost with that replica"):
        await collect(turns, log, 1)  # a reader that had everything is told, not left waiting
    with pytest.raises(NotFound):
        turns.find("s1")


async def test_a_reader_waiting_on_another_replicas_turn_learns_it_was_lost():
    turns, clock = logs()
    turns.record(text(1), local=False)
    log = turns.find("s1")
    reader = asyncio.create_task(collect(turns, log, 0))
    await asyncio.sleep(0)
    clock.now += LOST_AFTER_S
    turns.record(text(1, turn="t2", session="s2"), local=False)  # any news: the lost one is forgotten
    with pytest.raises(NotFound, match="lost with that replica"):
        await asyncio.wait_for(reader, 5)


async def test_a_resume_waits_a_moment_for_another_replicas_events_to_arrive():
    turns, _ = logs()
    opened = asyncio.create_task(turns.open("s1", "t1", 2, catch_up_s=5))
    await asyncio.sleep(0)
    for seq in (1, 2, 3):  # the client saw seq 2 from the turn's own replica before it reached here
        turns.record(text(seq), local=False)
    log = await asyncio.wait_for(opened, 5)
    assert log.turn_id == "t1" and log.last_seq >= 2
    with pytest.raises(NotFound):
        await turns.open("s1", "t9", 0, catch_up_s=0)


async def test_a_resume_ahead_of_this_replicas_own_turn_is_refused_at_once():
    turns, _ = logs()
    turns.record(text(1), local=True)
    with pytest.raises(OutOfRange, match="at seq 1"):
        await asyncio.wait_for(turns.open("s1", "t1", 5, catch_up_s=30), 5)


@pytest.mark.slow  # a 1 MB budget filled several times over, under tracemalloc
def test_the_budget_bounds_the_memory_the_kept_events_take():
    """Counted bytes are what the logs hold: filling a 1 MB budget (several times over) with small
    text deltas (the commonest event, where per-event overhead weighs most) takes at most a little
    more than 1 MB."""
    budget = 1024 * 1024
    turns = TurnLogs(300, budget)
    events = [
        pb.AgentEvent(
            session_id="12345678-1234-4234-8234-123456789012",
            turn_id=f"{i // 5_000:032x}",
            seq=i % 5_000 + 1,
            text_delta=pb.TextDelta(text=" word"),
        )
        for i in range(30_000)
    ]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for event in events:
            turns.record(event, local=True)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert budget * 0.85 <= turns.bytes <= budget
    assert held <= budget * 1.25, f"the logs hold {held / 2**20:.1f} MB for a {budget / 2**20:.0f} MB budget"


async def test_while_this_replica_hears_nothing_the_others_turns_are_not_taken_for_lost():
    turns, clock = logs()
    turns.record(text(1), local=False)
    turns.set_hearing(False)  # this replica's listen dropped: the others' silence says nothing
    clock.now += LOST_AFTER_S * 5
    assert turns.find("s1").turn_id == "t1"
    turns.set_hearing(True)  # back: the silence counts from now
    clock.now += LOST_AFTER_S - 1
    assert turns.find("s1").turn_id == "t1"
    clock.now += 1
    with pytest.raises(NotFound):
        turns.find("s1")
    with pytest.raises(NotFound, match="lost with that replica"):
        await turns.open("s1", "t1", 0, catch_up_s=0)


async def test_a_lost_turn_is_said_lost_at_once_even_to_a_reader_still_behind():
    turns, clock = logs()
    for seq in (1, 2, 3):
        turns.record(text(seq), local=False)
    log = turns.find("s1")
    clock.now += LOST_AFTER_S
    turns.record(text(1, turn="t2", session="s2"), local=False)  # news: the silent one is forgotten
    with pytest.raises(NotFound, match="lost with that replica"):
        await collect(turns, log, 1)  # behind (seq 2 and 3 unread): told why, not OUT_OF_RANGE
    with pytest.raises(NotFound, match="lost with that replica"):  # no wait for news of it
        await asyncio.wait_for(turns.open("s1", "t1", 0, catch_up_s=60), 5)

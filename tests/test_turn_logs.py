"""The turn logs ResumeStream reads from, on their own: replay and live follow, what is kept (time,
budget, the bus's gaps) and what a reader is told when it asks for more than that."""

from __future__ import annotations

import asyncio

import pytest

from palimpsest.v1 import agent_pb2 as pb
from services.agent.turn_logs import TurnLogs
from services.shared.errors import NotFound, OutOfRange, Unavailable


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def text(seq: int, words: str = "w", turn: str = "t1", session: str = "s1") -> pb.AgentEvent:
    return pb.AgentEvent(session_id=session, turn_id=turn, seq=seq, text_delta=pb.TextDelta(text=words))


def end(seq: int, turn: str = "t1", session: str = "s1", *, subagent: bool = False) -> pb.AgentEvent:
    return pb.AgentEvent(session_id=session, turn_id=turn, seq=seq, is_subagent=subagent,
                         stream_end=pb.StreamEnd(reason=pb.STREAM_END_REASON_COMPLETED, text="all"))


def logs(keep_s: float = 60.0, budget: int = 1 << 20) -> tuple[TurnLogs, Clock]:
    clock = Clock()
    return TurnLogs(keep_s, budget, clock), clock


async def collect(log, after_seq: int, silence_s: float | None = None) -> list[int]:
    return [e.seq async for e in log.follow(after_seq, silence_s=silence_s)]


async def test_a_reader_gets_what_it_missed_then_follows_live_to_stream_end():
    turns, _ = logs()
    for seq in (1, 2, 3):
        turns.record(text(seq), local=True)
    log = turns.find("s1", "t1")
    reader = asyncio.create_task(collect(log, 1))
    await asyncio.sleep(0)  # the reader has the replay and waits for more
    assert not reader.done()
    turns.record(text(4), local=True)
    turns.record(end(5, subagent=True), local=True)  # a sub-agent's end is not the turn's
    turns.record(text(6), local=True)
    turns.record(end(7), local=True)
    assert await asyncio.wait_for(reader, 5) == [2, 3, 4, 5, 6, 7]
    assert await collect(log, 7) == []  # a reader that has it all ends at once
    assert await collect(turns.find("s1"), 0) == [1, 2, 3, 4, 5, 6, 7]  # latest turn of the session


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


async def test_a_turn_that_failed_without_stream_end_ends_its_readers():
    turns, _ = logs()
    turns.record(text(1), local=True)
    log = turns.find("s1")
    reader = asyncio.create_task(collect(log, 0))
    await asyncio.sleep(0)
    turns.ended("t1")
    assert await asyncio.wait_for(reader, 5) == [1]


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
    size = text(1, "x" * 100).ByteSize()
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
    size = text(1, "x" * 100).ByteSize()
    turns, _ = logs(budget=size * 5)
    turns.record(text(1, "x" * 100, turn="t1", session="s1"), local=True)  # a small turn
    for seq in range(1, 9):
        turns.record(text(seq, "x" * 100, turn="t2", session="s2"), local=True)  # a big one
    small, big = turns.find("s1"), turns.find("s2")
    assert small.first_seq == 1 and big.first_seq == 5 and big.last_seq == 8
    with pytest.raises(OutOfRange, match="kept from seq 5 on"):
        big.check(2)
    big.check(4)  # everything after 4 is here


async def test_a_reader_that_falls_behind_the_budget_is_told_not_given_a_hole():
    size = text(1, "x" * 100).ByteSize()
    turns, _ = logs(budget=size * 4)
    turns.record(text(1, "x" * 100), local=True)
    log = turns.find("s1")
    seen: list[int] = []
    stalled = asyncio.Event()

    async def slow_reader() -> None:
        async for event in log.follow(0, silence_s=None):
            seen.append(event.seq)
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
    with pytest.raises(OutOfRange, match="after_seq"):
        await collect(log, 2)  # picking up again from where it stopped: gone, and said so


async def test_the_bus_losing_events_restarts_the_kept_run_from_the_next_whole_one():
    turns, _ = logs()
    for seq in (1, 2, 4, 5):  # seq 3 never arrived over the bus
        turns.record(text(seq), local=False)
    turns.record(text(4), local=False)  # heard twice: once kept
    log = turns.find("s1")
    with pytest.raises(OutOfRange, match="kept from seq 4 on"):
        log.check(1)
    turns.record(end(6), local=False)
    assert await collect(log, 3) == [4, 5, 6]
    assert turns.bytes == sum(e.ByteSize() for e in (text(4), text(5), end(6)))


async def test_another_replicas_turn_that_falls_silent_is_taken_for_lost():
    turns, clock = logs(keep_s=0.05)
    turns.record(text(1), local=False)
    log = turns.find("s1")
    with pytest.raises(Unavailable, match="another Agent replica"):
        await collect(log, 1, silence_s=turns.silence_s(log))
    clock.now += 1
    with pytest.raises(NotFound):
        turns.find("s1")  # and forgotten


async def test_a_turn_here_never_times_out_its_readers():
    turns, _ = logs(keep_s=0.01)
    turns.record(text(1), local=True)
    log = turns.find("s1")
    assert turns.silence_s(log) is None

"""A turn's events, kept: the turn's own RunStream reads them from here, and ResumeStream replays
what a client missed and follows the turn live to its stream_end.

- One log per turn: an unbroken run of its events by seq, ``first_seq`` to ``last_seq``. What a
  reader is given is always whole: a reader asking for events older than the run is told so
  (OutOfRange), never handed a stream with a hole in it. Events from another replica's turn come
  over the session bus, at most once: one that skips a seq starts the run again from itself.
- Kept while the turn runs and ``keep_s`` after it ends. Another replica's running turn is kept
  while that replica says it runs it (``heard_alive``, every ``ALIVE_EVERY_S``); silent for
  ``LOST_AFTER_S``, the turn is taken for lost with its replica (NotFound).
- Kept serialized (a parsed event costs ten times its bytes in memory), each counted at its bytes
  plus what holding them costs, and every log together within ``budget_bytes``: ended turns go
  first, the oldest first (those still being read last); then the largest turn gives up its oldest
  events, never its newest (a reader keeping up gets it, however large).
- Readers read through a cursor, one event at a time, and hold nothing of their own: a reader that
  stops reading costs no memory, and one that falls behind what is kept is told so (Behind). An
  ended turn still being read outlives ``keep_s`` until its readers are done (within the budget).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable

import grpc

from palimpsest.shared.errors import NotFound, OutOfRange, PalimpsestError, Unavailable
from palimpsest.v1 import agent_pb2 as pb

# What one kept event costs beyond its bytes: the bytes object's header and its place in the list
# (measured with tracemalloc: tests/agent/test_turn_logs.py holds the budget to the memory).
EVENT_OVERHEAD = 33 + 8
# A replica announces the turns it runs this often (over the session bus); another replica's turn
# not heard of for LOST_AFTER_S (three announcements missed) is lost with its replica.
ALIVE_EVERY_S = 2.0
LOST_AFTER_S = 3 * ALIVE_EVERY_S
LOST_REMEMBERED = 1000  # lost turns whose resumes are told so at once, not after a wait for news


def _cost(payload: bytes) -> int:
    return len(payload) + EVENT_OVERHEAD


class Ahead(OutOfRange):
    """A resume from a seq the turn has not reached (here): another replica may be ahead of this one."""


class Behind(PalimpsestError):
    """A reader slower than its turn, now past what is kept."""

    code = grpc.StatusCode.OUT_OF_RANGE


class TurnLog:
    def __init__(self, session_id: str, turn_id: str, *, local: bool, first_seq: int, now: float) -> None:
        self.session_id = session_id
        self.turn_id = turn_id
        self.local = local  # run by this replica (else heard over the session bus)
        # Serialized events, read from ``_start`` on (trimming the front is a step of the index, and a
        # follower slices only what is new to it); compacted when half of it is dead.
        self._events: list[bytes] = []
        self._start = 0
        self.first_seq = first_seq  # the seq of the oldest kept event; the next expected one while none is
        self.bytes = 0
        self.ended_at: float | None = None
        # How it ended when not with its stream_end (its Agent stopping, its replica lost): what a
        # reader that has everything is told instead of a quiet end.
        self.failure: Exception | None = None
        self.heard_at = now
        self.released = False  # forgotten by the logs: what it held is gone
        self.readers = 0  # following it now
        self._more = asyncio.Event()

    @property
    def kept(self) -> int:
        return len(self._events) - self._start

    @property
    def last_seq(self) -> int:
        return self.first_seq + self.kept - 1

    @property
    def ended(self) -> bool:
        return self.ended_at is not None

    def event(self, seq: int) -> bytes:
        """The kept event ``seq`` (first_seq ≤ seq ≤ last_seq)."""
        return self._events[self._start + seq - self.first_seq]

    def _clear(self, next_seq: int) -> None:
        self._events, self._start = [], 0
        self.first_seq, self.bytes = next_seq, 0

    def pulse(self) -> None:
        """Wake every reader waiting for more (each waits on the event it found)."""
        self._more.set()
        self._more = asyncio.Event()

    async def more(self, timeout: float | None) -> None:
        """Until the log changes, or ``timeout`` (asyncio.TimeoutError)."""
        await asyncio.wait_for(self._more.wait(), timeout)

    def add(self, event: pb.AgentEvent, payload: bytes, now: float) -> int:
        """Append; the bytes this log grew (or shrank, when a gap restarted it) by."""
        if event.seq <= self.last_seq:
            return 0  # heard twice
        grown = _cost(payload)
        if event.seq != self.last_seq + 1:  # the bus lost some: keep what is whole from here
            grown -= self.bytes
            self._clear(event.seq)
        self._events.append(payload)
        self.bytes += _cost(payload)
        self.heard_at = now
        if event.HasField("stream_end") and not event.is_subagent:
            self.ended_at = now
        self.pulse()
        return grown

    def drop_oldest(self) -> int:
        """The oldest event goes (readers still behind it are told they fell behind); its bytes."""
        size = _cost(self._events[self._start])
        self._events[self._start] = b""  # its bytes go now, its slot at the next compaction
        self._start += 1
        self.first_seq += 1
        self.bytes -= size
        if self._start * 2 > len(self._events):
            del self._events[: self._start]
            self._start = 0
        self.pulse()
        return size

    def release(self, failure: Exception | None = None) -> None:
        """Forgotten: readers still following are told on their next look (behind what is kept,
        ``failure``, or, having it all, at the end)."""
        self._clear(self.last_seq + 1)
        self.released = True
        if failure is not None:
            self.end(0.0, failure)
        self.pulse()

    def end(self, now: float, failure: Exception | None) -> None:
        if self.ended_at is None:
            self.ended_at = now
            self.failure = failure
            self.pulse()

    def check_reader(self, seq: int) -> None:
        """Behind unless the event after ``seq`` (what a reader has read to) is kept or still to come."""
        if seq + 1 < self.first_seq:
            raise Behind(
                f"this stream fell behind turn {self.turn_id}: its events are kept from seq {self.first_seq} "
                f"on (older ones went to stay within PALIMPSEST_STREAM_KEEP_MB, or were lost on the session "
                f"bus) and the stream had read to seq {seq}. The turn goes on and stores its answer: "
                f"ResumeStream with after_seq {self.first_seq - 1} follows the rest, and the session's "
                "history has it whole"
            )

    def check(self, after_seq: int) -> None:
        """OutOfRange unless every event after ``after_seq`` is here or still to come."""
        if after_seq + 1 < self.first_seq:
            raise OutOfRange(
                "after_seq",
                f"events of turn {self.turn_id} are kept from seq {self.first_seq} on; "
                f"{after_seq + 1} is gone (the session's history has what the turn stored)",
            )
        if after_seq > self.last_seq and (self.ended or self.kept):
            raise Ahead("after_seq", f"turn {self.turn_id} is at seq {self.last_seq}")


class TurnLogs:
    def __init__(self, keep_s: float, budget_bytes: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.keep_s = keep_s
        self.budget_bytes = budget_bytes
        self.clock = clock
        self._logs: dict[str, TurnLog] = {}
        self._latest: dict[str, str] = {}  # session id -> its latest turn's id
        self._ended: OrderedDict[str, None] = OrderedDict()  # ended turns, in the order they ended
        self._remote_running: dict[str, TurnLog] = {}  # other replicas' turns not ended yet
        self._news = asyncio.Event()  # pulsed on each event from another replica
        # Other replicas' turns taken for lost lately, with what their resumes are told (at once).
        self._lost: OrderedDict[str, NotFound] = OrderedDict()
        # Whether this replica hears the others (its session bus listens): while it does not, their
        # silence says nothing about their turns.
        self.hearing = True
        self.bytes = 0

    # -- writing -------------------------------------------------------------------------------
    def begin(self, session_id: str, turn_id: str) -> TurnLog:
        """A turn of this replica, before its first event: the log its RunStream reads."""
        now = self.clock()
        self._expire(now)
        log = self._logs[turn_id] = TurnLog(session_id, turn_id, local=True, first_seq=1, now=now)
        self._latest[session_id] = turn_id
        return log

    def record(self, event: pb.AgentEvent, *, local: bool, payload: bytes | None = None) -> None:
        """A turn's event (seq 0 events are for watchers only, not a turn's stream); ``payload``:
        the event serialized, when the caller has it already."""
        if not event.turn_id or event.seq <= 0:
            return
        now = self.clock()
        log = self._logs.get(event.turn_id)
        if log is None:
            self._expire(now)
            log = self._logs[event.turn_id] = TurnLog(
                event.session_id, event.turn_id, local=local, first_seq=event.seq, now=now
            )
            self._latest[event.session_id] = event.turn_id
            if not local:
                self._remote_running[event.turn_id] = log
        was_ended = log.ended
        self.bytes += log.add(event, payload if payload is not None else event.SerializeToString(), now)
        if log.ended and not was_ended:
            self._now_ended(log.turn_id)
        if not local:
            self._news.set()
            self._news = asyncio.Event()
        self._within_budget()

    def ended(self, turn_id: str) -> None:
        """This replica's turn is over; one that ended without its stream_end (its task cancelled: the
        Agent is stopping) tells its readers so."""
        log = self._logs.get(turn_id)
        if log is not None and not log.ended:
            log.end(
                self.clock(),
                Unavailable(
                    f"turn {turn_id} ended without its stream_end: its Agent is "
                    "stopping; the session has what the turn stored"
                ),
            )
            self._now_ended(turn_id)

    def set_hearing(self, hearing: bool) -> None:
        """This replica's listen to the others is (again) in place, or not. Back in place, their
        running turns count their silence from now: what was said meanwhile was not heard."""
        if hearing and not self.hearing:
            now = self.clock()
            for log in self._remote_running.values():
                log.heard_at = max(log.heard_at, now)
        self.hearing = hearing

    def heard_alive(self, turn_id: str) -> None:
        """Another replica says it still runs this turn."""
        log = self._remote_running.get(turn_id)
        if log is not None:
            log.heard_at = self.clock()

    def _now_ended(self, turn_id: str) -> None:
        self._ended[turn_id] = None
        self._remote_running.pop(turn_id, None)

    # -- reading -------------------------------------------------------------------------------
    def find(self, session_id: str, turn_id: str = "") -> TurnLog:
        """The turn's log, or the session's latest turn's; NotFound when none is kept."""
        self._expire(self.clock())
        log = self._logs.get(turn_id or self._latest.get(session_id, ""))
        if log is None or log.session_id != session_id:
            which = (
                f"turn {turn_id} of session {session_id} is not" if turn_id else f"no turn of session {session_id} is"
            )
            raise NotFound(
                f"{which} kept by this Agent (a turn's events are kept {self.keep_s:g}s after it "
                "ends; with several Agent replicas, PALIMPSEST_REPLICA_EVENTS lets each keep the others')"
            )
        return log

    async def open(self, session_id: str, turn_id: str, after_seq: int, *, catch_up_s: float) -> TurnLog:
        """The log a resume from ``after_seq`` reads, checked. ``catch_up_s``: how long to wait for
        another replica's events to arrive here (the client may have seen them from there first)."""
        deadline = self.clock() + catch_up_s
        while True:
            news = self._news
            log = None
            if turn_id in self._lost:
                raise self._lost[turn_id]
            try:
                log = self.find(session_id, turn_id)
                log.check(after_seq)
                return log
            except (NotFound, Ahead):
                left = deadline - self.clock()
                if left <= 0 or (log is not None and log.local):  # this replica's own turn: nothing to wait for
                    raise
                try:
                    await asyncio.wait_for(news.wait(), left)
                except asyncio.TimeoutError:
                    pass

    async def follow(self, log: TurnLog, after_seq: int) -> AsyncIterator[bytes]:
        """The events after ``after_seq`` and then each as it comes, to the turn's end, serialized
        and one at a time (a reader that stops holds one event). A reader that falls behind what
        is kept gets Behind; a reader of another replica's turn whose replica is lost, NotFound."""
        seq = after_seq
        log.readers += 1
        try:
            while True:
                if log.released and log.failure is not None:
                    raise log.failure  # lost with its replica: that, whatever was left to read
                log.check_reader(seq)
                if seq < log.last_seq:
                    seq += 1
                    yield log.event(seq)
                    continue
                if log.ended:
                    if log.failure is not None:
                        raise log.failure
                    return
                if log.local:
                    await log.more(None)
                    continue
                left = log.heard_at + LOST_AFTER_S - self.clock()  # until its replica is taken for lost
                if left <= 0 and self.hearing:
                    self._expire(self.clock())  # lost: the next look says so
                    continue
                try:
                    await log.more(left if left > 0 else LOST_AFTER_S)  # (not hearing: look again later)
                except asyncio.TimeoutError:
                    pass
        finally:
            log.readers -= 1

    # -- forgetting ----------------------------------------------------------------------------
    def _expire(self, now: float) -> None:
        expired = []
        for turn_id in self._ended:  # in the order they ended
            log = self._logs.get(turn_id)
            if log is not None and log.ended_at is not None and log.ended_at + self.keep_s > now:
                break
            if log is None or not log.readers:  # (one still read goes once its readers are done)
                expired.append(turn_id)
        for turn_id in expired:
            self._forget(turn_id)
        if not self.hearing:
            return  # the others' silence is this replica's deafness
        for log in [log for log in self._remote_running.values() if log.heard_at + LOST_AFTER_S <= now]:
            lost = NotFound(
                f"turn {log.turn_id} runs on another Agent replica, not heard of for "
                f"{now - log.heard_at:.0f}s: it is lost with that replica; the session has what "
                "the turn stored"
            )
            self._lost[log.turn_id] = lost
            if len(self._lost) > LOST_REMEMBERED:
                self._lost.popitem(last=False)
            self._forget(log.turn_id, lost)

    def _within_budget(self) -> None:
        if self.bytes <= self.budget_bytes:
            return
        # Down to a sixteenth under the budget, so the next events do not each look for the largest.
        floor = self.budget_bytes - self.budget_bytes // 16
        # Ended turns no one reads go first, the oldest first; then the largest turn gives up its
        # oldest events, never its newest (a reader keeping up gets it, however large); then ended
        # turns still being read (by readers far behind: they are told so).
        unread = [turn_id for turn_id in self._ended if not getattr(self._logs.get(turn_id), "readers", 0)]
        for turn_id in unread:
            if self.bytes <= floor:
                return
            self._forget(turn_id)
        while self.bytes > floor:
            largest = max((log for log in self._logs.values() if log.kept > 1), key=lambda log: log.bytes, default=None)
            if largest is None:
                break
            self.bytes -= largest.drop_oldest()
        while self.bytes > floor and self._ended:
            self._forget(next(iter(self._ended)))

    def _forget(self, turn_id: str, failure: Exception | None = None) -> None:
        self._ended.pop(turn_id, None)
        self._remote_running.pop(turn_id, None)
        log = self._logs.pop(turn_id, None)
        if log is None:
            return
        self.bytes -= log.bytes
        if self._latest.get(log.session_id) == turn_id:
            del self._latest[log.session_id]
        log.release(failure)

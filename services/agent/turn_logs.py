"""A turn's events, kept for the client that lost its stream: ResumeStream replays what it missed
and follows the turn live to its stream_end.

- One log per turn: an unbroken run of its events by seq, ``first_seq`` to ``last_seq``. What a
  reader is given is always whole: a reader asking for events older than the run is told so
  (``Gone``), never handed a stream with a hole in it. Events from another replica's turn come over
  the session bus, at most once: one that skips a seq starts the run again from itself.
- Kept while the turn runs and ``keep_s`` after it ends. A turn on another replica that sends
  nothing for ``keep_s`` is taken for lost with its replica.
- Every log together within ``budget_bytes``: ended turns go first, the oldest first; then the
  largest running turn gives up its oldest events.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable

from palimpsest.v1 import agent_pb2 as pb
from services.shared.errors import NotFound, OutOfRange, Unavailable


class TurnLog:
    def __init__(self, session_id: str, turn_id: str, *, local: bool, first_seq: int, now: float):
        self.session_id = session_id
        self.turn_id = turn_id
        self.local = local  # run by this replica (else heard over the session bus)
        # A list read from ``_start`` on (trimming the front is a step of the index, and a follower
        # slices only what is new to it); compacted when half of it is dead.
        self._events: list[pb.AgentEvent] = []
        self._sizes: list[int] = []
        self._start = 0
        self.first_seq = first_seq  # the seq of the oldest kept event; the next expected one while none is
        self.bytes = 0
        self.ended_at: float | None = None
        self.heard_at = now
        self._more = asyncio.Event()

    @property
    def kept(self) -> int:
        return len(self._events) - self._start

    @property
    def last_seq(self) -> int:
        return self.first_seq + self.kept - 1

    def after(self, seq: int) -> list[pb.AgentEvent]:
        return self._events[self._start + seq + 1 - self.first_seq:]

    def _clear(self, next_seq: int) -> None:
        self._events, self._sizes, self._start = [], [], 0
        self.first_seq, self.bytes = next_seq, 0

    @property
    def ended(self) -> bool:
        return self.ended_at is not None

    def _pulse(self) -> None:
        """Wake every reader waiting for more (each waits on the event it found)."""
        self._more.set()
        self._more = asyncio.Event()

    def add(self, event: pb.AgentEvent, size: int, now: float) -> int:
        """Append; the bytes this log grew (or shrank, when a gap restarted it) by."""
        grown = size
        if event.seq <= self.last_seq:
            return 0  # heard twice
        if event.seq != self.last_seq + 1:  # the bus lost some: keep what is whole from here
            grown -= self.bytes
            self._clear(event.seq)
        self._events.append(event)
        self._sizes.append(size)
        self.bytes += size
        self.heard_at = now
        if event.HasField("stream_end") and not event.is_subagent:
            self.ended_at = now
        self._pulse()
        return grown

    def drop_oldest(self) -> int:
        """The oldest event goes (readers still behind it are told they fell behind); its bytes."""
        size = self._sizes[self._start]
        self._start += 1
        self.first_seq += 1
        self.bytes -= size
        if self._start * 2 > len(self._events):
            del self._events[:self._start], self._sizes[:self._start]
            self._start = 0
        self._pulse()
        return size

    def release(self) -> None:
        """Forgotten: readers still following are told on their next look (behind what is kept,
        or, having it all, at the end)."""
        self._clear(self.last_seq + 1)
        self._pulse()

    def end(self, now: float) -> None:
        if self.ended_at is None:
            self.ended_at = now
            self._pulse()

    def check(self, after_seq: int) -> None:
        """OutOfRange unless every event after ``after_seq`` is here or still to come."""
        if after_seq + 1 < self.first_seq:
            raise OutOfRange("after_seq", f"events of turn {self.turn_id} are kept from seq {self.first_seq} on; "
                                          f"{after_seq + 1} is gone (the session's history has what the turn stored)")
        if after_seq > self.last_seq and (self.ended or self.kept):
            raise OutOfRange("after_seq", f"turn {self.turn_id} is at seq {self.last_seq}")

    async def follow(self, after_seq: int, *, silence_s: float | None) -> AsyncIterator[pb.AgentEvent]:
        """The events after ``after_seq`` and then each as it comes, to the turn's end. A reader
        that falls behind what is kept gets OutOfRange; ``silence_s``: how long the turn may send
        nothing before it is taken for lost (None: never, the turn runs here)."""
        seq = after_seq
        while True:
            more = self._more
            self.check(seq)
            for event in self.after(seq):  # a copy: whole, whatever is trimmed meanwhile
                yield event
                seq = event.seq
            if self.ended and seq >= self.last_seq:
                return
            if seq < self.last_seq:
                continue  # more arrived while the last one was being sent
            try:
                await asyncio.wait_for(more.wait(), silence_s)
            except asyncio.TimeoutError:
                raise Unavailable(f"turn {self.turn_id} runs on another Agent replica, which has sent nothing "
                                  f"for {silence_s:g}s: it may have stopped; the session's history has "
                                  "what the turn stored") from None


class TurnLogs:
    def __init__(self, keep_s: float, budget_bytes: int, clock: Callable[[], float] = time.monotonic):
        self.keep_s = keep_s
        self.budget_bytes = budget_bytes
        self.clock = clock
        self._logs: dict[str, TurnLog] = {}
        self._latest: dict[str, str] = {}  # session id -> its latest turn's id
        self._ended: OrderedDict[str, None] = OrderedDict()  # ended turns, in the order they ended
        self._remote_running: dict[str, TurnLog] = {}  # other replicas' turns not ended yet
        self.bytes = 0

    def record(self, event: pb.AgentEvent, *, local: bool) -> None:
        """A turn's event (seq 0 events are for watchers only, not a turn's stream)."""
        if not event.turn_id or event.seq <= 0:
            return
        now = self.clock()
        log = self._logs.get(event.turn_id)
        if log is None:
            self._expire(now)
            log = self._logs[event.turn_id] = TurnLog(event.session_id, event.turn_id, local=local,
                                                       first_seq=event.seq, now=now)
            self._latest[event.session_id] = event.turn_id
            if not local:
                self._remote_running[event.turn_id] = log
        was_ended = log.ended
        self.bytes += log.add(event, event.ByteSize(), now)
        if log.ended and not was_ended:
            self._now_ended(log.turn_id)
        self._within_budget()

    def ended(self, turn_id: str) -> None:
        """This replica's turn is over (a turn that failed before its stream_end ends here too)."""
        log = self._logs.get(turn_id)
        if log is not None and not log.ended:
            log.end(self.clock())
            self._now_ended(turn_id)

    def _now_ended(self, turn_id: str) -> None:
        self._ended[turn_id] = None
        self._remote_running.pop(turn_id, None)

    def find(self, session_id: str, turn_id: str = "") -> TurnLog:
        """The turn's log, or the session's latest turn's; NotFound when none is kept."""
        self._expire(self.clock())
        log = self._logs.get(turn_id or self._latest.get(session_id, ""))
        if log is None or log.session_id != session_id:
            which = (f"turn {turn_id} of session {session_id} is not" if turn_id
                     else f"no turn of session {session_id} is")
            raise NotFound(f"{which} kept by this Agent (a turn's events are kept {self.keep_s:g}s after it "
                           "ends; with several Agent replicas, PALIMPSEST_REPLICA_EVENTS lets each keep the others')")
        return log

    def silence_s(self, log: TurnLog) -> float | None:
        return None if log.local else self.keep_s

    def _expire(self, now: float) -> None:
        while self._ended:
            turn_id = next(iter(self._ended))
            log = self._logs.get(turn_id)
            if log is not None and log.ended_at is not None and log.ended_at + self.keep_s > now:
                break
            self._forget(turn_id)
        for log in [log for log in self._remote_running.values() if log.heard_at + self.keep_s <= now]:
            self._forget(log.turn_id)  # its replica went silent: lost with it

    def _within_budget(self) -> None:
        while self.bytes > self.budget_bytes:
            if self._ended:
                self._forget(next(iter(self._ended)))
                continue
            largest = max((log for log in self._logs.values() if log.kept), key=lambda log: log.bytes,
                          default=None)
            if largest is None:
                return
            self.bytes -= largest.drop_oldest()

    def _forget(self, turn_id: str) -> None:
        self._ended.pop(turn_id, None)
        self._remote_running.pop(turn_id, None)
        log = self._logs.pop(turn_id, None)
        if log is None:
            return
        self.bytes -= log.bytes
        if self._latest.get(log.session_id) == turn_id:
            del self._latest[log.session_id]
        log.release()

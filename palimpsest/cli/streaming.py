"""Running one stream of AgentEvents with Ctrl-C semantics: the first press stops the turn, the second leaves.

The SIGINT handler never raises into the middle of rendering: it only asks the Agent to stop (from a
thread, so the handler returns at once) or cancels the call, and the loop below sees the stream end.

A turn outlives its stream: when the connection drops mid-turn, pal asks the Agent (ResumeStream) for
the events after the last one it showed and goes on rendering, trying again for a while when the Agent
is not reachable yet.

With client tools (`--client-tools`), each `tool_call_requested` event is handed to the runner, which
answers it from a thread of its own; a resumed stream that shows a request again is answered once.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Protocol

import grpc

from palimpsest.cli.client_tools import ClientToolRunner
from palimpsest.cli.errors import ServiceError
from palimpsest.cli.render import TurnOutcome, TurnRenderer
from palimpsest.v1 import agent_pb2, agent_pb2_grpc

# Stop is asked on Ctrl-C, with the turn still streaming: an Agent that does not answer it soon has the
# call cancelled instead, rather than the turn running on for the unary deadline.
STOP_TIMEOUT_S = 5.0
# A dropped stream is resumed after these waits, one per try (about 15 s in all: an Agent restarting,
# a connection re-established); a try that brings events starts the count again.
RESUME_WAITS_S = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
# What a dropped connection looks like from here; other failures are the Agent's answer.
DROPPED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)


class EventStream(Protocol):
    """A server stream of AgentEvents: the generated stub's call, or the GuardedStream pal wraps it in."""

    def __iter__(self) -> Iterator[agent_pb2.AgentEvent]: ...

    def cancel(self) -> bool: ...


@dataclass
class StreamResult:
    outcome: TurnOutcome
    # Ctrl-C presses during the stream: 1 stopped the turn, 2 or more mean the user wants out.
    interrupts: int = 0

    @property
    def leave(self) -> bool:
        return self.interrupts >= 2

    @property
    def exit_code(self) -> int:
        """0 completed, 130 stopped by the user (the shell's code for SIGINT), 1 failed."""
        if self.interrupts:
            return 130
        if self.outcome.failed:
            return 1
        return 0


def stream_turn(
    agent: agent_pb2_grpc.AgentStub,
    open_stream: Callable[[], EventStream],
    renderer: TurnRenderer,
    session_id: str = "",
    *,
    require_end: bool = True,
    tools: ClientToolRunner | None = None,
) -> StreamResult:
    """Render the stream until it ends; `require_end`: a stream without stream_end is an error;
    `tools`: answers the calls of the client's tools."""
    result = StreamResult(renderer.outcome)
    stream = open_stream()
    cancelled = threading.Event()  # by the user: no stream of this turn is opened again

    def cancel() -> None:
        cancelled.set()
        stream.cancel()

    def stop_turn(target: str) -> None:
        renderer.note("stopping the turn… (Ctrl-C again to leave)")
        try:
            stopped = agent.Stop(agent_pb2.StopRequest(session_id=target), timeout=STOP_TIMEOUT_S).stopped
        except ServiceError:
            stopped = False
        if not stopped:
            # Nothing was stoppable by id (the turn had not started yet): cancelling the call stops it.
            cancel()

    stoppers: list[threading.Thread] = []

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        result.interrupts += 1
        target = renderer.outcome.session_id or session_id
        if result.interrupts == 1 and target:
            stoppers.append(threading.Thread(target=stop_turn, args=(target,), daemon=True))
            stoppers[-1].start()
        else:
            cancel()

    position = _Position()
    cut: ServiceError | None = None  # the failure that dropped the turn's stream, while resuming it
    tries = 0
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        with renderer:
            while True:
                try:
                    for event in stream:
                        position.saw(event)
                        tries = 0
                        renderer.handle(event)
                        if tools is not None and event.HasField("tool_call_requested"):
                            tools.requested(event)
                    break
                except ServiceError as err:
                    if err.code == grpc.StatusCode.CANCELLED and result.interrupts:
                        break  # the user's Ctrl-C
                    if renderer.outcome.ended:
                        break  # stream_end came first, and it alone says the turn is complete
                    if not position.seq:
                        raise
                    where = renderer.outcome.session_id or session_id
                    if cut is not None and err.code not in DROPPED:  # the Agent answered: not resumable
                        raise ServiceError(f"{cut} (resuming it: {err})", cut.code, cut.details).interrupted_turn(
                            where
                        ) from None
                    if (
                        err.code not in DROPPED
                        or not position.turn_id
                        or tries == len(RESUME_WAITS_S)
                        or cancelled.is_set()
                    ):
                        # Cut mid-turn: what arrived is on screen, and the session holds what the
                        # Agent kept of the turn.
                        raise (cut or err).interrupted_turn(where) from None
                    if cut is None:
                        cut = err
                        renderer.note(f"{err} · resuming the turn…")
                    if cancelled.wait(RESUME_WAITS_S[tries]):
                        break  # Ctrl-C twice while waiting: the user leaves
                    tries += 1
                    stream = agent.ResumeStream(
                        agent_pb2.ResumeStreamRequest(
                            session_id=position.session_id, turn_id=position.turn_id, after_seq=position.seq
                        )
                    )
            if result.interrupts and not renderer.outcome.ended:
                renderer.note("■ turn stopped")
    finally:
        if tools is not None:
            tools.close()  # a command still running when the turn ended is answering no one
        signal.signal(signal.SIGINT, previous)
        for stopper in stoppers:  # its Stop answered (or timed out): no call left in flight behind the turn
            stopper.join(STOP_TIMEOUT_S)
    if require_end and not result.interrupts and not renderer.outcome.ended:
        closed = ServiceError("the Agent closed the stream before the turn ended", grpc.StatusCode.UNKNOWN, "")
        raise closed.interrupted_turn(renderer.outcome.session_id or session_id)
    return result


@dataclass
class _Position:
    """Where in its turn the stream got to: what a resume asks from."""

    session_id: str = ""
    turn_id: str = ""
    seq: int = 0

    def saw(self, event: agent_pb2.AgentEvent) -> None:
        self.session_id = event.session_id or self.session_id
        self.turn_id = event.turn_id or self.turn_id
        self.seq = max(self.seq, event.seq)

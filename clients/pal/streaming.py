"""Running one stream of AgentEvents with Ctrl-C semantics: the first press stops the turn, the second leaves.

The SIGINT handler never raises into the middle of rendering: it only asks the Agent to stop (from a
thread, so the handler returns at once) or cancels the call, and the loop below sees the stream end.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

import grpc

from clients.pal.connection import GuardedStream
from clients.pal.errors import ServiceError
from clients.pal.render import TurnOutcome, TurnRenderer
from palimpsest.v1 import agent_pb2, agent_pb2_grpc

# Stop is asked on Ctrl-C, with the turn still streaming: an Agent that does not answer it soon has the
# call cancelled instead, rather than the turn running on for the unary deadline.
STOP_TIMEOUT_S = 5.0


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
    open_stream: Callable[[], GuardedStream],
    renderer: TurnRenderer,
    session_id: str = "",
    *,
    require_end: bool = True,
) -> StreamResult:
    """Render the stream until it ends; `require_end`: a stream without stream_end is an error."""
    result = StreamResult(renderer.outcome)
    stream = open_stream()

    def stop_turn(target: str) -> None:
        renderer.note("stopping the turn… (Ctrl-C again to leave)")
        try:
            stopped = agent.Stop(agent_pb2.StopRequest(session_id=target), timeout=STOP_TIMEOUT_S).stopped
        except ServiceError:
            stopped = False
        if not stopped:
            # Nothing was stoppable by id (the turn had not started yet): cancelling the call stops it.
            stream.cancel()

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        result.interrupts += 1
        target = renderer.outcome.session_id or session_id
        if result.interrupts == 1 and target:
            threading.Thread(target=stop_turn, args=(target,), daemon=True).start()
        else:
            stream.cancel()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        with renderer:
            began = False
            try:
                for event in stream:
                    began = True
                    renderer.handle(event)
            except ServiceError as err:
                if err.code == grpc.StatusCode.CANCELLED and result.interrupts:
                    pass  # the user's Ctrl-C
                elif renderer.outcome.ended:
                    pass  # stream_end came first, and it alone says the turn is complete
                elif began:
                    # Cut mid-turn (the Agent or the network went away): what arrived is on screen,
                    # and the session holds what the Agent kept of the turn.
                    raise err.interrupted_turn(renderer.outcome.session_id or session_id) from None
                else:
                    raise
            if result.interrupts and not renderer.outcome.ended:
                renderer.note("■ turn stopped")
    finally:
        signal.signal(signal.SIGINT, previous)
    if require_end and not result.interrupts and not renderer.outcome.ended:
        closed = ServiceError("the Agent closed the stream before the turn ended", grpc.StatusCode.UNKNOWN, "")
        raise closed.interrupted_turn(renderer.outcome.session_id or session_id)
    return result

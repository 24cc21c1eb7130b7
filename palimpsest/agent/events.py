"""Building AgentEvents: one small constructor per kind, so the loop reads like the behaviour."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import compressor_pb2

AgentEvent = pb.AgentEvent


@dataclass
class EventSink:
    """Where a turn puts its events: ``publish`` hands each to the turn's kept log (which its
    RunStream reads), the session's watchers and the other replicas. Sub-agents share their
    parent's. With no ``publish`` (RunEphemeral) events go nowhere: only the result is answered."""

    session_id: str = ""
    is_subagent: bool = False
    _seq: list[int] = field(default_factory=lambda: [0])  # shared with sub-sinks: one numbering per turn
    publish: Callable[[AgentEvent], None] | None = None
    # The turn the events belong to (their seqs count within it): what a client resumes by.
    turn_id: str = ""

    def emit(self, **kind: Any) -> AgentEvent:
        self._seq[0] += 1
        event = AgentEvent(
            session_id=self.session_id, seq=self._seq[0], is_subagent=self.is_subagent, turn_id=self.turn_id, **kind
        )
        if self.publish is not None:
            self.publish(event)
        return event

    def announce(self, **kind: Any) -> AgentEvent:
        """An event for the session's watchers only: the turn's own stream does not carry it, and
        it takes no number of the turn's (seq 0)."""
        event = AgentEvent(session_id=self.session_id, is_subagent=self.is_subagent, turn_id=self.turn_id, **kind)
        if self.publish is not None:
            self.publish(event)
        return event

    def for_subagent(self) -> "EventSink":
        return EventSink(self.session_id, True, self._seq, self.publish, self.turn_id)

    def text(self, text: str) -> None:
        self.emit(text_delta=pb.TextDelta(text=text))

    def thinking(self, text: str) -> None:
        self.emit(thinking_delta=pb.ThinkingDelta(text=text))

    def thinking_end(self) -> None:
        self.emit(thinking_end=pb.ThinkingEnd())

    def tool_started(self, call_id: str, name: str, arguments_json: str) -> None:
        self.emit(tool_started=pb.ToolStarted(call_id=call_id, name=name, arguments_json=arguments_json))

    def tool_call_requested(self, call_id: str, name: str, arguments_json: str, timeout_seconds: int) -> None:
        self.emit(
            tool_call_requested=pb.ToolCallRequested(
                call_id=call_id, name=name, arguments_json=arguments_json, timeout_seconds=timeout_seconds
            )
        )

    def tool_finished(self, call_id: str, name: str, preview: str, is_error: bool, elapsed: float) -> None:
        self.emit(
            tool_finished=pb.ToolFinished(
                call_id=call_id, name=name, preview=preview, is_error=is_error, elapsed_seconds=elapsed
            )
        )

    def model_info(self, model: str, window: int, requested: int = 0) -> None:
        """The model and the window of the turn; ``requested``: a larger window the profile asked for."""
        self.emit(model_info=pb.ModelInfo(model=model, context_window=window, requested_context_window=requested))

    def usage(
        self, context_tokens: int, window: int, prompt_tokens: int, completion_tokens: int, count_method: str = ""
    ) -> None:
        self.emit(
            usage=pb.Usage(
                context_tokens=context_tokens,
                max_context_tokens=window,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                count_method=count_method,
            )
        )

    def compression(self, event: compressor_pb2.CompressionEvent, *, watchers_only: bool = False) -> AgentEvent | None:
        """A Compressor event as the turn's own (or, after its stream_end, the watchers' only)."""
        send = self.announce if watchers_only else self.emit
        if event.HasField("started"):
            return send(compression_started=event.started)
        if event.HasField("compressed"):
            return send(context_compressed=event.compressed)
        return None

    def planning_status(self, status: str) -> None:
        self.emit(planning_status=pb.PlanningStatus(status=status))

    def plan_ready(self, plan: str, steps: list[str], complexity: str) -> None:
        self.emit(plan_ready=pb.PlanReady(plan=plan, steps=steps, complexity=complexity))

    def todo_updated(self, items: list[pb.TodoItem]) -> None:
        self.emit(todo_updated=pb.TodoUpdated(items=items))

    def file_shared(self, shared: pb.FileShared) -> None:
        self.emit(file_shared=shared)

    def error(self, code: str, message: str) -> None:
        self.emit(error=pb.ErrorEvent(code=code, message=message))

    def stream_end(self, reason: pb.StreamEndReason, text: str) -> AgentEvent:
        return self.emit(stream_end=pb.StreamEnd(reason=reason, text=text))

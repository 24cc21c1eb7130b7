"""Live rendering of a turn's AgentEvents.

People get rich output: text as it arrives, thinking dimmed, tool calls as cards, a spinner while the
model is in prefill, a compression card, a context meter, the plan and todo list when they change.
Scripts get one JSON object per event. Both keep the same TurnOutcome, so commands decide their exit
status the same way in either mode.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, Self

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from palimpsest.cli.output import Output
from palimpsest.v1 import agent_pb2, compressor_pb2

AgentEvent = agent_pb2.AgentEvent
REASON_NAMES = {
    agent_pb2.STREAM_END_REASON_COMPLETED: "completed",
    agent_pb2.STREAM_END_REASON_STOPPED: "stopped",
    agent_pb2.STREAM_END_REASON_MAX_ITERATIONS: "stopped at the iteration limit",
    agent_pb2.STREAM_END_REASON_CONTEXT_TOO_LARGE: "the context is too large for the model",
    agent_pb2.STREAM_END_REASON_ERROR: "ended with an error",
}
WAITING = "waiting for the model"
# Enough of a tool result to recognise it; the full result is in the session history.
PREVIEW_LINES = 8
PREVIEW_CHARS = 800
ARGS_CHARS = 160


def shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def preview_of(text: str, lines: int = PREVIEW_LINES, chars: int = PREVIEW_CHARS) -> str:
    """The first `lines` lines and at most `chars` characters, with an ellipsis where text was cut."""
    kept = text.strip().splitlines()
    clipped = shorten("\n".join(kept[:lines]), chars)
    return clipped + ("\n…" if len(kept) > lines and not clipped.endswith("…") else "")


def arguments_line(arguments_json: str) -> str:
    """`key=value, …` from the model's JSON arguments; the raw text when it is not an object."""
    try:
        args = json.loads(arguments_json) if arguments_json else {}
    except ValueError:
        return shorten(arguments_json, ARGS_CHARS)
    if not isinstance(args, dict):
        return shorten(json.dumps(args, ensure_ascii=False), ARGS_CHARS)
    parts = [f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args.items()]
    return shorten(", ".join(parts), ARGS_CHARS)


@dataclass
class TurnOutcome:
    """What a command needs to know once the stream is over."""

    session_id: str = ""
    reason: int = agent_pb2.STREAM_END_REASON_UNSPECIFIED
    text: str = ""
    errors: list[str] = field(default_factory=list)
    streamed_text: bool = False

    @property
    def ended(self) -> bool:
        return self.reason != agent_pb2.STREAM_END_REASON_UNSPECIFIED

    @property
    def failed(self) -> bool:
        return self.reason in (agent_pb2.STREAM_END_REASON_ERROR, agent_pb2.STREAM_END_REASON_CONTEXT_TOO_LARGE) or (
            bool(self.errors) and self.reason != agent_pb2.STREAM_END_REASON_COMPLETED
        )

    def observe(self, event: AgentEvent) -> None:
        if event.session_id:
            self.session_id = event.session_id
        kind = event.WhichOneof("event")
        if kind == "text_delta" and not event.is_subagent:
            self.streamed_text = True
        elif kind == "error":
            self.errors.append(event.error.message or event.error.code)
        elif kind == "stream_end" and not event.is_subagent:
            self.reason = event.stream_end.reason
            self.text = event.stream_end.text


@dataclass
class ContextMeter:
    """How full the model's window is, from the latest `usage` (or compression) event; kept across turns."""

    tokens: int = 0
    window: int = 0
    model: str = ""
    # Only a usage or compression event measures the context; model_info alone gives just the window.
    measured: bool = False

    @property
    def known(self) -> bool:
        return self.measured and self.window > 0

    def update(self, tokens: int, window: int) -> None:
        self.tokens = tokens
        self.measured = True
        if window > 0:
            self.window = window

    def renderable(self) -> RenderableType:
        share = self.tokens / self.window if self.window else 0.0
        # The Compressor's default threshold is 0.90: red means compression is due.
        color = "green" if share < 0.7 else "yellow" if share < 0.9 else "red"
        grid = Table.grid(padding=(0, 1))
        grid.add_row(
            Text("context", style="dim"),
            ProgressBar(
                total=max(self.window, 1),
                completed=min(self.tokens, self.window),
                width=24,
                complete_style=color,
                finished_style=color,
            ),
            Text(f"{self.tokens:,} / {self.window:,} tokens ({share:.0%})", style=color),
            Text(self.model, style="dim"),
        )
        return grid


def tool_card(started: agent_pb2.ToolStarted | None, finished: agent_pb2.ToolFinished, subagent: bool) -> Panel:
    title = ("sub-agent · " if subagent else "") + f"⚙ {finished.name or (started.name if started else 'tool')}"
    body: list[RenderableType] = []
    if started is not None and started.arguments_json:
        body.append(Text(arguments_line(started.arguments_json), style="dim"))
    preview = preview_of(finished.preview)
    if preview:
        body.append(Text(preview, style="red" if finished.is_error else ""))
    status = "failed" if finished.is_error else "done"
    return Panel(
        Group(*body) if body else Text("(no output)", style="dim"),
        title=title,
        title_align="left",
        subtitle=f"{status} · {finished.elapsed_seconds:.1f}s",
        subtitle_align="right",
        border_style="red" if finished.is_error else "cyan",
    )


def file_line(shared: agent_pb2.FileShared) -> Text:
    """A file a tool offered: what it is, and the command that fetches it."""
    what = f"{shared.title} · " if shared.title else ""
    how = f"to view ({shared.viewer}{', sandboxed' if shared.sandbox else ''})" if shared.viewer else "to download"
    return Text(
        f"📎 {what}{shared.name} · {shared.content_type} · {shared.size:,} bytes · {how}: pal files get {shared.link}",
        style="green",
    )


def compressed_tokens(event: compressor_pb2.ContextCompressed) -> int:
    """The prompt's size after a compression: the whole prompt from servers that say it."""
    return event.tokens_after or event.context_tokens


def compression_card(event: compressor_pb2.ContextCompressed) -> Panel:
    now = compressed_tokens(event)
    line = f"now {now:,} / {event.max_context_tokens:,} tokens" if event.max_context_tokens else f"now {now:,} tokens"
    if event.tokens_before > now:
        line += f" (freed {event.tokens_before - now:,})"
    lines = [line]
    if event.shortfall:
        lines.append(event.shortfall)
    if event.method == compressor_pb2.COMPRESSION_METHOD_HARD_TRUNCATE:
        lines.append("the summarizer failed: the oldest turns were dropped instead")
    if event.summary:
        lines.append(shorten(event.summary.strip(), 400))
    return Panel(
        Text("\n".join(lines), style="dim"),
        title=f"Context compressed: {event.messages_before} → {event.messages_after} messages",
        title_align="left",
        border_style="yellow",
    )


def plan_card(plan: agent_pb2.PlanReady) -> Panel:
    body = Text()
    if plan.plan:
        body.append(plan.plan.strip() + "\n")
    for number, step in enumerate(plan.steps, 1):
        body.append(f"{number}. {step}\n")
    body.rstrip()  # in place
    title = "Plan" + (f" · {plan.complexity}" if plan.complexity else "")
    return Panel(
        body if body.plain else Text("(empty)", style="dim"), title=title, title_align="left", border_style="magenta"
    )


_TODO_MARKS = {"done": ("✔", "green"), "in_progress": ("▶", "yellow"), "pending": ("○", "")}


def todo_card(items: list[agent_pb2.TodoItem]) -> Panel:
    body = Text()
    for item in items:
        mark, style = _TODO_MARKS.get(item.status, ("○", ""))
        body.append(f"{mark} {item.text}\n", style=style)
    body.rstrip()  # in place
    done = sum(1 for item in items if item.status == "done")
    return Panel(
        body if body.plain else Text("(empty)", style="dim"),
        title=f"Todo · {done}/{len(items)} done",
        title_align="left",
        border_style="magenta",
    )


class TurnRenderer(Protocol):
    """Consumes one stream of events; used as a context manager around the stream."""

    outcome: TurnOutcome

    def handle(self, event: AgentEvent) -> None: ...

    def note(self, text: str) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...


class JsonTurn:
    """One JSON object per event on stdout; remarks go to stderr so stdout stays parseable."""

    def __init__(self, output: Output) -> None:
        self.output = output
        self.outcome = TurnOutcome()

    def handle(self, event: AgentEvent) -> None:
        self.outcome.observe(event)
        if event.WhichOneof("event") is None:
            # A kind from a newer server (its fields unknown here): a line with no kind would only
            # trip scripts that look for one, so it is skipped, as LiveTurn skips it.
            return
        self.output.emit(event)

    def note(self, text: str) -> None:
        self.output.note(text)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class LiveTurn:
    """Rich rendering: finished pieces are printed for good, the live area holds what is in flight."""

    _STYLES: ClassVar[dict[str, str]] = {"text": "", "thinking": "dim italic", "subagent": "dim"}

    def __init__(self, console: Console, meter: ContextMeter | None = None, status: str = WAITING) -> None:
        self.console = console
        self.meter = meter or ContextMeter()
        self.outcome = TurnOutcome()
        self._partial = ""
        self._kind = "text"
        self._status: str | None = status
        self._tools: dict[str, agent_pb2.ToolStarted] = {}
        self._started_at: dict[str, float] = {}
        self._plan = b""  # nothing shown yet: an empty plan or todo is not news
        self._todo = b""
        self._meter_moved = False
        self._live = Live(
            console=console,
            get_renderable=self._render,
            refresh_per_second=10,
            transient=False,
            redirect_stdout=False,
            redirect_stderr=False,
        )

    # -- the live area -------------------------------------------------------------------------
    def _render(self) -> RenderableType:
        parts: list[RenderableType] = []
        if self._partial:
            parts.append(self._line(self._partial, self._kind))
        for call_id, started in list(self._tools.items()):
            elapsed = time.monotonic() - self._started_at.get(call_id, time.monotonic())
            label = f"{started.name} {arguments_line(started.arguments_json)} ({elapsed:.0f}s)"
            parts.append(Spinner("dots", Text(label, style="cyan")))
        if self._status and not self._tools:
            parts.append(Spinner("dots", Text(self._status, style="dim")))
        if self.meter.known:
            parts.append(self.meter.renderable())
        return Group(*parts)

    def _line(self, text: str, kind: str) -> Text:
        prefix = "│ " if kind == "subagent" else ""
        return Text(prefix + text, style=self._STYLES[kind])

    def _print(self, renderable: RenderableType | str, **kwargs: Any) -> None:
        # While the live area is up, printing through the console puts the line above it; the live
        # area is redrawn from the state at its last refresh, so refresh it at once.
        self.console.print(renderable, **kwargs)
        if self._live.is_started:
            self._live.refresh()

    def _flush(self) -> None:
        if self._partial:
            line, self._partial = self._partial, ""
            self._print(self._line(line, self._kind), soft_wrap=True)

    def _append(self, kind: str, delta: str) -> None:
        if kind != self._kind:
            self._flush()
            self._kind = kind
        self._status = None
        # Whole lines are printed for good, so a long answer never has to be redrawn.
        *lines, self._partial = (self._partial + delta).split("\n")
        for line in lines:
            self._print(self._line(line, kind), soft_wrap=True)

    # -- events ----------------------------------------------------------------------------------
    def handle(self, event: AgentEvent) -> None:
        self.outcome.observe(event)
        # None for a kind this pal does not know (a newer server's): no branch takes it, so it is skipped.
        kind = event.WhichOneof("event")
        sub = event.is_subagent
        if kind == "text_delta":
            self._append("subagent" if sub else "text", event.text_delta.text)
        elif kind == "thinking_delta":
            self._append("subagent" if sub else "thinking", event.thinking_delta.text)
        elif kind == "thinking_end":
            if self._kind == "thinking":
                self._flush()
        elif kind == "tool_started":
            self._flush()
            self._tools[event.tool_started.call_id] = event.tool_started
            self._started_at[event.tool_started.call_id] = time.monotonic()
        elif kind == "tool_finished":
            self._flush()
            started = self._tools.pop(event.tool_finished.call_id, None)
            self._print(tool_card(started, event.tool_finished, sub))
            self._status = WAITING
        elif kind == "model_info":
            self.meter.model = event.model_info.model
            if event.model_info.context_window and not self.meter.window:
                self.meter.window = event.model_info.context_window
            if event.model_info.requested_context_window:
                self.note(
                    f"the profile asks for a {event.model_info.requested_context_window:,}-token window; "
                    f"{event.model_info.model} was trained on {event.model_info.context_window:,}, "
                    "so that is what this turn uses"
                )
        elif kind == "usage":
            self.meter.update(event.usage.context_tokens, event.usage.max_context_tokens)
            self._meter_moved = True
        elif kind == "compression_started":
            self._flush()
            started_c = event.compression_started
            self._status = f"compressing the context ({started_c.context_tokens:,} tokens)"
        elif kind == "context_compressed":
            self._flush()
            self._print(compression_card(event.context_compressed))
            self.meter.update(compressed_tokens(event.context_compressed), event.context_compressed.max_context_tokens)
            self._meter_moved = True
            self._status = WAITING
        elif kind == "planning_status":
            self._status = f"planning: {event.planning_status.status}"
        elif kind == "plan_ready":
            key = event.plan_ready.SerializeToString(deterministic=True)
            if key != self._plan:
                self._plan = key
                self._flush()
                self._print(plan_card(event.plan_ready))
            self._status = WAITING
        elif kind == "todo_updated":
            key = event.todo_updated.SerializeToString(deterministic=True)
            if key != self._todo:
                self._todo = key
                self._flush()
                self._print(todo_card(list(event.todo_updated.items)))
        elif kind == "file_shared":
            self._flush()
            self._print(file_line(event.file_shared), soft_wrap=True)
        elif kind == "error":
            self._flush()
            code = f"{event.error.code}: " if event.error.code else ""
            self._print(Text(f"error: {code}{event.error.message}", style="bold red"), soft_wrap=True)
        elif kind == "stream_end" and not sub:
            self._end(event.stream_end)

    def _end(self, end: agent_pb2.StreamEnd) -> None:
        self._flush()
        self._status = None
        self._tools.clear()
        if not self.outcome.streamed_text and end.text:
            self._print(Text(end.text), soft_wrap=True)
        if end.reason != agent_pb2.STREAM_END_REASON_COMPLETED:
            # A reason from a newer server has no name here: its number still tells it apart.
            reason = REASON_NAMES.get(end.reason, f"ended (reason {end.reason})")
            style = (
                "yellow"
                if end.reason in (agent_pb2.STREAM_END_REASON_STOPPED, agent_pb2.STREAM_END_REASON_MAX_ITERATIONS)
                else "bold red"
            )
            self._print(Text(f"■ turn {reason}", style=style))

    def note(self, text: str) -> None:
        self._flush()
        self._print(Text(text, style="yellow"))

    def __enter__(self) -> Self:
        # A pipe or a file gets the finished pieces only: spinners there would be noise.
        if self.console.is_terminal:
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._flush()
        self._status = None
        self._tools.clear()
        if self._live.is_started:
            self._live.stop()  # leaves the last render (the context meter) on screen
        elif self.meter.known and self._meter_moved:
            self._print(self.meter.renderable())


def renderer_for(output: Output, meter: ContextMeter | None = None, status: str = WAITING) -> TurnRenderer:
    return JsonTurn(output) if output.json else LiveTurn(output.console, meter, status)

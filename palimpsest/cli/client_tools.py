"""Tools pal offers the model (`--client-tools tools.json`): programs run on the user's machine.

The file is a JSON list of tools, each {"name", "description", "parameters" (a JSON schema of an
object), "command": [argv…], "timeout_s" (30), "read_only" (false)}. pal declares them on the turn
(RunStreamRequest.client_tools); when the model calls one, the stream brings a `tool_call_requested`
event, pal runs the command with the call's arguments (JSON) on its stdin — no shell — and answers
with Agent.SubmitToolResult: stdout (at most 64 KB) is the result; a non-zero exit, a timeout or a
command that cannot start is an error result carrying the end of stderr.

Each call runs in a thread of its own, so the stream goes on being read (Ctrl-C still stops the
turn, a dropped stream is still resumed) and calls the model makes together run together.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import grpc
from jsonschema import Draft202012Validator, SchemaError

from palimpsest.cli.errors import CliError, ServiceError
from palimpsest.cli.render import shorten
from palimpsest.v1 import agent_pb2

DEFAULT_TIMEOUT_S = 30.0
# The Agent's ceiling on how long a turn waits for one answer (PALIMPSEST_CLIENT_TOOL_MAX_TIMEOUT_SECONDS).
MAX_TIMEOUT_S = 3600.0
# The turn waits this much longer than the slowest tool may run: room for pal's answer to arrive
# after a dropped connection, yet a pal that died leaves the turn waiting minutes, not the default 5.
ANSWER_MARGIN_S = 30
STDOUT_CAP = 64 * 1024
STDERR_TAIL = 2 * 1024
# How long pal reads a finished command's pipes before answering with what it has.
PIPE_DRAIN_S = 5.0
# A tool's answer retried while the Agent is unreachable (its stream is being resumed too).
SUBMIT_WAITS_S = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
# An answer is sent again on these: the Agent was out of reach, or the answer's acknowledgement was.
_RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
# Enough of a command line to recognise it in the line that says it runs.
COMMAND_CHARS = 100
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_FIELDS = {"name", "description", "parameters", "command", "timeout_s", "read_only"}


@dataclass(frozen=True)
class LocalTool:
    name: str
    description: str
    parameters: dict[str, Any]
    command: tuple[str, ...]
    timeout_s: float = DEFAULT_TIMEOUT_S
    read_only: bool = False

    def declaration(self) -> agent_pb2.ClientTool:
        return agent_pb2.ClientTool(
            name=self.name,
            description=self.description,
            parameters_json=json.dumps(self.parameters),
            read_only=self.read_only,
        )


def load_tools(path: str) -> list[LocalTool]:
    """The tools of a tools.json, checked: a CliError (exit 2) naming the file, the entry and the field."""
    try:
        raw = json.loads(Path(path).expanduser().read_text(encoding="utf-8"))
    except OSError as err:
        raise CliError(f"--client-tools: cannot read {path}: {err.strerror or err}", exit_code=2) from None
    except ValueError as err:
        raise CliError(f"--client-tools: {path} is not valid JSON: {err}", exit_code=2) from None
    if not isinstance(raw, list) or not raw:
        raise CliError(f"--client-tools: {path} must hold a non-empty JSON list of tools", exit_code=2)
    tools: list[LocalTool] = []
    for i, entry in enumerate(raw):
        tool = tool_from_entry(entry, f"{path}: tools[{i}]")
        if any(t.name == tool.name for t in tools):
            raise CliError(f"--client-tools: {path}: tools[{i}].name: {tool.name!r} is declared twice", exit_code=2)
        tools.append(tool)
    return tools


def tool_from_entry(entry: Any, where: str) -> LocalTool:
    def bad(name: str, why: str) -> CliError:
        return CliError(f"--client-tools: {where}.{name}: {why}", exit_code=2)

    if not isinstance(entry, dict):
        raise CliError(f"--client-tools: {where}: must be an object with name, parameters and command", exit_code=2)
    name = entry.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise bad("name", "required: 1 to 64 letters, digits, '_' or '-'")
    where = f"{where} ({name})"
    unknown = sorted(set(entry) - _FIELDS)
    if unknown:
        raise bad(unknown[0], f"unknown field (known: {', '.join(sorted(_FIELDS))})")
    description = entry.get("description", "")
    if not isinstance(description, str):
        raise bad("description", "must be a string")
    parameters = entry.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise bad("parameters", 'must be the JSON schema of an object: {"type": "object", "properties": {…}}')
    try:
        Draft202012Validator.check_schema(parameters)
    except SchemaError as err:
        raise bad("parameters", f"not a valid JSON schema: {err.message}") from None
    command = entry.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(a, str) and a for a in command):
        raise bad("command", 'required: the program and its arguments, e.g. ["python3", "weather.py"]')
    timeout = entry.get("timeout_s", DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT_S:
        raise bad("timeout_s", f"seconds, more than 0 and at most {MAX_TIMEOUT_S:.0f}")
    read_only = entry.get("read_only", False)
    if not isinstance(read_only, bool):
        raise bad("read_only", "must be true or false")
    return LocalTool(name, description, {"type": "object", **parameters}, tuple(command), float(timeout), read_only)


def add_client_tools_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--client-tools",
        dest="client_tools",
        type=_tools_flag,
        default=[],
        metavar="TOOLS.JSON",
        help="offer the model these local tools: a JSON list of {name, description, parameters, "
        "command, timeout_s, read_only}; pal runs the command with the call's arguments on stdin",
    )


def _tools_flag(path: str) -> list[LocalTool]:
    """A bad file is a usage error (exit 2) naming the entry and the field, before anything is sent."""
    try:
        return load_tools(path)
    except CliError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--client-tools: ")) from None


def declare(request: Any, tools: Sequence[LocalTool]) -> None:
    """Put the tools on a RunStreamRequest."""
    if tools:
        request.client_tools.extend(t.declaration() for t in tools)
        request.client_tool_timeout_seconds = answer_timeout_s(tools)


def runner_for(agent: Any, tools: Sequence[LocalTool], say: Callable[[str], None]) -> ClientToolRunner | None:
    """A runner for one turn, or None without tools."""
    return ClientToolRunner(agent, {t.name: t for t in tools}, say) if tools else None


def answer_timeout_s(tools: Sequence[LocalTool]) -> int:
    """How long the Agent should wait for an answer: the slowest tool's limit and a margin."""
    return int(min(MAX_TIMEOUT_S, max(t.timeout_s for t in tools) + ANSWER_MARGIN_S))


@dataclass(frozen=True)
class Outcome:
    content: str
    is_error: bool
    elapsed_s: float


def run_tool(
    tool: LocalTool, arguments_json: str, started: Callable[[subprocess.Popen[bytes]], None] = lambda proc: None
) -> Outcome:
    """Run the tool's command with the arguments on stdin; its stdout is the result."""
    begun = time.monotonic()

    def done(content: str, is_error: bool) -> Outcome:
        return Outcome(content, is_error, time.monotonic() - begun)

    try:
        # A session of its own: a timeout kills the command and whatever it started.
        proc = subprocess.Popen(
            tool.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
        )
    except OSError as err:
        return done(f"{tool.name}: cannot run {tool.command[0]}: {err.strerror or err}", True)
    started(proc)
    stdout = _Capped(proc.stdout, STDOUT_CAP, keep="head")
    stderr = _Capped(proc.stderr, STDERR_TAIL, keep="tail")
    try:
        assert proc.stdin is not None
        proc.stdin.write(arguments_json.encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass  # the command does not read its arguments: its answer still counts
    try:
        code = proc.wait(tool.timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        stdout.join()
        stderr.join()
        return done(f"{tool.name} timed out after {tool.timeout_s:g} s{_tail(stderr.text())}", True)
    stdout.join()
    stderr.join()
    if code != 0:
        why = f"killed by signal {-code}" if code < 0 else f"exited with status {code}"
        return done(f"{tool.name} {why}{_tail(stderr.text())}", True)
    content = stdout.text()
    if stdout.dropped:
        content += f"\n[output cut at {STDOUT_CAP // 1024} KB: {stdout.dropped:,} more bytes not shown]"
    return done(content, False)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _tail(stderr: str) -> str:
    return f": {stderr.strip()}" if stderr.strip() else ""


class _Capped:
    """Reads a pipe to its end in a thread, keeping its first (or last) `cap` bytes, so a chatty
    command neither fills pal's memory nor blocks on a full pipe."""

    def __init__(self, pipe: IO[bytes] | None, cap: int, keep: str) -> None:
        self.cap, self.keep = cap, keep
        self.head = bytearray()
        self.tail: collections.deque[bytes] = collections.deque()
        self.dropped = 0
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe: IO[bytes] | None) -> None:
        if pipe is None:
            return
        with pipe:
            while chunk := pipe.read1(65536):  # type: ignore[attr-defined]
                if self.keep == "head":
                    room = self.cap - len(self.head)
                    self.head += chunk[:room]
                    self.dropped += max(0, len(chunk) - room)
                else:
                    self.tail.append(chunk)
                    while sum(map(len, self.tail)) - len(self.tail[0]) >= self.cap:
                        self.tail.popleft()

    def join(self) -> None:
        # Bounded: a process the command left behind may hold the pipe open long after it exited.
        self._thread.join(PIPE_DRAIN_S)

    def text(self) -> str:
        data = bytes(self.head) if self.keep == "head" else b"".join(self.tail)[-self.cap :]
        return data.decode("utf-8", errors="replace")


@dataclass
class ClientToolRunner:
    """Answers the turn's `tool_call_requested` events: one thread per call, each call answered once,
    however often a resumed stream shows its request again."""

    agent: Any  # the guarded Agent stub
    tools: dict[str, LocalTool]
    say: Callable[[str], None]
    _seen: set[tuple[str, str]] = field(default_factory=set)
    _threads: list[threading.Thread] = field(default_factory=list)
    _running: set[subprocess.Popen[bytes]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closing: threading.Event = field(default_factory=threading.Event)

    def requested(self, event: agent_pb2.AgentEvent) -> None:
        asked = event.tool_call_requested
        key = (event.turn_id, asked.call_id)
        if key in self._seen:
            return
        self._seen.add(key)
        thread = threading.Thread(target=self._answer, args=(event,), name=f"pal-tool-{asked.name}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _answer(self, event: agent_pb2.AgentEvent) -> None:
        asked = event.tool_call_requested
        tool = self.tools.get(asked.name)
        if tool is None:  # the Agent asks only for declared tools; a newer one might not
            outcome = Outcome(f"{asked.name}: pal has no such tool", True, 0.0)
        else:
            self.say(f"⇢ {asked.name} asked of pal: running {shorten(' '.join(tool.command), COMMAND_CHARS)}")
            outcome = run_tool(tool, asked.arguments_json or "{}", self._track)
        if self._closing.is_set():
            return  # the turn is over (stopped, or pal is leaving): nobody waits for this answer
        request = agent_pb2.SubmitToolResultRequest(
            session_id=event.session_id,
            turn_id=event.turn_id,
            call_id=asked.call_id,
            content=outcome.content,
            is_error=outcome.is_error,
        )
        what = "failed" if outcome.is_error else f"{len(outcome.content.encode()):,} bytes"
        # Said before the answer goes, so it comes before the tool's card, which follows the answer.
        self.say(f"⇠ {asked.name} answered ({what}, {outcome.elapsed_s:.1f} s)")
        refused = self._submit(request)
        if refused:
            self.say(f"⇠ {asked.name}: the answer was not delivered: {refused}")

    def _track(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._running.add(proc)
        if self._closing.is_set():
            kill_group(proc)

    def _submit(self, request: agent_pb2.SubmitToolResultRequest) -> str:
        """Deliver the answer, trying again while the Agent is unreachable; why it was refused, or ""."""
        for attempt, wait in enumerate((*SUBMIT_WAITS_S, None)):
            try:
                self.agent.SubmitToolResult(request)
                return ""
            except ServiceError as err:
                if attempt and err.code == grpc.StatusCode.FAILED_PRECONDITION:
                    # The call no longer waits: an earlier try arrived and only its acknowledgement was
                    # lost (the Agent's own deadline is 30 s past the tool's, and a Stop ends the stream).
                    return ""
                if err.code not in _RETRIED or wait is None or self._closing.wait(wait):
                    return str(err)
        return ""

    def close(self) -> None:
        """The turn's stream is over: commands still running are killed, their answers dropped."""
        self._closing.set()
        with self._lock:
            running = list(self._running)
        for proc in running:
            if proc.poll() is None:
                kill_group(proc)
        for thread in self._threads:
            thread.join(5.0)

"""The session's audit log on the Agent's side: each tool run becomes a ToolRun record the moment it
starts, and the records wait on the turn's ToolRunLog until an append to the session carries them
(the one that stores the runs' results, in the normal case): auditing costs a turn no call of its
own. A sub-agent's runs go on its parent turn's log, so they are audited under the parent session.
The store redacts the arguments (as it redacts stored tool calls') and owns what is kept of them."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from palimpsest.agent.tools.base import ToolResult
from palimpsest.shared.errors import PalimpsestError
from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as store_pb

log = logging.getLogger("palimpsest.agent.audit")

Outcome = store_pb.ToolRunOutcome
NUL, REPLACEMENT = "\x00", "\ufffd"  # the store refuses NUL; a tool's output may hold one
# What a record says of a failure: enough to know why, the whole text is in the stored result.
ERROR_CHARS = 300
CUT_SHORT = "cut short: the turn was stopped or ended before the tool answered"


def outcome_of(result: ToolResult) -> store_pb.ToolRunOutcome:
    """How a run ended, as the log names it. A rule that refuses a call (the taint rule) and a tool
    that a stop cut short say so in their result's metadata ({"refused": why}, {"stopped": true})."""
    if result.metadata.get("refused"):
        return Outcome.TOOL_RUN_OUTCOME_REFUSED
    if result.metadata.get("stopped"):
        return Outcome.TOOL_RUN_OUTCOME_STOPPED
    return Outcome.TOOL_RUN_OUTCOME_ERROR if result.is_error else Outcome.TOOL_RUN_OUTCOME_OK


def result_bytes(result: ToolResult) -> int:
    return len(result.content.encode()) + sum(len(image) for image in result.images)


@dataclass
class Recording:
    """One run on the log from its start: STOPPED until it ends, so a run that never ends (a stop,
    a cancelled sub-agent, a turn that failed under it) is on the log all the same."""

    run: store_pb.ToolRun
    started: float  # time.monotonic() at its start
    ended: bool = False

    def end(self, result: ToolResult, seconds: float) -> None:
        self.run.outcome = outcome_of(result)
        self.run.duration_seconds = seconds
        self.run.bytes_out = result_bytes(result)
        self.run.error = (
            ""
            if self.run.outcome == Outcome.TOOL_RUN_OUTCOME_OK
            else result.content[:ERROR_CHARS].replace(NUL, REPLACEMENT)
        )
        self.ended = True

    def as_now(self) -> store_pb.ToolRun:
        """The record to store: a run still under way as cut short, with the seconds it has run."""
        if not self.ended:
            self.run.duration_seconds = time.monotonic() - self.started
        return self.run


class ToolRunLog:
    """A turn's records not yet stored, its sub-agents' included (they share their parent's log).
    Records are only ever added at the end, so what an append carried is the log's head."""

    def __init__(self) -> None:
        self._recordings: list[Recording] = []

    def start(self, call: common_pb2.ToolCall, *, turn_id: str, is_subagent: bool) -> Recording:
        arguments = call.arguments_json.replace(NUL, REPLACEMENT)
        run = store_pb.ToolRun(
            turn_id=turn_id,
            call_id=call.id,
            is_subagent=is_subagent,
            tool=call.name,
            arguments_json=arguments,
            outcome=Outcome.TOOL_RUN_OUTCOME_STOPPED,
            error=CUT_SHORT,
            bytes_in=len(call.arguments_json.encode()),
        )
        run.started_at.FromNanoseconds(time.time_ns())
        recording = Recording(run, time.monotonic())
        self._recordings.append(recording)
        return recording

    def unstored(self, call_seqs: Mapping[str, int] | None = None) -> list[store_pb.ToolRun]:
        """The records not stored yet. With `call_seqs` (the seq of the stored message that carries
        each of the session's tool calls, by call id), a run of a stored call names that message
        instead of carrying its arguments again: the store takes them from it, redacted already, so
        a turn's arguments travel and are redacted once. (A sub-agent's calls are not stored.)"""
        runs = [r.as_now() for r in self._recordings]
        if not call_seqs:
            return runs
        return [_by_reference(run, call_seqs.get(run.call_id, 0)) if not run.is_subagent else run for run in runs]

    def stored(self, count: int) -> None:
        """The first `count` records are in the store (or were given up on, with a log line)."""
        del self._recordings[:count]


def _by_reference(run: store_pb.ToolRun, call_seq: int) -> store_pb.ToolRun:
    if not call_seq:
        return run
    named = store_pb.ToolRun()
    named.CopyFrom(run)
    named.call_seq, named.arguments_json = call_seq, ""
    return named


AppendMethod = Callable[..., Awaitable[store_pb.AppendMessagesResponse]]


async def store_tool_runs(
    append: AppendMethod,
    session_id: str,
    runs: list[store_pb.ToolRun],
    *,
    key: str,
    metadata: tuple[tuple[str, str], ...],
    timeout: float,
) -> None:
    """Records no append of messages carried (a turn that ended under its tools; a RunEphemeral's
    runs) as an append of their own, with the services' vouch. A failure is logged, never raised: it
    must not cost the turn its end."""
    request = store_pb.AppendMessagesRequest(session_id=session_id, tool_runs=runs, idempotency_key=key)
    try:
        await append(request, metadata=metadata or None, timeout=timeout)
    except PalimpsestError as exc:
        log.warning("session %s: %d tool run(s) not written to its audit log: %s", session_id, len(runs), exc)

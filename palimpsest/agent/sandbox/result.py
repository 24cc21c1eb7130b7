"""What a command gave back: each stream's head and tail within a budget, how it ended, and the text
the model reads."""

from __future__ import annotations

import signal as signals
from dataclasses import dataclass
from typing import Literal

# Why a command was ended before it finished by itself, as far as can be told.
StopReason = Literal["wall_time", "output", "stop", "cpu", "memory", "file_size", "processes"]


class StreamCapture:
    """Keeps the first and the last half of ``keep`` bytes of a stream and counts the rest: memory
    stays bounded whatever the command prints."""

    def __init__(self, keep: int) -> None:
        self._head_room = keep // 2
        self._tail_room = keep - self._head_room
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        if len(self._head) < self._head_room:
            taken = self._head_room - len(self._head)
            self._head += data[:taken]
            data = data[taken:]
        if not data or not self._tail_room:
            return
        if len(data) >= self._tail_room:
            self._tail[:] = data[-self._tail_room :]
        else:
            self._tail += data
            del self._tail[: -self._tail_room]

    def captured(self) -> "CapturedOutput":
        return CapturedOutput(bytes(self._head), bytes(self._tail), self.total)


@dataclass(frozen=True)
class CapturedOutput:
    head: bytes
    tail: bytes
    total: int  # bytes the stream carried, kept or not

    @property
    def elided(self) -> int:
        return self.total - len(self.head) - len(self.tail)

    def text(self) -> str:
        """The stream as text: head, a line saying how much was left out, tail."""
        head = self.head.decode("utf-8", errors="replace")
        if not self.elided:
            return head + self.tail.decode("utf-8", errors="replace")
        tail = self.tail.decode("utf-8", errors="replace")
        return f"{head}\n[… {self.elided:,} bytes left out …]\n{tail}"


@dataclass(frozen=True)
class CommandResult:
    command: str
    exit_code: int | None  # None when a signal ended it
    signal: int | None
    stdout: CapturedOutput
    stderr: CapturedOutput
    duration_s: float
    sandboxed: bool
    killed_for: StopReason | None = None
    # One line on why it was ended (names the limit and its value); "" when it ended by itself.
    note: str = ""

    @property
    def output_bytes(self) -> int:
        return self.stdout.total + self.stderr.total

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.killed_for is None

    def status_line(self) -> str:
        if self.exit_code is not None:
            status = f"exit code {self.exit_code}"
        else:
            status = f"killed by {_signal_name(self.signal)}"
        status += f" after {self.duration_s:.1f} s"
        return f"{status}: {self.note}" if self.note else status

    def render(self) -> str:
        """The tool result the model reads: how it ended, then stdout and stderr."""
        parts = [self.status_line()]
        for name, stream in (("stdout", self.stdout), ("stderr", self.stderr)):
            if stream.total:
                parts.append(f"{name}:\n" + stream.text().removesuffix("\n"))
            else:
                parts.append(f"{name}: (empty)")
        return "\n".join(parts)


def _signal_name(number: int | None) -> str:
    if number is None:
        return "a signal"
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"

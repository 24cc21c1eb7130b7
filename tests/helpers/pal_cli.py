"""Running pal as a user does, in a subprocess against real services."""

from __future__ import annotations

import asyncio
import codecs
import fcntl
import json
import os
import pty
import re
import struct
import sys
import termios
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from palimpsest.agent.app import start_agent
from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as pb

PAL = str(Path(sys.executable).with_name("pal"))


# Nothing listens here: the "service is down" address.
CLOSED = "127.0.0.1:1"


@dataclass
class Ran:
    code: int
    stdout: str
    stderr: str

    def json_lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stdout.splitlines() if line.strip()]

    def json(self) -> dict[str, Any]:
        (only,) = self.json_lines()
        return only

    def assert_one_line_error(self, *words: str) -> str:
        """The failure contract: non-zero exit, one readable line on stderr, never a traceback."""
        assert self.code != 0, self.stdout
        assert "Traceback" not in self.stderr + self.stdout
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, self.stderr
        for word in words:
            assert word in lines[0], lines[0]
        return lines[0]


def pal_env(store: str = CLOSED, agent: str = CLOSED, compressor: str = CLOSED, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PALIMPSEST_")}
    env.update(
        PALIMPSEST_STORE_ADDR=store,
        PALIMPSEST_AGENT_ADDR=agent,
        PALIMPSEST_COMPRESSOR_ADDR=compressor,
        COLUMNS="220",
        NO_COLOR="1",
        **extra,
    )
    return env


async def pal(*args: str, env: Mapping[str, str], stdin: str | None = None, timeout: float = 60) -> Ran:
    proc = await asyncio.create_subprocess_exec(
        PAL,
        *args,
        env=dict(env),
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin is not None else None), timeout)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        raise AssertionError(f"pal {' '.join(args)} hung:\n{out.decode()}\n{err.decode()}") from None
    return Ran(proc.returncode or 0, out.decode(), err.decode())


Message = common_pb2.Message


# -- helpers over the store's own API -------------------------------------------------------------
async def new_session(store, profile: str, *messages: Message, name: str = "") -> common_pb2.Session:
    session = (await store.CreateSession(pb.CreateSessionRequest(profile_id=profile, name=name))).session
    if messages:
        await store.AppendMessages(pb.AppendMessagesRequest(session_id=session.id, messages=messages))
    return session


def chat_messages(*pairs: tuple[str, str]) -> list[Message]:
    out = []
    for asked, answered in pairs:
        out += [Message(role="user", content=asked), Message(role="assistant", content=answered)]
    return out


COMPLETED = "STREAM_END_REASON_COMPLETED"


# -- Ctrl-C -------------------------------------------------------------------------------------------
async def start_pal(*args: str, env: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        PAL,
        *args,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def read_until(stream: asyncio.StreamReader, text: str, timeout: float = 30) -> str:
    seen = ""
    async with asyncio.timeout(timeout):
        while text not in seen:
            line = await stream.readline()
            if not line:
                raise AssertionError(f"output ended before {text!r}: {seen}")
            seen += line.decode()
    return seen


# -- in a real terminal -------------------------------------------------------------------------------
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


class Terminal:
    """`pal` in a pseudo-terminal it controls: keys go in as typed (Ctrl-C included), the screen comes out."""

    def __init__(self, proc: asyncio.subprocess.Process, master: int) -> None:
        self.proc, self.master = proc, master
        self._raw, self._seen = "", 0
        # A read may end inside a multi-byte character or an escape sequence: decode incrementally,
        # strip escapes from the whole text.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._changed = asyncio.Event()
        asyncio.get_running_loop().add_reader(master, self._read)

    @property
    def screen(self) -> str:
        return ANSI.sub("", self._raw)

    def _read(self) -> None:
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: the program closed the terminal
            data = b""
        if not data:
            asyncio.get_running_loop().remove_reader(self.master)
        self._raw += self._decoder.decode(data, final=not data)
        self._changed.set()

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    async def expect(self, text: str, timeout: float = 30) -> None:
        """Wait until `text` shows up after what earlier expectations consumed."""
        try:
            async with asyncio.timeout(timeout):
                while (found := self.screen.find(text, self._seen)) < 0:
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(f"{text!r} never showed; the screen ends with:\n{self.screen[-1500:]}") from None
        self._seen = found + len(text)

    async def expect_first(self, *texts: str, timeout: float = 30) -> str:
        """Wait until one of `texts` shows up after what was consumed; the one that came first."""
        try:
            async with asyncio.timeout(timeout):
                while True:
                    found = [(at, text) for text in texts if (at := self.screen.find(text, self._seen)) >= 0]
                    if found:
                        at, text = min(found)
                        self._seen = at + len(text)
                        return text
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(f"none of {texts!r} showed; the screen ends with:\n{self.screen[-1500:]}") from None

    async def exit_code(self, timeout: float = 15) -> int:
        async with asyncio.timeout(timeout):
            return await self.proc.wait()

    def close(self) -> None:
        """Never leave a pal behind, whatever the test saw."""
        if self.proc.returncode is None:
            self.proc.kill()
        asyncio.get_running_loop().remove_reader(self.master)
        os.close(self.master)


# Makes the terminal on stdin the controlling one, so Ctrl-C typed there reaches pal as SIGINT; done in a
# small exec'd program because Python code between fork and exec is unsafe next to gRPC's threads.
TAKE_TERMINAL = (
    "import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); os.execv(sys.argv[1], sys.argv[1:])"
)


async def open_terminal(*args: str, env: dict[str, str]) -> Terminal:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        TAKE_TERMINAL,
        PAL,
        *args,
        env={**env, "TERM": "xterm-256color"},
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    return Terminal(proc, master)


# Fixtures shared with other modules are named apart from their functions, so importing them there
# (which is how they are registered) does not shadow the test parameters that use them.
@pytest.fixture(scope="module", name="pal_profiles")
def pal_profiles_fixture(tmp_path_factory) -> tuple[str, str, Path]:
    """A profiles file of this module's own: its default profile keeps the sessions it creates apart."""
    main, other = f"pal-{uuid.uuid4().hex[:8]}", f"pal-tiny-{uuid.uuid4().hex[:8]}"
    path = tmp_path_factory.mktemp("profiles") / "profiles.json"
    path.write_text(
        json.dumps(
            {
                "default": main,
                "profiles": {
                    main: {
                        "name": "Pal test",
                        "model": "qwen3.6",
                        "context_window": 8192,
                        "description": "tests of pal",
                    },
                    other: {"name": "Tiny", "model": "tiny", "context_window": 8192, "think_enabled": False},
                },
            }
        )
    )
    return main, other, path


@pytest.fixture(scope="module", name="agent_server")
async def agent_server_fixture(base_settings, store_server, compressor_server, ollama_sim, pal_profiles):
    """The real Agent on port 0, against the store, the Compressor and the Ollama simulator.

    Overrides conftest's: this one reads a profiles file of the module's own, so the sessions its turns
    create carry a profile no other test uses (`pal continue --profile` finds exactly them).
    """
    settings = replace(
        base_settings,
        ollama_host=ollama_sim.url,
        store_addr=store_server.address,
        compressor_addr=compressor_server.address,
        profiles_path=str(pal_profiles[2]),
    )
    running = await start_agent(settings, port=0)
    yield running
    await running.stop(0)

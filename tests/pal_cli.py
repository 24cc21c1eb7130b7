"""Running pal as a user does, in a subprocess against real services."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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

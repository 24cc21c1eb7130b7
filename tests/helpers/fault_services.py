"""Services as processes that tests kill, freeze and restart; the simulator's scripted prompts."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ollama_sim import Reply

REPO = Path(__file__).resolve().parents[2]
CHUNK_DELAY = 0.1  # per word of an answer: turns stay in flight for a second or more
GRACE_S = 3.0
PROMPT = re.compile(r"count to (\d+) \(turn (\w+)\)")


# -- the answers -----------------------------------------------------------------------------
def prompt_for(tag: str, words: int) -> str:
    return f"count to {words} (turn {tag})"


def answer_to(prompt: str) -> str:
    """The simulator's answer to a turn's prompt; the test computes the same to find it stored."""
    found = PROMPT.search(prompt)
    if found is None:
        return "ok"
    return f"turn {found[2]}: " + " ".join(str(n) for n in range(1, int(found[1]) + 1))


def responder(body) -> Reply:
    users = [m.get("content", "") for m in body.get("messages") or [] if m.get("role") == "user"]
    return Reply(text=answer_to(users[-1] if users else ""), chunk_delay=CHUNK_DELAY)


@dataclass
class Service:
    """One service process on a fixed port, so a restarted one is found where the old one was."""

    module: str
    port: int
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.module],
                cwd=REPO,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        await self.serving()

    async def serving(self, timeout: float = 60.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        async with grpc.aio.insecure_channel(self.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while loop.time() < deadline:
                if self.proc.poll() is not None:
                    raise AssertionError(f"{self.module} exited ({self.proc.returncode}):\n{self.tail()}")
                try:
                    reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.aio.AioRpcError:
                    pass
                await asyncio.sleep(0.1)  # between health checks, not a wait for an outcome
        raise AssertionError(f"{self.module} not SERVING within {timeout:.0f}s:\n{self.tail()}")

    async def signal(self, sig: int, timeout: float = GRACE_S + 10) -> int:
        """Send `sig` and wait for the process to exit; its exit code."""
        self.proc.send_signal(sig)
        return await asyncio.to_thread(self.proc.wait, timeout)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""

    def stop_now(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

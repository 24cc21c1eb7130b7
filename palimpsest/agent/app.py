"""Wiring of the Agent: channels to the store and the Compressor replicas, the Ollama client,
profiles, and health entries that say whether Ollama answers and whether commands can be sandboxed."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from contextlib import suppress
from pathlib import Path
from typing import cast

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from palimpsest.agent import sandbox
from palimpsest.agent.compressor_breaker import GuardedCompressor
from palimpsest.agent.context_builder import ContextBuilder
from palimpsest.agent.mcp_servers.manager import McpManager
from palimpsest.agent.profiles import DEFAULT_PERSONA, ProfileRegistry, ProfilesFileError
from palimpsest.agent.servicer import STOP_MARGIN_S, AgentServicer
from palimpsest.agent.turn_context import AgentDeps
from palimpsest.agent.workspace import Workspaces
from palimpsest.shared import tracing
from palimpsest.shared.channels import open_channel
from palimpsest.shared.errors import PalimpsestError
from palimpsest.shared.ollama import OllamaClient
from palimpsest.shared.server import RunningServer, method_paths, start_server
from palimpsest.shared.settings import Settings
from palimpsest.shared.stubs import AsyncCompressorStub
from palimpsest.v1 import agent_pb2, agent_pb2_grpc, compressor_pb2
from palimpsest.v1.compressor_pb2_grpc import CompressorStub
from palimpsest.v1.session_store_pb2_grpc import SessionStoreStub

log = logging.getLogger("palimpsest.agent")

SERVICE_NAME = agent_pb2.DESCRIPTOR.services_by_name["Agent"].full_name
# A turn's request carries its text, pasted images and inline files (a sub-agent's, the context
# handed to it); every other request takes PALIMPSEST_MAX_SMALL_REQUEST_BYTES.
LARGE_REQUESTS = method_paths(SERVICE_NAME, "RunStream", "Run", "RunEphemeral")
COMPRESSOR_SERVICE = compressor_pb2.DESCRIPTOR.services_by_name["Compressor"].full_name
# A health entry of its own: the Agent serves (and says why turns fail) even without Ollama.
OLLAMA_HEALTH_NAME = "ollama"
OLLAMA_CHECK_INTERVAL = 10.0
# Whether every MCP server of the profiles is ready; turns run either way (a server that is down
# is a tool error), so this entry is the servers' own.
MCP_HEALTH_NAME = "mcp"
# Whether commands can run sandboxed where a profile asks for it (probe: cached, retried every 30 s).
SANDBOX_HEALTH_NAME = "sandbox"


async def check_sandbox(running: RunningServer, deps: AgentDeps, said: str = "") -> str:
    """Set the `sandbox` health entry: NOT_SERVING while a profile (or PALIMPSEST_SANDBOX=required)
    runs commands sandboxed and the sandbox cannot start here, with one log line naming the fix when
    that begins. Returns the reason logged ("" when nothing is wrong), passed back in next time."""
    status = await sandbox.probe()
    needing = deps.profiles.sandboxed_profiles(deps.settings.sandbox_mode)
    if deps.settings.sandbox_mode == "required":
        needing = needing or ["every profile (PALIMPSEST_SANDBOX=required)"]
    broken = not status.available and bool(needing)
    if broken and said != status.reason:
        log.warning("sandbox unavailable: %s; commands of %s fail until it is fixed", status.reason, ", ".join(needing))
    await running.health.set(
        SANDBOX_HEALTH_NAME,
        health_pb2.HealthCheckResponse.NOT_SERVING if broken else health_pb2.HealthCheckResponse.SERVING,
    )
    return status.reason if broken else ""


async def watch_sandbox(running: RunningServer, deps: AgentDeps, said: str, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        said = await check_sandbox(running, deps, said)


async def watch_ollama(running: RunningServer, ollama: OllamaClient, interval: float) -> None:
    missing_logged = False
    while True:
        try:
            with tracing.untraced():
                await ollama.version()
            status: int = health_pb2.HealthCheckResponse.SERVING
            missing_logged = False
        except PalimpsestError as exc:
            status = health_pb2.HealthCheckResponse.NOT_SERVING
            if not missing_logged:
                log.warning("%s", exc)
                missing_logged = True
        await running.health.set(OLLAMA_HEALTH_NAME, status)
        await asyncio.sleep(interval)


def workspace_root(data_dir: Path) -> Path:
    """This Agent's own folder for its mirrors of the sessions' workspaces (a cache: the store has
    every file). Agents sharing a data folder each get one; those of Agents no longer running go."""
    base = data_dir / "workspaces"
    base.mkdir(parents=True, exist_ok=True)
    for old in base.glob("agent-*-*"):
        pid = old.name.split("-")[1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    root = Path(tempfile.mkdtemp(prefix=f"agent-{os.getpid()}-", dir=base))
    root.chmod(0o711)  # a command's sandbox user reaches its own workspace below, and lists nothing here
    return root


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


async def watch_mcp(running: RunningServer, mcp: McpManager) -> None:
    """The `mcp` health entry follows the servers' state (present once a profile names a server)."""
    while True:
        await mcp.changed.wait()
        mcp.changed.clear()
        if mcp.configured:
            serving = not mcp.not_ready()
            await running.health.set(
                MCP_HEALTH_NAME,
                health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING,
            )


async def compressor_serving(channel: grpc.aio.Channel, timeout: float) -> bool:
    """The breaker's probe: does the Compressor answer, and say it serves?"""
    with tracing.untraced():
        # (types-grpcio-health-checking declares HealthStub without the methods its __init__ sets)
        reply = await health_pb2_grpc.HealthStub(channel).Check(  # type: ignore[attr-defined]
            health_pb2.HealthCheckRequest(service=COMPRESSOR_SERVICE), timeout=timeout
        )
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def load_profiles(path: str) -> ProfileRegistry:
    try:
        return ProfileRegistry.load(path)
    except ProfilesFileError as exc:
        raise SystemExit(
            f"PALIMPSEST_PROFILES: {exc}; fix the file, or unset PALIMPSEST_PROFILES for the built-in default profile"
        ) from None


async def start_agent(settings: Settings, *, port: int, host: str = "127.0.0.1") -> RunningServer:
    profiles = load_profiles(settings.profiles_path)  # before anything that would need closing
    store_channel = open_channel(settings.store_addr, settings, service="SessionStore")
    compressor_channel = open_channel(settings.compressor_addr, settings, service="Compressor")
    ollama = OllamaClient(settings.ollama_host)
    mcp = McpManager()
    store = SessionStoreStub(store_channel)
    mirrors = workspace_root(settings.data_dir)
    compressor = GuardedCompressor(
        CompressorStub(compressor_channel),
        settings.compressor_addr,
        retry_s=settings.compressor_retry_s,
        probe=lambda: compressor_serving(compressor_channel, settings.rpc_timeout_s),
    )
    deps = AgentDeps(
        store=store,
        compressor=cast(AsyncCompressorStub, compressor),
        ollama=ollama,
        settings=settings,
        profiles=profiles,
        builder=ContextBuilder(DEFAULT_PERSONA),
        mcp=mcp,
        workspaces=Workspaces(store, settings, mirrors),
    )
    servicer = AgentServicer(deps)
    watcher: list[asyncio.Task] = []

    async def on_stop() -> None:
        for task in watcher:
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task
        await servicer.drain(min(STOP_MARGIN_S, settings.grace_seconds / 2))
        await mcp.close()  # after the turns: their last calls had their chance
        if servicer.bus is not None:
            await servicer.bus.close(flush_s=STOP_MARGIN_S)
        await ollama.aclose()
        await asyncio.to_thread(shutil.rmtree, mirrors, True)
        await compressor.aclose()
        await store_channel.close()
        await compressor_channel.close()

    running = await start_server(
        lambda server: agent_pb2_grpc.add_AgentServicer_to_server(servicer, server),
        [SERVICE_NAME],
        settings=settings,
        port=port,
        host=host,
        on_stop=on_stop,
        large_requests=LARGE_REQUESTS,
    )
    watcher.append(asyncio.create_task(watch_ollama(running, ollama, OLLAMA_CHECK_INTERVAL)))
    watcher.append(asyncio.create_task(watch_mcp(running, mcp)))
    await mcp.sync(profiles)  # connecting in the background: the Agent serves meanwhile
    said = await check_sandbox(running, deps)  # before the first call: at start, in the log and in health
    watcher.append(asyncio.create_task(watch_sandbox(running, deps, said, OLLAMA_CHECK_INTERVAL)))
    if servicer.bus is not None:
        servicer.bus.start()
    running.servicer = servicer  # tests reach running turns through it
    running.on_drain = servicer.finish_turns
    return running

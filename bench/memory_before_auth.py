"""Memory a service holds for requests it refuses: N concurrent requests of about 60 MB each, sent to
real processes (`python -m palimpsest.store`, `python -m palimpsest.agent`, auth on), each
service a fresh process per case; its resident memory (VmRSS) before, at its peak (VmHWM, reset
just before the requests) and once every request has been answered.

The cases: no credentials on the store's AppendMessages and on the Agent's RunStream (the largest
requests either takes); no credentials on GetShared and on gRPC's health Check (open by design: the
share token is the credential; probes call health without any); and a signed-in caller's oversized
ListSessions (an RPC with a small request limit).
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import uuid
from collections import Counter
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2

from bench import _common
from palimpsest.shared.auth import make_token
from palimpsest.shared.ports import free_port
from palimpsest.v1 import agent_pb2, common_pb2
from palimpsest.v1 import session_store_pb2 as store_pb

log = logging.getLogger("bench.memory_before_auth")

NEEDS_POSTGRES = True
REQUESTS, QUICK_REQUESTS = 8, 2
BODY = 60 * 1024 * 1024  # under the 64 MiB PALIMPSEST_MAX_MESSAGE_BYTES, as the probe sent
SECRET = "bench-memory-before-authentication-secret"
MiB = 1024 * 1024


@dataclass(frozen=True)
class Case:
    name: str
    service: str  # "store" or "agent"
    method: str
    body: bytes
    signed_in: bool = False


def cases() -> list[Case]:
    append = store_pb.AppendMessagesRequest(
        session_id=str(uuid.uuid4()), messages=[common_pb2.Message(role="user", content="x" * BODY)]
    )
    turn = agent_pb2.RunStreamRequest(text="look at this", images=[b"\x89PNG\r\n\x1a\n" + bytes(BODY)])
    shared = store_pb.GetSharedRequest(token="t" * BODY)
    health = health_pb2.HealthCheckRequest(service="s" * BODY)
    listing = store_pb.ListSessionsRequest(query="q" * BODY)
    return [
        Case(
            "AppendMessages, no credentials",
            "store",
            "/palimpsest.v1.SessionStore/AppendMessages",
            append.SerializeToString(),
        ),
        Case("RunStream, no credentials", "agent", "/palimpsest.v1.Agent/RunStream", turn.SerializeToString()),
        Case(
            "GetShared (open by design), no credentials",
            "store",
            "/palimpsest.v1.SessionStore/GetShared",
            shared.SerializeToString(),
        ),
        Case(
            "Agent's health Check (open by design), no credentials",
            "agent",
            "/grpc.health.v1.Health/Check",
            health.SerializeToString(),
        ),
        Case(
            "ListSessions, signed in",
            "store",
            "/palimpsest.v1.SessionStore/ListSessions",
            listing.SerializeToString(),
            signed_in=True,
        ),
    ]


def memory_mib(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (the peak since the last reset) of a process, in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux ≥ 4.0)


@asynccontextmanager
async def service(dsn: str, which: str, tmp: str):
    """One service as a real process with auth on (the Agent's store and Compressor addresses
    lead nowhere: nothing it is sent gets that far)."""
    port = free_port()
    env = {
        "DATABASE_URL": dsn,
        "PALIMPSEST_AUTH_ENABLED": "true",
        "PALIMPSEST_JWT_SECRET": SECRET,
        "PALIMPSEST_DATA_DIR": tmp,
        "PALIMPSEST_FILES_ROOT": str(Path(tmp) / "files"),
        "PALIMPSEST_EMBED_MODEL": "",
        "OLLAMA_HOST": f"http://127.0.0.1:{free_port()}",
        "PALIMPSEST_STORE_ADDR": f"127.0.0.1:{port if which == 'store' else free_port()}",
        "PALIMPSEST_COMPRESSOR_ADDR": f"127.0.0.1:{free_port()}",
        "PALIMPSEST_AGENT_ADDR": f"127.0.0.1:{port}",
    }
    module = {"store": "palimpsest.store", "agent": "palimpsest.agent"}[which]
    async with _common.processes([(module, env)]) as (proc,):
        await _common.wait_ready(f"127.0.0.1:{port}")
        yield proc, f"127.0.0.1:{port}"


async def send(address: str, case: Case, body: bytes) -> str:
    """One request on a connection of its own (each gets its own HTTP/2 windows, as separate
    clients would); the status it was answered with."""
    metadata = (("authorization", f"Bearer {make_token('bench', SECRET)}"),) if case.signed_in else ()
    options = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_send_message_length", -1)]
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        call = (
            channel.unary_stream(case.method)
            if case.method.endswith("/RunStream")
            else channel.unary_unary(case.method)
        )
        try:
            reply = call(body, metadata=metadata, timeout=120)
            if case.method.endswith("/RunStream"):
                async for _ in reply:
                    pass
            else:
                await reply
            return "OK"
        except grpc.aio.AioRpcError as error:
            return error.code().name


async def measure(dsn: str, case: Case, requests: int) -> list[object]:
    with tempfile.TemporaryDirectory(prefix="palimpsest-bench-") as tmp:
        async with service(dsn, case.service, tmp) as (proc, address):
            await send(address, case, b"")  # lazy imports and the first call's allocations out of the way
            before = memory_mib(proc.pid)["VmRSS"]
            reset_peak(proc.pid)
            codes = Counter(await asyncio.gather(*(send(address, case, case.body) for _ in range(requests))))
            after = memory_mib(proc.pid)
    log.info("%s: %s", case.name, dict(codes))
    answered = ", ".join(f"{n} {code}" for code, n in sorted(codes.items()))
    return [case.name, answered, f"{before:.0f}", f"+{after['VmHWM'] - before:.0f}", f"+{after['VmRSS'] - before:.0f}"]


async def run(args) -> str:
    requests = QUICK_REQUESTS if args.quick else REQUESTS
    rows = []
    async with _common.fresh_database(args.server, "memory_before_auth") as dsn:
        for case in cases():
            rows.append(await measure(dsn, case, requests))
    headers = ["requests", "answered", "RSS before (MiB)", "peak growth (MiB)", "held after (MiB)"]
    notes = [
        f"{requests} concurrent requests of {BODY // MiB} MiB each, one connection each, to a fresh "
        "process of the service (auth on); growth against its RSS after one small call."
    ]
    return _common.table(headers, rows) + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"


if __name__ == "__main__":
    import sys

    from bench.__main__ import main

    sys.exit(asyncio.run(main(["memory_before_auth", *sys.argv[1:]])))

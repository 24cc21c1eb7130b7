"""Every RPC of the three services (client-streamed uploads aside), fed requests generated from their
proto descriptors (so a new field or RPC is covered without new code), and every RPC fed raw bytes
(most of which do not decode): whatever the input, the answer is a status a caller can act on —
never INTERNAL or UNKNOWN."""

from __future__ import annotations

import asyncio
import os

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from palimpsest.v1 import agent_pb2, compressor_pb2, session_store_pb2
from palimpsest.v1.common_pb2 import Message
from tests.helpers.fuzzing import UNACCEPTABLE, _fuzz
from tests.helpers.waiting import one_request, raw_call_to_end

# Uploads (client-streamed) and the one RPC whose valid input deletes other tests' data are left out,
# and the owner's memory: with auth off it is the one owner's, which every other test's new sessions
# would then carry in their prompts (test_owner_memory fuzzes them as a user of their own).
SKIP = {"PutFile", "CleanupSessions", "GetMemory", "EditMemory", "ApproveMemoryWrite", "RejectMemoryWrite"}


def callable_methods(service_descriptor):
    return [m for m in service_descriptor.methods if one_request(m) and m.name not in SKIP]


STORE_METHODS = callable_methods(session_store_pb2.DESCRIPTOR.services_by_name["SessionStore"])
COMPRESSOR_METHODS = callable_methods(compressor_pb2.DESCRIPTOR.services_by_name["Compressor"])
AGENT_METHODS = callable_methods(agent_pb2.DESCRIPTOR.services_by_name["Agent"])


async def _sessions(store, profile: str) -> tuple[str, ...]:
    """Two real sessions with a few messages each, for the generated requests to aim at."""
    ids = []
    for _ in range(2):
        session = (await store.CreateSession(session_store_pb2.CreateSessionRequest(profile_id=profile))).session
        await store.AppendMessages(
            session_store_pb2.AppendMessagesRequest(
                session_id=session.id,
                messages=[Message(role="user", content="hello there"), Message(role="assistant", content="hi")],
            )
        )
        ids.append(session.id)
    return tuple(ids)


@pytest.mark.parametrize("method", STORE_METHODS, ids=lambda m: m.name)
async def test_store_rpcs_never_answer_internal(store, profile, method):
    ids = await _sessions(store, profile)
    await asyncio.to_thread(_fuzz(method, ids), loop=asyncio.get_running_loop(), stub=store)


@pytest.mark.parametrize("method", COMPRESSOR_METHODS, ids=lambda m: m.name)
async def test_compressor_rpcs_never_answer_internal(store, compressor, profile, method):
    ids = await _sessions(store, profile)
    await asyncio.to_thread(_fuzz(method, ids), loop=asyncio.get_running_loop(), stub=compressor)


@pytest.mark.parametrize("method", AGENT_METHODS, ids=lambda m: m.name)
async def test_agent_rpcs_never_answer_internal(store, agent, profile, method):
    ids = await _sessions(store, profile)
    await asyncio.to_thread(_fuzz(method, ids), loop=asyncio.get_running_loop(), stub=agent)


# Raw requests: random bytes (most do not decode; the rest decode to odd messages) and bytes that
# never decode. Client-streamed uploads too: the bytes are their one message.
_RAW = st.one_of(st.binary(max_size=64), st.sampled_from([b"\xff" * 8, b"\x0a\x05ab", b"\x0f", b"\x12\x02\xc3\x28"]))
RAW_METHODS = [
    (name, m)
    for name, service in (
        ("store", session_store_pb2.DESCRIPTOR.services_by_name["SessionStore"]),
        ("compressor", compressor_pb2.DESCRIPTOR.services_by_name["Compressor"]),
        ("agent", agent_pb2.DESCRIPTOR.services_by_name["Agent"]),
    )
    for m in service.methods
    if m.name != "CleanupSessions"
]


async def _raw(channel, method, body: bytes) -> None:
    try:
        await raw_call_to_end(channel, method, body, timeout=20)
    except grpc.aio.AioRpcError as error:
        assert error.code() not in UNACCEPTABLE, f"{method.name}({body!r}) → {error.code()}: {error.details()}"


@pytest.mark.parametrize("service, method", RAW_METHODS, ids=lambda v: v if isinstance(v, str) else v.name)
async def test_raw_bytes_never_answer_internal(store_server, compressor_server, agent_server, service, method):
    address = {"store": store_server, "compressor": compressor_server, "agent": agent_server}[service].address

    @settings(
        max_examples=int(os.environ.get("FUZZ_EXAMPLES", "25")),
        deadline=None,
        derandomize=bool(os.environ.get("CI")),
        suppress_health_check=list(HealthCheck),
    )
    @given(body=_RAW)
    def run(body, loop, channel):
        asyncio.run_coroutine_threadsafe(_raw(channel, method, body), loop).result(60)

    async with grpc.aio.insecure_channel(address) as channel:
        await asyncio.to_thread(run, loop=asyncio.get_running_loop(), channel=channel)

"""What a call must bring before its request is read (palimpsest/shared/server.py), on every RPC of the
three services with auth on, built from the service descriptors so a new RPC cannot skip it:
credentials, checked before any of the request is received (without them, a large request's body
never crosses the wire); a request within its method's limit, refused before it is decoded; bytes
that decode — undecodable ones are INVALID_ARGUMENT, never UNKNOWN with a traceback in the log."""

from __future__ import annotations

import logging
from dataclasses import replace

import grpc
import pytest

from palimpsest.agent.app import LARGE_REQUESTS as AGENT_LARGE
from palimpsest.compressor.app import LARGE_REQUESTS as COMPRESSOR_LARGE
from palimpsest.store.app import LARGE_REQUESTS as STORE_LARGE
from palimpsest.store.app import OPEN_METHODS
from palimpsest.v1 import agent_pb2, common_pb2, compressor_pb2
from palimpsest.v1 import session_store_pb2 as pb
from tests.conftest import bearer
from tests.helpers.relay import Relay
from tests.helpers.waiting import raw_call_to_end

SMALL_LIMIT = 64 * 1024  # PALIMPSEST_MAX_SMALL_REQUEST_BYTES here: oversized requests stay cheap to send
DESCRIPTORS = {
    "store": pb.DESCRIPTOR.services_by_name["SessionStore"],
    "compressor": compressor_pb2.DESCRIPTOR.services_by_name["Compressor"],
    "agent": agent_pb2.DESCRIPTOR.services_by_name["Agent"],
}
ALL = [(service, method) for service, descriptor in DESCRIPTORS.items() for method in descriptor.methods]
LARGE = STORE_LARGE | COMPRESSOR_LARGE | AGENT_LARGE
# Each fails to decode as any message: a varint that never ends, a field longer than what is left,
# a wire type that does not exist.
UNDECODABLE = {"truncated varint": b"\xff" * 8, "length past the end": b"\x0a\x05ab", "wire type 7": b"\x0f"}


def path(method) -> str:
    return f"/{method.containing_service.full_name}/{method.name}"


def ids(value) -> str:
    return value if isinstance(value, str) else value.name


@pytest.fixture(scope="module")
async def addresses(base_settings, database_url, ollama_sim, profiles_file):
    from palimpsest.agent.app import start_agent
    from palimpsest.compressor.app import start_compressor
    from tests.conftest import _start_store

    settings = replace(
        base_settings,
        auth_enabled=True,
        max_small_request_bytes=SMALL_LIMIT,
        ollama_host=ollama_sim.url,
        profiles_path=profiles_file,
    )
    store = await _start_store(settings, database_url)
    compressor = await start_compressor(replace(settings, store_addr=store.address), port=0)
    agent = await start_agent(replace(settings, store_addr=store.address, compressor_addr=compressor.address), port=0)
    yield {"store": store.address, "compressor": compressor.address, "agent": agent.address}
    await agent.stop(0)
    await compressor.stop(0)
    await store.stop(0)


async def raw_call(address: str, method, body: bytes, metadata=()) -> tuple[grpc.StatusCode, str]:
    """``body`` sent as the request, bytes as they are; the status."""
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            await raw_call_to_end(channel, method, body, metadata=metadata, timeout=30)
        except grpc.aio.AioRpcError as error:
            return error.code(), error.details() or ""
    return grpc.StatusCode.OK, ""


@pytest.mark.parametrize("caller", ["signed in", "no credentials"])
@pytest.mark.parametrize("service, method", ALL, ids=ids)
async def test_undecodable_bytes_are_refused_without_a_traceback(addresses, caplog, service, method, caller):
    """Signed in (or on an open method): INVALID_ARGUMENT naming the request. Without credentials:
    UNAUTHENTICATED, the bytes never decoded."""
    metadata = bearer("admission-alice") if caller == "signed in" else ()
    expected = (
        grpc.StatusCode.INVALID_ARGUMENT
        if metadata or path(method) in OPEN_METHODS
        else grpc.StatusCode.UNAUTHENTICATED
    )
    for name, body in UNDECODABLE.items():
        code, details = await raw_call(addresses[service], method, body, metadata)
        assert code == expected, f"{method.name}, {name}: {code} {details}"
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            assert details.startswith("request: not a well-formed message"), details
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("service, method", [(s, m) for s, m in ALL if path(m) not in LARGE], ids=ids)
async def test_a_request_over_its_methods_limit_is_refused_before_it_is_decoded(addresses, service, method):
    """(Not a message at all: the size is refused before anything is decoded.)"""
    code, details = await raw_call(addresses[service], method, b"\xff" * (SMALL_LIMIT + 1), bearer("admission-alice"))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
    assert f"{path(method)} takes at most {SMALL_LIMIT:,} (PALIMPSEST_MAX_SMALL_REQUEST_BYTES)" in details


@pytest.mark.parametrize("service, method", [(s, m) for s, m in ALL if path(m) in LARGE], ids=ids)
async def test_requests_that_carry_content_take_the_large_limit(addresses, service, method):
    """Past the small limit, the request is decoded (here: found not to be a message)."""
    code, details = await raw_call(
        addresses[service], method, b"\x0a" + b"\xff" * (SMALL_LIMIT * 2), bearer("admission-alice")
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)


async def test_a_large_append_is_stored(addresses):
    from palimpsest.v1 import session_store_pb2_grpc

    alice = bearer("admission-alice")
    async with grpc.aio.insecure_channel(addresses["store"]) as channel:
        store = session_store_pb2_grpc.SessionStoreStub(channel)
        session = (await store.CreateSession(pb.CreateSessionRequest(profile_id="p"), metadata=alice)).session
        content = "x" * (SMALL_LIMIT * 4)
        await store.AppendMessages(
            pb.AppendMessagesRequest(
                session_id=session.id, messages=[common_pb2.Message(role="user", content=content)]
            ),
            metadata=alice,
        )
        stored = (
            await store.GetSession(
                pb.GetSessionRequest(session_id=session.id, view=pb.SESSION_VIEW_DISPLAY), metadata=alice
            )
        ).session
        assert [m.content for m in stored.messages] == [content]


BODY = 48 * 1024 * 1024


@pytest.mark.parametrize(
    "service, request_",
    [
        (
            "store",
            pb.AppendMessagesRequest(
                session_id="00000000-0000-0000-0000-000000000000",
                messages=[common_pb2.Message(role="user", content="x" * BODY)],
            ),
        ),
        ("agent", agent_pb2.RunStreamRequest(text="look", images=[bytes(BODY)])),
        (
            "compressor",
            compressor_pb2.CheckContextSizeRequest(
                model="qwen3.6", messages=[common_pb2.Message(role="user", content="x" * BODY)]
            ),
        ),
    ],
    ids=["AppendMessages", "RunStream", "CheckContextSize"],
)
async def test_without_credentials_a_large_request_does_not_cross_the_wire(addresses, service, request_):
    """Nothing reads the request of a call refused for its credentials: HTTP/2 flow control stops
    the sender after its windows (1–9 MB crossed in runs here), and the rest is never sent (all
    48 MB were received, and decoded, before). Counted by a relay between client and service: the
    memory of the service itself is measured by `python -m bench memory_before_auth`."""
    host, port = addresses[service].rsplit(":", 1)
    relay = Relay((host, int(port)))
    await relay.start()
    try:
        method = next(m for m in DESCRIPTORS[service].methods if m.input_type is request_.DESCRIPTOR)
        code, details = await raw_call(f"127.0.0.1:{relay.port}", method, request_.SerializeToString())
    finally:
        await relay.cut()
    assert code == grpc.StatusCode.UNAUTHENTICATED, (code, details)
    assert relay.forwarded < BODY // 3, f"{relay.forwarded:,} bytes of a {BODY:,}-byte request crossed"


@pytest.mark.parametrize(
    "method, request_",
    [
        ("RunStream", agent_pb2.RunStreamRequest(text="x" * 1_000_001)),
        ("Run", agent_pb2.RunRequest(text="")),
        ("RunEphemeral", agent_pb2.RunEphemeralRequest(text="", max_iterations=-1)),
        ("Compact", agent_pb2.CompactRequest()),
    ],
)
async def test_the_agent_asks_who_before_it_looks_at_the_request(addresses, method, request_):
    """An anonymous caller learns nothing from a bad request: not which field, not a size limit."""
    descriptor = DESCRIPTORS["agent"].methods_by_name[method]
    body = request_.SerializeToString()
    code, _ = await raw_call(addresses["agent"], descriptor, body)
    assert code == grpc.StatusCode.UNAUTHENTICATED
    code, details = await raw_call(addresses["agent"], descriptor, body, bearer("admission-alice"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details  # (the request was bad indeed)

"""Every RPC of the three services × every kind of caller, built from the service descriptors so a new
RPC cannot skip it: bad credentials are UNAUTHENTICATED, another user's session is refused without a
word about it, and the owner is never refused."""

from __future__ import annotations

import time
from dataclasses import replace

import grpc
import jwt
import pytest

from palimpsest.v1 import agent_pb2, agent_pb2_grpc, common_pb2, compressor_pb2, compressor_pb2_grpc
from palimpsest.v1 import session_store_pb2 as pb
from tests.conftest import JWT_SECRET, bearer
from tests.helpers.waiting import call_to_end, one_request

# Client-streamed uploads are checked by their own tests; these run as a matrix.
SKIP = {"PutFile"}


def _token(claims: dict, secret: str = JWT_SECRET, algorithm: str = "HS256") -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {jwt.encode(claims, secret, algorithm=algorithm)}"),)


BAD_CREDENTIALS = {
    "none": (),
    "expired": _token({"sub": "alice", "exp": int(time.time()) - 60}),
    "wrong signature": _token({"sub": "alice"}, secret="not-the-secret"),
    "alg none": (("authorization", "Bearer " + jwt.encode({"sub": "alice"}, None, algorithm="none")),),
    "no sub": _token({"role": "admin"}),
    "not bearer": (("authorization", "Basic YWxpY2U6cHc="),),
}


def methods(module, service: str):
    return [m for m in module.DESCRIPTOR.services_by_name[service].methods if one_request(m) and m.name not in SKIP]


ALL = (
    [("store", m) for m in methods(pb, "SessionStore")]
    + [("compressor", m) for m in methods(compressor_pb2, "Compressor")]
    + [("agent", m) for m in methods(agent_pb2, "Agent")]
)


def request_for(method, session_id: str):
    """A plausible request aimed at `session_id` wherever the request names a session."""
    request = method.input_type._concrete_class()
    for field in method.input_type.fields:
        if field.name == "session_id":
            setattr(request, "session_id", session_id)
        elif field.name == "session_ids":
            request.session_ids.append(session_id)
        elif field.name in ("model",):
            request.model = "qwen3.6"
        elif field.name in ("query", "text", "token_digest"):
            setattr(request, field.name, "hello")
        elif field.name == "messages" and field.message_type is common_pb2.Message.DESCRIPTOR:
            request.messages.append(common_pb2.Message(role="user", content="hello"))
    return request


async def call(stub, method, request, metadata) -> grpc.StatusCode:
    try:
        await call_to_end(stub, method, request, metadata=metadata, timeout=30)
        return grpc.StatusCode.OK
    except grpc.aio.AioRpcError as error:
        return error.code()


@pytest.fixture(scope="module")
async def services(base_settings, store_server_auth, ollama_sim, profiles_file):
    from palimpsest.agent.app import start_agent
    from palimpsest.compressor.app import start_compressor

    settings = replace(
        base_settings,
        auth_enabled=True,
        ollama_host=ollama_sim.url,
        store_addr=store_server_auth.address,
        profiles_path=profiles_file,
    )
    compressor = await start_compressor(settings, port=0)
    agent = await start_agent(replace(settings, compressor_addr=compressor.address), port=0)
    channels = {
        name: grpc.aio.insecure_channel(address)
        for name, address in (
            ("store", store_server_auth.address),
            ("compressor", compressor.address),
            ("agent", agent.address),
        )
    }
    from palimpsest.v1 import session_store_pb2_grpc

    stubs = {
        "store": session_store_pb2_grpc.SessionStoreStub(channels["store"]),
        "compressor": compressor_pb2_grpc.CompressorStub(channels["compressor"]),
        "agent": agent_pb2_grpc.AgentStub(channels["agent"]),
    }
    yield stubs
    for channel in channels.values():
        await channel.close()
    await agent.stop(0)
    await compressor.stop(0)


@pytest.fixture(scope="module")
async def alices(services):
    alice = bearer("matrix-alice")
    store = services["store"]
    session = (await store.CreateSession(pb.CreateSessionRequest(profile_id="small"), metadata=alice)).session
    await store.AppendMessages(
        pb.AppendMessagesRequest(
            session_id=session.id,
            messages=[
                common_pb2.Message(role="user", content="hello"),
                common_pb2.Message(role="assistant", content="hi"),
            ],
        ),
        metadata=alice,
    )
    return session.id


@pytest.mark.parametrize("service, method", ALL, ids=lambda v: v if isinstance(v, str) else v.name)
@pytest.mark.parametrize("caller", sorted(BAD_CREDENTIALS))
async def test_bad_credentials_are_unauthenticated(services, alices, service, method, caller):
    if method.name == "GetShared":
        pytest.skip("the share token is the credential (tested with the shares)")
    code = await call(services[service], method, request_for(method, alices), BAD_CREDENTIALS[caller])
    assert code == grpc.StatusCode.UNAUTHENTICATED, f"{service}.{method.name} as {caller}: {code}"


# Written by the services only (their own identity), so the owner is refused too.
SERVICE_ONLY = {"SetBaseline", "SetTokenCounts", "RecordBaseline", "RecordObservation"}
# Fields only the services may set (a model's calibration observations: every user's prompt sizes):
# the owner asks without them.
SERVICE_ONLY_FIELDS = {"GetBaseline": "model"}
# Prices the messages it is sent; it reads the session only to decide on compression (then refused).
READS_NOTHING_OF_THE_SESSION = {"CheckContextSize"}
SESSION_RPCS = [
    (s, m)
    for s, m in ALL
    if ("session_id" in m.input_type.fields_by_name or "session_ids" in m.input_type.fields_by_name)
    and m.name not in READS_NOTHING_OF_THE_SESSION
]


@pytest.mark.parametrize("service, method", SESSION_RPCS, ids=lambda v: v if isinstance(v, str) else v.name)
async def test_another_users_session_is_refused_and_the_owner_is_not(services, alices, service, method):
    bob, alice = bearer("matrix-bob"), bearer("matrix-alice")
    request = request_for(method, alices)
    if method.name == "SearchMatches":  # a search over ids you may not see finds nothing, it does not fail
        reply = await services[service].SearchMatches(request, metadata=bob)
        assert not reply.matches
        return
    code = await call(services[service], method, request, bob)
    owners = request_for(method, alices)
    if method.name in SERVICE_ONLY_FIELDS:
        owners.ClearField(SERVICE_ONLY_FIELDS[method.name])
    owner = await call(services[service], method, owners, alice)
    # Refused, or refused for the request's own shape exactly as the owner is: nothing about the
    # session differs between the two answers.
    assert code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND) or (
        code == owner == grpc.StatusCode.INVALID_ARGUMENT
    ), f"{method.name}: bob {code}, owner {owner}"
    if method.name not in SERVICE_ONLY:
        assert owner not in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED), (
            f"{method.name} as the owner: {owner}"
        )

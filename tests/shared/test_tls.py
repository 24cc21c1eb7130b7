"""TLS and mutual TLS on every server and channel, with certificates made here (trustme): the three
services talk to each other over mutual TLS, `pal` reaches them over TLS, and a caller without the
right certificate is turned away."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ollama_sim import Reply
from palimpsest.shared import tls
from palimpsest.shared.channels import open_channel
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import session_store_pb2 as store_pb
from tests.conftest import three_services
from tests.helpers.pal_cli import pal, pal_env


@dataclass(frozen=True)
class Pems:
    ca: str
    cert: str
    key: str


def issue(folder: Path, ca: trustme.CA, name: str) -> Pems:
    """A certificate for 127.0.0.1 (what the services' addresses say), signed by ``ca``."""
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    paths = Pems(str(folder / f"{name}-ca.pem"), str(folder / f"{name}.pem"), str(folder / f"{name}.key"))
    ca.cert_pem.write_to_path(paths.ca)
    leaf.cert_chain_pems[0].write_to_path(paths.cert)
    leaf.private_key_pem.write_to_path(paths.key)
    return paths


@pytest.fixture(scope="module")
def pems(tmp_path_factory) -> Pems:
    return issue(tmp_path_factory.mktemp("tls"), trustme.CA(), "service")


@pytest.fixture(scope="module")
def stranger(tmp_path_factory) -> Pems:
    """A certificate from a CA the services do not trust."""
    return issue(tmp_path_factory.mktemp("tls-stranger"), trustme.CA(), "stranger")


def mutual(settings, pems: Pems):
    return replace(settings, tls_cert=pems.cert, tls_key=pems.key, tls_client_ca=pems.ca, tls_ca=pems.ca)


@pytest.fixture(scope="module")
async def secured(base_settings, database_url, ollama_sim, profiles_file, pems):
    """The three services, each serving mutual TLS and calling the others over it."""
    async with three_services(mutual(base_settings, pems), database_url, ollama_sim, profiles_file) as services:
        yield services


async def health(address: str, credentials: grpc.ChannelCredentials | None) -> int:
    channel = (
        grpc.aio.secure_channel(address, credentials) if credentials is not None else grpc.aio.insecure_channel(address)
    )
    async with channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return reply.status


async def test_a_turn_runs_with_every_hop_over_mutual_tls(secured, base_settings, pems, ollama_sim):
    store, _, agent = secured
    ollama_sim.script(Reply(text="Sealed."))
    settings = mutual(base_settings, pems)
    async with open_channel(agent.address, settings) as channel:
        from palimpsest.v1 import agent_pb2_grpc

        events = [e async for e in agent_pb2_grpc.AgentStub(channel).RunStream(pb.RunStreamRequest(text="over tls"))]
    end = next(e.stream_end for e in events if e.HasField("stream_end"))
    assert end.reason == pb.STREAM_END_REASON_COMPLETED and end.text == "Sealed."
    # The Agent stored the answer (and asked the Compressor for its size checks) over its own TLS channels.
    async with open_channel(store.address, settings) as channel:
        from palimpsest.v1 import session_store_pb2_grpc

        session = (
            await session_store_pb2_grpc.SessionStoreStub(channel).GetSession(
                store_pb.GetSessionRequest(session_id=events[0].session_id, view=store_pb.SESSION_VIEW_FULL)
            )
        ).session
    assert [m.content for m in session.messages if m.role == "assistant"] == ["Sealed."]


async def test_callers_without_a_trusted_client_certificate_are_turned_away(secured, pems, stranger):
    store, _, _ = secured
    ours = tls.channel_credentials(pems.ca, pems.cert, pems.key)
    assert await health(store.address, ours) == health_pb2.HealthCheckResponse.SERVING
    refused = [
        None,  # plaintext
        tls.channel_credentials(pems.ca),  # TLS, but no certificate of its own
        tls.channel_credentials(pems.ca, stranger.cert, stranger.key),  # a certificate of another CA
        tls.channel_credentials(stranger.ca, pems.cert, pems.key),
    ]  # trusts another CA, not the server's
    for credentials in refused:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await health(store.address, credentials)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_tls_without_client_certificates_serves_any_caller_that_trusts_it(base_settings, database_url, pems):
    from palimpsest.store.app import start_store

    store = await start_store(replace(base_settings, tls_cert=pems.cert, tls_key=pems.key), port=0, dsn=database_url)
    try:
        assert await health(store.address, tls.channel_credentials(pems.ca)) == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.aio.AioRpcError):
            await health(store.address, None)
    finally:
        await store.stop(0)


async def test_pal_reaches_the_services_over_tls(secured, pems, stranger):
    store, compressor, agent = secured
    addresses = {"store": store.address, "compressor": compressor.address, "agent": agent.address}
    client = {"PALIMPSEST_TLS_CERT": pems.cert, "PALIMPSEST_TLS_KEY": pems.key}
    by_flag = await pal("--tls-ca", pems.ca, "health", "--json", env=pal_env(**addresses, **client))
    assert by_flag.code == 0, by_flag.stderr
    assert json.loads(by_flag.stdout)["healthy"] is True
    by_env = await pal("health", "--json", env=pal_env(**addresses, **client, PALIMPSEST_TLS_CA=pems.ca))
    assert by_env.code == 0 and json.loads(by_env.stdout)["healthy"] is True
    untrusted = await pal("health", "--json", env=pal_env(**addresses, **client, PALIMPSEST_TLS_CA=stranger.ca))
    assert untrusted.code != 0 and json.loads(untrusted.stdout)["healthy"] is False


@pytest.mark.services  # runs pal as a process of its own
async def test_pal_names_a_tls_setting_it_cannot_use(pems, tmp_path):
    ran = await pal("health", env=pal_env(PALIMPSEST_TLS_CA=str(tmp_path / "missing.pem")))
    ran.assert_one_line_error("PALIMPSEST_TLS_CA", "missing.pem")
    ran = await pal("health", env=pal_env(PALIMPSEST_TLS_CA=pems.ca, PALIMPSEST_TLS_CERT=pems.cert))
    ran.assert_one_line_error("PALIMPSEST_TLS_KEY")


@pytest.mark.parametrize(
    "setting, wants",
    [
        ({"tls_cert": "CERT"}, "PALIMPSEST_TLS_KEY is required"),
        ({"tls_client_ca": "CA"}, "PALIMPSEST_TLS_CLIENT_CA needs PALIMPSEST_TLS_CERT"),
        (
            {"tls_cert": "CERT", "tls_key": "/nonexistent/key.pem"},
            "PALIMPSEST_TLS_KEY: cannot read /nonexistent/key.pem",
        ),
        ({"tls_cert": "CERT", "tls_key": "TEXT"}, "PALIMPSEST_TLS_KEY: .* is not a PEM file"),
        ({"tls_ca": "TEXT"}, "PALIMPSEST_TLS_CA: .* is not a PEM file"),
    ],
)
async def test_a_service_names_the_tls_setting_it_cannot_use(base_settings, pems, tmp_path, setting, wants):
    from palimpsest.compressor.app import start_compressor

    text = tmp_path / "notes.txt"
    text.write_text("not a certificate")
    files = {"CERT": pems.cert, "CA": pems.ca, "TEXT": str(text)}
    with pytest.raises(SystemExit, match=wants):
        await start_compressor(replace(base_settings, **{k: files.get(v, v) for k, v in setting.items()}), port=0)

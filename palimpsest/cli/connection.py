"""Channels to the three services, addressed by the same variables the services read.

Every call goes through a guarded stub: it carries the caller's credentials and turns a failed call
into a ServiceError that names the service and its address, so commands never see raw RpcErrors.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Self, cast

import grpc
from grpc_health.v1 import health_pb2_grpc

from palimpsest.cli.errors import CliError, ServiceError, describe_rpc_error
from palimpsest.shared import tls
from palimpsest.shared.addresses import channel_target
from palimpsest.shared.settings.services import TOKEN
from palimpsest.v1 import agent_pb2_grpc, compressor_pb2_grpc, session_store_pb2_grpc

# Large enough for pasted images and long histories; the services use the same default.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# Unary calls answer from one database query or less; a hung service should not hang the shell.
UNARY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Endpoint:
    """One service as the user configured it."""

    name: str
    env: str
    default: str

    def address(self, environ: Mapping[str, str]) -> str:
        return environ.get(self.env, "").strip() or self.default


STORE = Endpoint("SessionStore", "PALIMPSEST_STORE_ADDR", "127.0.0.1:50051")
COMPRESSOR = Endpoint("Compressor", "PALIMPSEST_COMPRESSOR_ADDR", "127.0.0.1:50052")
AGENT = Endpoint("Agent", "PALIMPSEST_AGENT_ADDR", "127.0.0.1:50053")
ENDPOINTS = (STORE, COMPRESSOR, AGENT)


def open_channel(
    target: str, options: list[tuple[str, Any]], credentials: grpc.ChannelCredentials | None = None
) -> grpc.Channel:
    """The one place pal makes a channel: tests put grpc_testing's channel here to play the server's side."""
    if credentials is not None:
        return grpc.secure_channel(target, credentials, options=options)
    return grpc.insecure_channel(target, options=options)


class GuardedStream:
    """A server stream whose failures arrive as ServiceErrors; `cancel()` ends it from any thread."""

    def __init__(self, call: Any, fail: Any) -> None:
        self._call = call
        self._fail = fail

    def __iter__(self) -> Iterator[Any]:
        try:
            yield from self._call
        except grpc.RpcError as err:
            raise self._fail(err) from None

    def cancel(self) -> bool:
        return bool(self._call.cancel())

    def initial_metadata(self) -> Any:
        """Blocks until the server has sent its initial metadata (a watch: it is in place)."""
        try:
            return self._call.initial_metadata()
        except grpc.RpcError as err:
            raise self._fail(err) from None


class GuardedStub:
    """Wraps a generated stub: same method names, credentials added, errors translated."""

    def __init__(self, stub: Any, service: str, address: str, metadata: tuple[tuple[str, str], ...]) -> None:
        self._stub = stub
        self._service = service
        self._address = address
        self._metadata = metadata

    def _fail(self, err: grpc.RpcError) -> ServiceError:
        return describe_rpc_error(err, self._service, self._address)

    def __getattr__(self, method: str) -> Any:
        callable_ = getattr(self._stub, method)
        streams = isinstance(callable_, (grpc.UnaryStreamMultiCallable, grpc.StreamStreamMultiCallable))

        def call(request: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("metadata", self._metadata)
            if not streams:
                kwargs.setdefault("timeout", UNARY_TIMEOUT_S)
            try:
                result = callable_(request, **kwargs)
            except grpc.RpcError as err:
                raise self._fail(err) from None
            return GuardedStream(result, self._fail) if streams else result

        return call


class Connection:
    """Lazily opened channels, one per service, closed together."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.environ = dict(os.environ if environ is None else environ)
        self._channels: dict[str, grpc.Channel] = {}

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        token = self.environ.get(TOKEN.name, "").strip()
        return (("authorization", f"Bearer {token}"),) if token else ()

    def address(self, endpoint: Endpoint) -> str:
        return endpoint.address(self.environ)

    def channel(self, address: str) -> grpc.Channel:
        if address not in self._channels:
            options = [
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.lb_policy_name", "round_robin"),
            ]
            self._channels[address] = open_channel(channel_target(address), options, self.credentials())
        return self._channels[address]

    def credentials(self) -> grpc.ChannelCredentials | None:
        """TLS when PALIMPSEST_TLS_CA (or --tls-ca) is set; with PALIMPSEST_TLS_CERT and _KEY, mutual TLS."""
        try:
            return tls.channel_credentials(
                *(self.environ.get(name, "").strip() for name in (tls.CA_ENV, tls.CERT_ENV, tls.KEY_ENV))
            )
        except tls.TlsSettingError as exc:
            raise CliError(str(exc)) from None

    def _guarded(self, endpoint: Endpoint, stub_class: type, address: str | None = None) -> Any:
        address = address or self.address(endpoint)
        return GuardedStub(stub_class(self.channel(address)), endpoint.name, address, self.metadata)

    # The casts keep call sites readable; a GuardedStub answers every method its stub has.
    def store(self) -> session_store_pb2_grpc.SessionStoreStub:
        return cast(
            session_store_pb2_grpc.SessionStoreStub, self._guarded(STORE, session_store_pb2_grpc.SessionStoreStub)
        )

    def agent(self) -> agent_pb2_grpc.AgentStub:
        return cast(agent_pb2_grpc.AgentStub, self._guarded(AGENT, agent_pb2_grpc.AgentStub))

    def compressor(self) -> compressor_pb2_grpc.CompressorStub:
        return cast(compressor_pb2_grpc.CompressorStub, self._guarded(COMPRESSOR, compressor_pb2_grpc.CompressorStub))

    def health(self, endpoint: Endpoint, address: str) -> health_pb2_grpc.HealthStub:
        return cast(health_pb2_grpc.HealthStub, self._guarded(endpoint, health_pb2_grpc.HealthStub, address))

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

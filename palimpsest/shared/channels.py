"""Client channels between the services: one place for targets, balancing, retries, deadlines,
credentials and the errors a failed call raises."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Generator, Sequence
from types import TracebackType
from typing import Any

import grpc

from palimpsest.shared import tls, tracing
from palimpsest.shared.addresses import channel_target
from palimpsest.shared.auth import outgoing_credentials
from palimpsest.shared.errors import PalimpsestError, Unavailable, from_rpc_error
from palimpsest.shared.server import channel_options, settings_tls
from palimpsest.shared.settings import Settings

# UNAVAILABLE is retried a few times with backoff: a replica restarting must not fail a turn.
_RETRY = {
    "maxAttempts": 4,
    "initialBackoff": "0.1s",
    "maxBackoff": "1s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}
# Calls that may rightly take long: a compression waits for a summary, files stream megabytes.
LONG_CALLS = frozenset(
    {
        "/palimpsest.v1.Compressor/Compress",
        "/palimpsest.v1.SessionStore/PutFile",
        "/palimpsest.v1.SessionStore/GetFile",
    }
)
_SERVICE_CONFIG = {
    "loadBalancingConfig": [{"round_robin": {}}],
    "methodConfig": [
        {
            "name": [{"service": "palimpsest.v1.SessionStore"}, {"service": "palimpsest.v1.Compressor"}],
            "retryPolicy": _RETRY,
        }
    ],
}


class DefaultDeadline(
    grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor, grpc.aio.StreamUnaryClientInterceptor
):
    """A deadline on every call whose caller sets none: one hung store or Compressor must never
    hold a turn (and its session) forever. (Not the service config's `timeout`: gRPC 1.85 ended
    calls after ~0.15 s of a configured 2 s, measured through a frozen connection.) Not on a
    bidirectional call, which lives as long as its writer keeps it: the writer bounds each
    exchange (see _DirectStream)."""

    def __init__(self, seconds: float, long_seconds: float) -> None:
        self.seconds = seconds
        self.long_seconds = long_seconds

    def timeout_for(self, method: str | bytes) -> float:
        name = method.decode() if isinstance(method, bytes) else method
        return self.long_seconds if name in LONG_CALLS else self.seconds

    def _with_deadline(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        if details.timeout is not None:
            return details
        return grpc.aio.ClientCallDetails(
            details.method,
            self.timeout_for(details.method),
            details.metadata,
            details.credentials,
            details.wait_for_ready,
        )

    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await continuation(self._with_deadline(client_call_details), request)

    async def intercept_unary_stream(
        self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await continuation(self._with_deadline(client_call_details), request)

    async def intercept_stream_unary(
        self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails, request_iterator: Any
    ) -> Any:
        return await continuation(self._with_deadline(client_call_details), request_iterator)


class ServiceCalls(
    grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor, grpc.aio.StreamUnaryClientInterceptor
):
    """Every call to ``service``: carries the credentials of the caller being served (or the
    services' own, under ``auth.as_service()``), and a failed call raises the PalimpsestError for its
    status, naming ``service`` and ``address`` when it is down — so no call site handles
    AioRpcError or forgets a caller's token. A call that sets its own ``authorization`` keeps it.
    (A bidirectional call gets the same from _DirectStream.)"""

    def __init__(self, service: str, address: str, settings: Settings) -> None:
        self.service = service
        self.address = address
        self.settings = settings

    def with_credentials(
        self, metadata: grpc.aio.Metadata | Sequence[tuple[str, str | bytes]] | None
    ) -> grpc.aio.Metadata:
        """``metadata`` with the served caller's credentials added, unless it carries its own."""
        metadata = grpc.aio.Metadata(*(metadata or ()))
        if "authorization" not in metadata:
            for key, value in outgoing_credentials(self.settings.auth_enabled, self.settings.jwt_secret):
                metadata.add(key, value)
        return metadata

    def _with_credentials(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        return grpc.aio.ClientCallDetails(
            details.method,
            details.timeout,
            self.with_credentials(details.metadata),
            details.credentials,
            details.wait_for_ready,
        )

    def error(self, exc: grpc.aio.AioRpcError) -> PalimpsestError:
        return from_rpc_error(exc, self.service, self.address)

    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        call = await continuation(self._with_credentials(client_call_details), request)
        try:
            return await call
        except grpc.aio.AioRpcError as exc:
            raise self.error(exc) from None

    async def intercept_stream_unary(
        self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails, request_iterator: Any
    ) -> Any:
        # Unlike a unary call's, this interceptor must hand back a call, not the response.
        return _Answered(await continuation(self._with_credentials(client_call_details), request_iterator), self)

    async def intercept_unary_stream(
        self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        call = await continuation(self._with_credentials(client_call_details), request)

        async def responses() -> AsyncIterator[Any]:
            try:
                async for response in call:
                    yield response
            except grpc.aio.AioRpcError as exc:
                raise self.error(exc) from None

        return responses()


class _Answered:
    """A client-streaming call whose answer, when awaited, fails as ServiceCalls maps it."""

    def __init__(self, call: Any, calls: ServiceCalls) -> None:
        self._call = call
        self._calls = calls

    def __await__(self) -> Generator[Any, None, Any]:
        try:
            return (yield from self._call.__await__())
        except grpc.aio.AioRpcError as exc:
            raise self._calls.error(exc) from None

    def __getattr__(self, name: str) -> Any:  # cancel, done, code, …: the call's own
        return getattr(self._call, name)


class _UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await self.inner.intercept_unary_unary(continuation, client_call_details, request)


class _UnaryStream(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def intercept_unary_stream(
        self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await self.inner.intercept_unary_stream(continuation, client_call_details, request)


class _StreamUnary(grpc.aio.StreamUnaryClientInterceptor):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def intercept_stream_unary(
        self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails, request_iterator: Any
    ) -> Any:
        return await self.inner.intercept_stream_unary(continuation, client_call_details, request_iterator)


class _StreamStream(grpc.aio.StreamStreamClientInterceptor):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def intercept_stream_stream(
        self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails, request_iterator: Any
    ) -> Any:
        return await self.inner.intercept_stream_stream(continuation, client_call_details, request_iterator)


def each_kind(*interceptors: grpc.aio.ClientInterceptor) -> list[grpc.aio.ClientInterceptor]:
    """The interceptors, once per kind of call each handles: a grpc.aio channel files an
    interceptor under the first kind it is an instance of only, so one class serving all kinds
    would silently skip the streams (server streams such as Compress, and PutFile, went without
    their default deadline that way)."""
    kinds = (
        (grpc.aio.UnaryUnaryClientInterceptor, _UnaryUnary),
        (grpc.aio.UnaryStreamClientInterceptor, _UnaryStream),
        (grpc.aio.StreamUnaryClientInterceptor, _StreamUnary),
        (grpc.aio.StreamStreamClientInterceptor, _StreamStream),
    )
    return [adapter(i) for base, adapter in kinds for i in interceptors if isinstance(i, base)]


class _DirectUnary:
    """A unary-unary method of a service's channel with what DefaultDeadline and ServiceCalls do,
    done in the caller's own task: grpc.aio runs a channel's unary interceptors in a task of their
    own for every call, about 0.2–0.4 ms a call on a 2-core machine (measured with a health check),
    and a turn's answer waits for one such call between the model's last token and stream_end."""

    def __init__(self, inner: Any, method: str | bytes, deadline: DefaultDeadline, calls: ServiceCalls | None) -> None:
        self._inner = inner
        self._timeout = deadline.timeout_for(method)
        self._calls = calls

    def __call__(
        self,
        request: Any,
        *,
        timeout: float | None = None,
        metadata: Any = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> Any:
        if self._calls is not None:
            metadata = self._calls.with_credentials(metadata)
        call = self._inner(
            request,
            timeout=self._timeout if timeout is None else timeout,
            metadata=metadata,
            credentials=credentials,
            wait_for_ready=wait_for_ready,
            compression=compression,
        )
        return call if self._calls is None else _Answered(call, self._calls)


class _DirectStream:
    """A bidirectional method of a service's channel: the call carries the served caller's
    credentials (as of its opening) and its reads and writes fail as ServiceCalls maps them. No
    deadline: such a call lives as long as its writer keeps it, and bounds each exchange itself."""

    def __init__(self, inner: Any, calls: ServiceCalls | None) -> None:
        self._inner = inner
        self._calls = calls

    def __call__(
        self,
        request_iterator: Any = None,
        *,
        timeout: float | None = None,
        metadata: Any = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> Any:
        if self._calls is not None:
            metadata = self._calls.with_credentials(metadata)
        call = self._inner(
            request_iterator,
            timeout=timeout,
            metadata=metadata,
            credentials=credentials,
            wait_for_ready=wait_for_ready,
            compression=compression,
        )
        return call if self._calls is None else _MappedStream(call, self._calls)


class _MappedStream:
    """A bidirectional call whose reads and writes raise the PalimpsestError for a failed status."""

    def __init__(self, call: Any, calls: ServiceCalls) -> None:
        self._call = call
        self._calls = calls

    async def read(self) -> Any:
        try:
            return await self._call.read()
        except grpc.aio.AioRpcError as exc:
            raise self._calls.error(exc) from None

    async def write(self, request: Any) -> None:
        try:
            await self._call.write(request)
        except grpc.aio.AioRpcError as exc:
            raise self._calls.error(exc) from None
        except asyncio.InvalidStateError:  # the call had ended already: its status says why
            await self.read()  # (raises it, unless the call ended OK)
            raise Unavailable(f"{self._calls.service} at {self._calls.address} ended the call") from None

    def __getattr__(self, name: str) -> Any:  # done_writing, cancel, done, code, …: the call's own
        return getattr(self._call, name)


class _ServiceChannel:
    """A channel whose unary-unary calls go through _DirectUnary (unless ``direct_unary`` is off:
    traced, they take the channel's interceptors) and whose bidirectional calls go through
    _DirectStream; every other kind of call, and everything else, is the wrapped channel's (its
    interceptors handle those streams)."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        deadline: DefaultDeadline,
        calls: ServiceCalls | None,
        direct_unary: bool = True,
    ) -> None:
        self._channel = channel
        self._deadline = deadline
        self._calls = calls
        self._direct_unary = direct_unary

    def unary_unary(
        self, method: str, request_serializer: Any = None, response_deserializer: Any = None, *args: Any, **kwargs: Any
    ) -> Any:
        inner = self._channel.unary_unary(method, request_serializer, response_deserializer, *args, **kwargs)
        return _DirectUnary(inner, method, self._deadline, self._calls) if self._direct_unary else inner

    def stream_stream(
        self, method: str, request_serializer: Any = None, response_deserializer: Any = None, *args: Any, **kwargs: Any
    ) -> Any:
        inner = self._channel.stream_stream(method, request_serializer, response_deserializer, *args, **kwargs)
        return _DirectStream(inner, self._calls)

    def __getattr__(self, name: str) -> Any:  # the other kinds of call, close, get_state, channel_ready, …
        return getattr(self._channel, name)

    async def __aenter__(self) -> _ServiceChannel:
        await self._channel.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> Any:
        return await self._channel.__aexit__(exc_type, exc, traceback)


def open_channel(addresses: str, settings: Settings, *, service: str = "") -> grpc.aio.Channel:
    """A channel to ``addresses`` (one, or replicas). With ``service`` (its name as errors say it) a
    service's own channel: calls carry the served caller's credentials and raise PalimpsestErrors
    (ServiceCalls); without, a plain client's (tests, benchmarks) that sees the raw statuses."""
    options = [
        *channel_options(settings),
        ("grpc.service_config", json.dumps(_SERVICE_CONFIG)),
        ("grpc.enable_retries", 1),
    ]
    # The span innermost: it sees the call as sent (deadline, credentials) and its raw status.
    deadline = DefaultDeadline(settings.rpc_timeout_s, settings.compress_timeout_s)
    calls = ServiceCalls(service, addresses, settings) if service else None
    traced = tracing.channel_interceptors()
    interceptors = each_kind(deadline, *([calls] if calls else []), *traced)
    if not traced:  # the unary calls without an interceptor's task (see _DirectUnary)
        interceptors = [i for i in interceptors if not isinstance(i, grpc.aio.UnaryUnaryClientInterceptor)]
    credentials = settings_tls(lambda: tls.channel_credentials(settings.tls_ca, settings.tls_cert, settings.tls_key))
    if credentials is not None:
        channel = grpc.aio.secure_channel(
            channel_target(addresses), credentials, options=options, interceptors=interceptors
        )
    else:
        channel = grpc.aio.insecure_channel(channel_target(addresses), options=options, interceptors=interceptors)
    return _ServiceChannel(channel, deadline, calls, direct_unary=not traced)  # type: ignore[return-value]

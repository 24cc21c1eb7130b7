"""One server bootstrap for all three services: grpc.aio, health, reflection, graceful stop,
and one interceptor that checks each call's credentials before its request is read, refuses a
request by size before it is decoded, turns known errors into their status code (and hands the
caller's credentials on to the calls each RPC makes: see ``auth.serve_caller``)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import signal
import sys
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtoMessage

# gRPC's refusal of a send on a call that is over: not exported, and without type stubs.
from grpc._cython.cygrpc import ExecuteBatchError  # type: ignore[import-not-found]
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from palimpsest.shared import tls, tracing
from palimpsest.shared.auth import Identity, identity_from_metadata, serve_caller, serve_identity
from palimpsest.shared.errors import InvalidArgument, PalimpsestError, ResourceExhausted, Unauthenticated
from palimpsest.shared.metrics import MetricsEndpoint, MetricsInterceptor
from palimpsest.shared.reflection import DocumentedPool
from palimpsest.shared.settings import Settings
from palimpsest.shared.settings.services import DEBUG
from palimpsest.shared.validation import capped, first_nul, first_out_of_range, first_too_long

log = logging.getLogger("palimpsest.server")

T = TypeVar("T")

# A service's own failures that mean "a dependency is down" rather than a bug (a dead database).
Translate = Callable[[BaseException], "PalimpsestError | None"]
# A servicer method as gRPC calls it: (request or request iterator, context).
Handler = Callable[..., Any]


def method_paths(service: str, *names: str) -> frozenset[str]:
    """``/package.Service/Method`` of each of the service's methods named."""
    return frozenset(f"/{service}/{name}" for name in names)


@dataclass(frozen=True)
class Admission:
    """What a call must bring before its request is read: valid credentials for every method of the
    server's own services but the open ones (health and reflection are not the services' own),
    and a request within its method's limit."""

    authenticate: Callable[[Any], Identity]  # from the call's metadata; raises Unauthenticated
    services: tuple[str, ...]  # "/package.Service/" of each
    open_methods: frozenset[str]
    # Methods whose requests carry a conversation's content take the large limit, the rest the small.
    large_requests: frozenset[str]
    large_limit: tuple[int, str]  # (bytes, the setting that sets it)
    small_limit: tuple[int, str]

    @classmethod
    def of(
        cls,
        settings: Settings,
        services: Iterable[str],
        open_methods: Iterable[str] = (),
        large_requests: Iterable[str] = (),
    ) -> Admission:
        return cls(
            lambda metadata: identity_from_metadata(
                metadata, enabled=settings.auth_enabled, secret=settings.jwt_secret
            ),
            tuple(f"/{name}/" for name in services),
            frozenset(open_methods),
            frozenset(large_requests),
            (settings.max_message_bytes, "PALIMPSEST_MAX_MESSAGE_BYTES"),
            (min(settings.max_small_request_bytes, settings.max_message_bytes), "PALIMPSEST_MAX_SMALL_REQUEST_BYTES"),
        )

    def needs_credentials(self, method: str) -> bool:
        return method.startswith(self.services) and method not in self.open_methods

    def limit(self, method: str) -> tuple[int, str]:
        return self.large_limit if method in self.large_requests else self.small_limit


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Every call's way in. Its credentials first, from its metadata, before any of its request is
    received: without valid ones it is answered UNAUTHENTICATED and its request is never read (see
    ``_refusal``). Its request is refused by size before it is decoded, and as INVALID_ARGUMENT
    when it does not decode; a request with a NUL character in a string is refused next, naming
    the field (``deep``: in nested messages too). Known errors become their status; anything else
    is logged once and answered as INTERNAL."""

    def __init__(
        self, admission: Admission, *, deep_nul_check: bool = False, translate: Translate | None = None
    ) -> None:
        self.admission = admission
        self.deep = deep_nul_check
        self.translate = translate
        # The guarded handler of each method, made once: a server's handlers do not change, and
        # making it anew (four objects) was part of every call's way in.
        self._guarded: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        if self.admission.needs_credentials(method):
            try:  # (this runs in the call's own task: the servicer finds its caller there)
                serve_identity(self.admission.authenticate(handler_call_details.invocation_metadata))
            except Unauthenticated as refused:
                return _refusal(refused)
        guarded = self._guarded.get(method)
        if guarded is None or guarded[0] is not handler:  # (kept per method: never more than the methods)
            guarded = self._guarded[method] = (handler, self._guard(handler, method))
        return guarded[1]

    def _guard(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        read = _reading(handler.request_deserializer, method, *self.admission.limit(method))
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                _guard_unary(handler.unary_unary, method, self.deep, self.translate),
                request_deserializer=read,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                _guard_stream(handler.unary_stream, method, self.deep, self.translate),
                request_deserializer=read,
                response_serializer=_sending_bytes_as_they_are(handler.response_serializer),
            )
        if handler.stream_unary:  # (each request checked as the servicer reads it)
            return grpc.stream_unary_rpc_method_handler(
                _guard_unary(_checking_each(handler.stream_unary, None), method, None, self.translate),
                request_deserializer=read,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream:  # (the same)
            return grpc.stream_stream_rpc_method_handler(
                _guard_stream(_checking_each(handler.stream_stream, self.deep), method, None, self.translate),
                request_deserializer=read,
                response_serializer=_sending_bytes_as_they_are(handler.response_serializer),
            )
        return handler


def _refusal(error: PalimpsestError) -> grpc.RpcMethodHandler:
    """A handler that answers ``error`` without reading the request. gRPC receives a unary request
    whole before its handler runs; here nothing asks for it, so HTTP/2 flow control holds the
    sender to a window's worth, dropped when the call ends."""

    async def refuse(_requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(error.code, capped(str(error)))

    return grpc.stream_unary_rpc_method_handler(refuse)


@dataclass(frozen=True)
class Refused:
    """A request refused before it was decoded; its handler's guard answers with ``error``."""

    error: PalimpsestError


def _reading(
    deserialize: Callable[[bytes], Any] | None, method: str, limit: int, setting: str
) -> Callable[[bytes], Any]:
    """The method's request deserializer, refusing a request over the method's limit before it is
    decoded, and one that does not decode. (gRPC would log a deserializer's exception as the
    servicer's, with its traceback, and answer UNKNOWN.)"""

    def read(data: bytes) -> Any:
        if len(data) > limit:
            return Refused(
                ResourceExhausted(f"request: {len(data):,} bytes; {method} takes at most {limit:,} ({setting})")
            )
        if deserialize is None:
            return data
        try:
            return deserialize(data)
        except DecodeError:
            return Refused(InvalidArgument("request", "not a well-formed message of this method's request type"))

    return read


def _sending_bytes_as_they_are(serialize: Callable[[Any], bytes] | None) -> Callable[[Any], bytes] | None:
    """A stream's response serializer that sends a message the servicer hands over already
    serialized (bytes: the Agent's events, kept serialized and sent to many readers) as it is."""
    if serialize is None:
        return None
    return lambda message: message if isinstance(message, bytes) else serialize(message)


def _client_left(method: str) -> asyncio.CancelledError:
    """gRPC refused to send on a call that is over: its client left (or its deadline passed). That
    is the call being cancelled, not a failure of ours: a debug line, no traceback."""
    log.debug("%s: the call ended under an answer (its client left)", method)
    return asyncio.CancelledError()


class ClientLeftFilter(logging.Filter):
    """gRPC's aio server logs a send refused on a call whose client has just left as an ERROR with a
    traceback when it sees the refusal before the call's end (a race in grpcio): that is a client
    leaving, a debug line at most."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], ExecuteBatchError):
            record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
            record.msg, record.args = f"{record.getMessage()}: its client left", None
            record.exc_info, record.exc_text = None, None
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


CLIENT_LEFT_FILTER = ClientLeftFilter()


async def _abort_for(
    exc: BaseException, context: grpc.aio.ServicerContext, method: str, translate: Translate | None = None
) -> None:
    if translate is not None and not isinstance(exc, PalimpsestError):
        exc = translate(exc) or exc
    try:
        if isinstance(exc, PalimpsestError):
            await context.abort(exc.code, capped(str(exc)))
        log.exception("unexpected error in %s", method, exc_info=exc)
        await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method}: {type(exc).__name__}")
    except ExecuteBatchError:
        raise _client_left(method) from None


def _refuse_bad_request(request: Any, deep: bool | None) -> None:
    """A request refused before it was decoded; NUL characters, over-long identifying strings, and
    (at any depth, whatever ``deep``) times out of range and enum values the proto does not define
    (``deep`` None: a streamed request, whose strings its servicer checks, if at all)."""
    if isinstance(request, Refused):
        raise request.error
    if deep is not None and isinstance(request, ProtoMessage):
        field = first_nul(request, deep=deep)
        if field:
            raise InvalidArgument(field, "must not contain NUL characters")
        too_long = first_too_long(request)
        if too_long:
            raise InvalidArgument(too_long[0], f"must be at most {too_long[1]} characters")
        out_of_range = first_out_of_range(request)
        if out_of_range:
            raise InvalidArgument(*out_of_range)


def _checking_each(fn: Handler, deep: bool | None) -> Handler:
    """A client-streaming method whose requests are refused, as a unary call's request is, when the
    servicer reads one that was refused before decoding or (``deep`` not None) one with a NUL or an
    over-long identifying string."""

    async def checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for request in requests:
            _refuse_bad_request(request, deep)
            yield request

    return lambda requests, context: fn(checked(requests), context)


def _guard_unary(fn: Handler, method: str, deep: bool | None, translate: Translate | None) -> Handler:
    async def guarded(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        serve_caller(context.invocation_metadata())  # every call made downstream carries them on
        try:
            _refuse_bad_request(request, deep)
            return await fn(request, context)
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except ExecuteBatchError:
            raise _client_left(method) from None
        except Exception as exc:  # noqa: BLE001 — this is the one place that maps them all
            await _abort_for(exc, context, method, translate)

    return guarded


def _guard_stream(fn: Handler, method: str, deep: bool | None, translate: Translate | None) -> Handler:
    async def guarded(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        serve_caller(context.invocation_metadata())  # (in the RPC's own task, which drives this generator)
        try:
            _refuse_bad_request(request, deep)
            result = fn(request, context)
            if inspect.isasyncgen(result):
                async for item in result:
                    yield item
            else:
                await result
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except ExecuteBatchError:
            raise _client_left(method) from None
        except Exception as exc:  # noqa: BLE001
            await _abort_for(exc, context, method, translate)

    return guarded


def settings_tls(make: Callable[[], T]) -> T:
    """Credentials from the TLS settings; a setting that cannot be used stops the service, naming it."""
    try:
        return make()
    except tls.TlsSettingError as exc:
        raise SystemExit(str(exc)) from None


def server_options(settings: Settings) -> list[tuple[str, int]]:
    # A GOAWAY after this long (no grace: calls in flight run to their end) makes clients resolve
    # their `dns:///` target again, so replicas added since get their share of new calls.
    age = (
        [("grpc.max_connection_age_ms", int(settings.max_connection_age_s * 1000))]
        if settings.max_connection_age_s > 0
        else []
    )
    return [
        *age,
        # gRPC shares a port by default (SO_REUSEPORT): a second server on a taken port would start
        # silently and split the traffic. A taken port must be an error.
        ("grpc.so_reuseport", 0),
        ("grpc.max_send_message_length", settings.max_message_bytes),
        ("grpc.max_receive_message_length", settings.max_message_bytes),
        ("grpc.keepalive_time_ms", settings.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", settings.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ]


def channel_options(settings: Settings) -> list[tuple[str, object]]:
    return [
        ("grpc.max_send_message_length", settings.max_message_bytes),
        ("grpc.max_receive_message_length", settings.max_message_bytes),
        ("grpc.keepalive_time_ms", settings.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", settings.keepalive_timeout_ms),
        # A restarted service is found again within two seconds: gRPC's own backoff grows to two
        # minutes, and every turn meanwhile would run without the Compressor.
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 2_000),
    ]


@dataclass
class RunningServer:
    server: grpc.aio.Server
    health: health.aio.HealthServicer
    port: int
    service_names: tuple[str, ...]
    on_stop: Callable[[], Awaitable[None]] | None = None
    servicer: object | None = None  # the main servicer, for in-process callers and tests
    # Runs beside the grace period with its length: a service whose calls can outlast it (the
    # Agent's turns) ends them its own way before gRPC cancels them.
    on_drain: Callable[[float], Awaitable[None]] | None = None
    stopping: bool = False
    metrics: MetricsEndpoint | None = None  # /metrics, when PALIMPSEST_METRICS_PORT is set

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def set_serving(self, serving: bool) -> None:
        if serving and self.stopping:  # a dependency coming back must not call traffic to a draining server
            return
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *self.service_names):
            await self.health.set(name, status)

    async def stop(self, grace: float | None = 5.0) -> None:
        """Health NOT_SERVING first (balancers stop sending), then no new calls while the calls in
        flight get `grace` seconds to finish; whatever is left then is cancelled."""
        self.stopping = True  # first: a dependency returning meanwhile must not turn health back on
        await self.set_serving(False)
        stopped = asyncio.ensure_future(self.server.stop(grace))
        try:
            if self.on_drain is not None:
                await self.on_drain(grace or 0.0)
        finally:
            await stopped
        if self.on_stop is not None:
            await self.on_stop()
        if self.metrics is not None:
            await asyncio.to_thread(self.metrics.close)


async def start_server(
    register: Callable[[grpc.aio.Server], None],
    service_names: Iterable[str],
    *,
    settings: Settings,
    port: int,
    host: str = "127.0.0.1",
    on_stop: Callable[[], Awaitable[None]] | None = None,
    deep_nul_check: bool = False,
    translate: Translate | None = None,
    open_methods: Iterable[str] = (),
    large_requests: Iterable[str] = (),
) -> RunningServer:
    """Start a server with the given servicers on host:port (0 picks a free port). ``deep_nul_check``:
    refuse NUL characters in nested messages too (the store, which keeps every string).
    ``open_methods``: the services' methods called without credentials; ``large_requests``: those
    whose requests may be as large as PALIMPSEST_MAX_MESSAGE_BYTES (see ``Admission``)."""
    credentials = settings_tls(
        lambda: tls.server_credentials(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
    )
    names = tuple(service_names)
    # Outermost first: the metrics and the RPC's span see the status the ErrorInterceptor gave.
    interceptors: list[grpc.aio.ServerInterceptor] = [
        *([MetricsInterceptor()] if settings.metrics_port is not None else []),
        *tracing.server_interceptors(),
        ErrorInterceptor(
            Admission.of(settings, names, open_methods, large_requests),
            deep_nul_check=deep_nul_check,
            translate=translate,
        ),
    ]
    logging.getLogger("grpc._cython.cygrpc").addFilter(CLIENT_LEFT_FILTER)  # (added once, however many servers)
    server = grpc.aio.server(interceptors=interceptors, options=server_options(settings))
    register(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*names, health.SERVICE_NAME, reflection.SERVICE_NAME),
        server,
        # reflection only asks the pool for files and symbols: a stand-in
        # that adds the comments is all it needs
        pool=DocumentedPool(),  # type: ignore[arg-type]
    )
    try:
        bound = (
            server.add_secure_port(f"{host}:{port}", credentials)
            if credentials is not None
            else server.add_insecure_port(f"{host}:{port}")
        )
    except RuntimeError:  # grpc's own words for it: "Failed to bind to address"
        bound = 0
    if bound == 0:
        raise SystemExit(f"cannot listen on {host}:{port}: the port is taken or not allowed")
    metrics = None
    if settings.metrics_port is not None:
        try:
            metrics = await asyncio.to_thread(MetricsEndpoint, host, settings.metrics_port)
        except SystemExit:
            await server.stop(None)  # bound, not started: let its port go
            raise
    await server.start()
    running = RunningServer(server, health_servicer, bound, names, on_stop, metrics=metrics)
    await running.set_serving(True)
    return running


async def serve_forever(running: RunningServer, *, name: str, grace: float) -> None:
    """Block until SIGTERM/SIGINT, then stop gracefully."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("%s serving on %s", name, running.address)
    await stop.wait()
    log.info("%s stopping (grace %.1fs)", name, grace)
    await running.stop(grace)


# Set to 1 for the full traceback of a failure to start (otherwise one line says what to fix).
DEBUG_ENV = DEBUG.name


def debug_enabled() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # httpx logs every request at INFO: the Agent's Ollama check alone would be a line every 10 s.
    logging.getLogger("httpx").setLevel(logging.WARNING)


def startup_failure(name: str, exc: BaseException) -> str:
    """One line for a service that could not start. A known failure raises SystemExit with a message
    that names the setting and the fix; anything else is named by its type, with how to see more."""
    if isinstance(exc, SystemExit):
        return f"{name} did not start: {exc.code}"
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return (
        f"{name} did not start: {type(exc).__name__}{': ' + detail if detail else ''} "
        f"(set {DEBUG_ENV}=1 for the traceback)"
    )


def run_service(
    start: Callable[..., Awaitable[RunningServer]], listen_address: Callable[[Settings], str], name: str
) -> None:
    """`python -m services.<name>`: settings from the environment, serve until SIGTERM/SIGINT. A
    failure to start is one line on stderr and exit status 1 (the traceback with PALIMPSEST_DEBUG=1)."""
    configure_logging()

    async def main() -> None:
        settings = Settings.from_env()
        tracing.start(settings.otlp_endpoint, f"palimpsest-{name.lower()}")  # before any channel or server
        host, port = listen_address(settings).rsplit(":", 1)
        running = await start(settings, port=int(port), host=host)
        await serve_forever(running, name=name, grace=settings.grace_seconds)

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    except (SystemExit, Exception) as exc:  # noqa: BLE001 — every failure to start becomes its line
        if isinstance(exc, SystemExit) and not isinstance(exc.code, str):
            raise
        if debug_enabled():
            traceback.print_exception(exc.__context__ if isinstance(exc, SystemExit) and exc.__context__ else exc)
        print(startup_failure(name, exc), file=sys.stderr, flush=True)
        raise SystemExit(1) from None

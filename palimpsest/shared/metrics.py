"""Prometheus metrics of the three services: every metric is named here, and each service serves
them on its own `/metrics` port when PALIMPSEST_METRICS_PORT is set (off by default).

A process has one registry (prometheus-client's default, with its process and Python collectors);
services started in one process (the tests) share it, as they share the process's CPU.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper
from prometheus_client import REGISTRY, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from palimpsest.shared.errors import PalimpsestError
from palimpsest.v1 import agent_pb2, compressor_pb2

if TYPE_CHECKING:
    import asyncpg

    from palimpsest.shared.reports import Verdict

log = logging.getLogger("palimpsest.metrics")

# From a cached read (1 ms) to a turn with tools or a compression waiting on a summary (minutes).
_RPC_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_SUMMARY_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)
# |count − reported| ÷ reported: exact counts land under 1%, a bare heuristic can miss by half.
_ERROR_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)

RPC_SECONDS = Histogram(
    "palimpsest_rpc_duration_seconds",
    "Time to serve one RPC, by method and status code",
    ["method", "code"],
    buckets=_RPC_BUCKETS,
)
TURNS = Counter("palimpsest_turns_total", "Turns ended (their stream_end), by end reason", ["reason"])
MODEL_TOKENS = Counter(
    "palimpsest_model_tokens_total",
    "Tokens the model reported per call: prompt tokens in, generated tokens out",
    ["direction"],
)
COMPRESSIONS = Counter(
    "palimpsest_compressions_total", "Compressions committed, by path and reason", ["path", "reason"]
)
SUMMARY_SECONDS = Histogram(
    "palimpsest_summary_duration_seconds",
    "One summarizer call to the model, by outcome",
    ["outcome"],
    buckets=_SUMMARY_BUCKETS,
)
COUNT_ERROR = Histogram(
    "palimpsest_token_count_error_ratio",
    "How far a prompt's count was from the model's report (|count - reported| / reported), "
    "by the method that made the count",
    ["method"],
    buckets=_ERROR_BUCKETS,
)
CUT_PROMPTS = Counter(
    "palimpsest_cut_prompts_total", "Model reports that proved the prompt was cut (fewer tokens than its content alone)"
)


def _enum_label(enum: EnumTypeWrapper, value: int, prefix: str) -> str:
    try:
        return enum.Name(value).removeprefix(prefix).lower()
    except ValueError:  # a number newer than this code
        return str(value)


def count_method(method: int) -> str:
    """ESTIMATE_METHOD_BASELINE_DELTA → baseline_delta."""
    return _enum_label(compressor_pb2.EstimateMethod, method, "ESTIMATE_METHOD_")


def model_report(verdict: Verdict, *, method: int, counted: int, reported: int) -> None:
    """A model's report judged (``palimpsest.shared.reports.judge``): a proven cut, or how far the
    count the prompt was sent with was from it. Reports that look like a cut teach nothing here either."""
    if verdict.prompt_cut:
        CUT_PROMPTS.inc()
    elif verdict.learned and counted > 0 and reported > 0:
        COUNT_ERROR.labels(count_method(method)).observe(abs(counted - reported) / reported)


def turn_ended(reason: int) -> None:
    """STREAM_END_REASON_MAX_ITERATIONS → max_iterations."""
    TURNS.labels(_enum_label(agent_pb2.StreamEndReason, reason, "STREAM_END_REASON_")).inc()


@contextmanager
def summary_call() -> Iterator[None]:
    """Times one summarizer call, filed as ok or, when it raises, failed."""
    started, outcome = time.perf_counter(), "failed"
    try:
        yield
        outcome = "ok"
    finally:
        SUMMARY_SECONDS.labels(outcome).observe(time.perf_counter() - started)


def model_call(prompt_tokens: int, completion_tokens: int) -> None:
    MODEL_TOKENS.labels("in").inc(max(prompt_tokens, 0))
    MODEL_TOKENS.labels("out").inc(max(completion_tokens, 0))


class _PoolCollector(Collector):
    """Connections of the asyncpg pools of this process (the SessionStore's one), read at scrape time."""

    def __init__(self) -> None:
        self._pools: list[asyncpg.Pool] = []
        self._lock = threading.Lock()  # pools are added on the event loop, read on the scrape's thread

    def add(self, pool: asyncpg.Pool) -> None:
        with self._lock:
            self._pools.append(pool)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:  # a closed pool (a stopped store) is let go here
            self._pools = pools = [p for p in self._pools if not p.is_closing()]
        size = sum(p.get_size() for p in pools)
        idle = sum(p.get_idle_size() for p in pools)
        in_use = GaugeMetricFamily(
            "palimpsest_db_pool_connections", "Database pool connections, by state", labels=["state"]
        )
        in_use.add_metric(["in_use"], size - idle)
        in_use.add_metric(["idle"], idle)
        yield in_use
        yield GaugeMetricFamily(
            "palimpsest_db_pool_max_connections",
            "The database pools' size limit",
            value=sum(p.get_max_size() for p in pools),
        )


_POOLS = _PoolCollector()
REGISTRY.register(_POOLS)


def watch_pool(pool: asyncpg.Pool) -> None:
    _POOLS.add(pool)


class MetricsInterceptor(grpc.aio.ServerInterceptor):
    """Times every RPC to its end (a stream: its last message) and files it under its status code,
    as the client sees it: outermost, so the ErrorInterceptor's mapping has happened."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        for kind, make in (
            (handler.unary_unary, grpc.unary_unary_rpc_method_handler),
            (handler.unary_stream, grpc.unary_stream_rpc_method_handler),
            (handler.stream_unary, grpc.stream_unary_rpc_method_handler),
            (handler.stream_stream, grpc.stream_stream_rpc_method_handler),
        ):
            if kind is not None:
                streams = kind in (handler.unary_stream, handler.stream_stream)
                return make(
                    (_timed_stream if streams else _timed_unary)(kind, method),
                    request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer,
                )
        return handler


def _code(context: grpc.aio.ServicerContext[Any, Any], failure: BaseException | None) -> str:
    """The status the client got: the one set or aborted with (None: OK), CANCELLED for a call the
    client left (the handler is cancelled, or its stream closed)."""
    if isinstance(failure, (asyncio.CancelledError, GeneratorExit)):
        return "CANCELLED"
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code.name
    return "OK" if failure is None else "UNKNOWN"


@contextmanager
def _timing(context: grpc.aio.ServicerContext[Any, Any], method: str) -> Iterator[None]:
    started, failure = time.perf_counter(), None
    try:
        yield
    except BaseException as exc:
        failure = exc
        raise
    finally:
        RPC_SECONDS.labels(method, _code(context, failure)).observe(time.perf_counter() - started)


@contextmanager
def timed_as(method: str) -> Iterator[None]:
    """One request of a stream timed and filed as the unary call it stands for (an append on an
    AppendStream as an AppendMessages), under the status its failure carries."""
    started, code = time.perf_counter(), "OK"
    try:
        yield
    except BaseException as exc:  # (what the server's error guard will answer for it)
        code = (
            "CANCELLED"
            if isinstance(exc, asyncio.CancelledError)
            else exc.code.name
            if isinstance(exc, PalimpsestError)
            else "INTERNAL"
        )
        raise
    finally:
        RPC_SECONDS.labels(method, code).observe(time.perf_counter() - started)


def _timed_unary(fn: Callable[..., Any], method: str) -> Callable[..., Awaitable[Any]]:
    async def timed(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        with _timing(context, method):
            return await fn(request, context)

    return timed


def _timed_stream(fn: Callable[..., Any], method: str) -> Callable[..., AsyncIterator[Any]]:
    async def timed(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        with _timing(context, method):
            async for item in fn(request, context):
                yield item

    return timed


class MetricsEndpoint:
    """prometheus-client's own HTTP server (a thread) on host:port; port 0 picks a free one."""

    def __init__(self, host: str, port: int) -> None:
        try:
            self._server, self._thread = start_http_server(port, addr=host)
        except OSError as exc:
            raise SystemExit(
                f"PALIMPSEST_METRICS_PORT: cannot serve metrics on {host}:{port}: {exc.strerror}"
            ) from None
        self.port: int = self._server.server_port
        log.info("metrics on http://%s:%d/metrics", host, self.port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

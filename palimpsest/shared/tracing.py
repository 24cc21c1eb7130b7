"""OpenTelemetry traces of the services: gRPC (servers and channels, the trace context carried in
the calls' metadata), PostgreSQL through asyncpg, and Ollama through httpx. One turn is one trace,
from the Agent's RunStream through the Compressor and the SessionStore to the model's calls.

Off unless OTEL_EXPORTER_OTLP_ENDPOINT (or _TRACES_ENDPOINT) is set, and then exported over OTLP/gRPC
in batches. Off costs nothing: no OpenTelemetry module is imported, no interceptor is added.
Tracing is per process: switched on once, before the service opens its channels and its server.
"""

from __future__ import annotations

import logging
import os
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

log = logging.getLogger("palimpsest.tracing")

_provider: TracerProvider | None = None


def start(endpoint: str, service: str) -> None:
    """A service's process: traces to the OTLP collector at ``endpoint`` (empty: stay off)."""
    if not endpoint or _provider is not None:
        return
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # (the exporter reads its other OTEL_EXPORTER_OTLP_* settings, headers and certificates, itself)
    install(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)), service)
    log.info("traces go to %s over OTLP as %s", endpoint, os.environ.get("OTEL_SERVICE_NAME") or service)


def install(processor: SpanProcessor, service: str) -> TracerProvider:
    """Spans of this process's servers, channels, queries and model calls go to ``processor``
    (tests hand it an in-memory exporter). OTEL_SERVICE_NAME, when set, names the service."""
    global _provider
    from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider(
        resource=Resource.create({} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": service})
    )
    provider.add_span_processor(processor)
    # Both patch their library's classes, so the pool and the Ollama client made later are traced.
    AsyncPGInstrumentor().instrument(tracer_provider=provider)
    HTTPXClientInstrumentor().instrument(tracer_provider=provider)
    _provider = provider
    return provider


def uninstall() -> None:
    """Tracing off again, its spans flushed (tests: the rest of the process runs untraced)."""
    global _provider
    if _provider is None:
        return
    from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    AsyncPGInstrumentor().uninstrument()
    HTTPXClientInstrumentor().uninstrument()
    _provider.shutdown()
    _provider = None


def untraced() -> AbstractContextManager[object]:
    """For a background loop (a health check every few seconds): its queries and requests are no
    one's request, and would fill the collector with one-span traces."""
    if _provider is None:
        return nullcontext()
    from opentelemetry.instrumentation.utils import suppress_instrumentation

    return suppress_instrumentation()


def server_interceptors() -> list[Any]:
    """The server span of every RPC, continuing the caller's trace from the call's metadata."""
    if _provider is None:
        return []
    from opentelemetry.instrumentation.grpc import aio_server_interceptor

    return [aio_server_interceptor(tracer_provider=_provider)]


def channel_interceptors() -> list[Any]:
    """A client span for every call, its trace context put into the call's metadata."""
    if _provider is None:
        return []
    from opentelemetry.instrumentation.grpc import aio_client_interceptors

    return aio_client_interceptors(tracer_provider=_provider)

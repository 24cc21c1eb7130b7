"""OpenTelemetry: one turn is one trace, from the Agent's RunStream through the Compressor and the
SessionStore (and their PostgreSQL queries) to Ollama. The three services run in this process (so
their spans reach one in-memory exporter) and talk over real loopback gRPC, the trace context
crossing each hop in the calls' metadata. A service in a process of its own exports over OTLP to a
receiver on loopback."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from ollama_sim import Reply
from palimpsest.shared import tracing
from palimpsest.shared.ports import free_port
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import agent_pb2_grpc, common_pb2, compressor_pb2_grpc, session_store_pb2_grpc
from palimpsest.v1 import compressor_pb2 as cpb
from tests.conftest import three_services
from tests.helpers.calls import session_due_for_a_post_turn_compression
from tests.helpers.waiting import until


@pytest.fixture(scope="module")
async def traced(base_settings, database_url, ollama_sim, profiles_file):
    """The exporter, and the three services started with tracing on (and off again afterwards)."""
    exporter = InMemorySpanExporter()
    tracing.install(SimpleSpanProcessor(exporter), "palimpsest-tests")
    try:
        async with three_services(base_settings, database_url, ollama_sim, profiles_file) as (store, _, agent):
            yield exporter, store, agent
    finally:
        tracing.uninstall()


def parents(span: ReadableSpan, by_id: dict[int, ReadableSpan]) -> list[ReadableSpan]:
    """The span's ancestors, nearest first."""
    chain = []
    while span.parent is not None and span.parent.span_id in by_id:
        span = by_id[span.parent.span_id]
        chain.append(span)
    return chain


def server(name: str):
    return lambda s: s.kind == SpanKind.SERVER and s.name == name


async def test_one_turn_is_one_trace_from_the_agent_to_the_store_and_the_model(traced, ollama_sim):
    exporter, store, agent = traced
    async with grpc.aio.insecure_channel(store.address) as channel:
        session = await session_due_for_a_post_turn_compression(session_store_pb2_grpc.SessionStoreStub(channel))
    ollama_sim.set_responder(
        lambda body: Reply(text="- summary\nKEYS: a") if body.get("stream") is False else Reply(text="traced answer")
    )
    exporter.clear()
    try:
        async with grpc.aio.insecure_channel(agent.address) as channel:
            events = [
                e
                async for e in agent_pb2_grpc.AgentStub(channel).RunStream(
                    pb.RunStreamRequest(text="trace me", session_id=session.id)
                )
            ]
        await asyncio.gather(*agent.servicer.deps.post_turn_tasks)  # the post-turn compression belongs to it too
    finally:
        ollama_sim.set_responder(None)
    assert events[-1].stream_end.reason == pb.STREAM_END_REASON_COMPLETED

    spans = exporter.get_finished_spans()
    (turn,) = [s for s in spans if server("/palimpsest.v1.Agent/RunStream")(s)]
    assert turn.parent is None  # the client sent no trace: the turn starts one
    by_id = {s.context.span_id: s for s in spans}
    assert {s.context.trace_id for s in spans} == {turn.context.trace_id}  # (health checks are untraced)
    assert all(s is turn or turn in parents(s, by_id) for s in spans)  # every span hangs under the turn

    def under(span: ReadableSpan, name: str) -> bool:
        return any(server(name)(p) for p in parents(span, by_id))

    compress = [s for s in spans if server("/palimpsest.v1.Compressor/Compress")(s)]
    assert compress, [s.name for s in spans]
    # The Compressor's own calls: its commit to the store (and that store's queries), its summary from Ollama.
    commit = [s for s in spans if server("/palimpsest.v1.SessionStore/CommitCompression")(s)]
    assert commit and all(under(s, "/palimpsest.v1.Compressor/Compress") for s in commit)
    queries = [s for s in spans if s.attributes and s.attributes.get("db.system") == "postgresql"]
    assert any(under(q, "/palimpsest.v1.SessionStore/CommitCompression") for q in queries)
    chats = [
        s
        for s in spans
        if s.kind == SpanKind.CLIENT
        and s.attributes
        and str(s.attributes.get("url.full") or s.attributes.get("http.url") or "").endswith("/api/chat")
    ]
    assert any(under(c, "/palimpsest.v1.Compressor/Compress") for c in chats)  # the summary
    assert any(not under(c, "/palimpsest.v1.Compressor/Compress") for c in chats)  # the turn's own answer


async def test_a_failed_call_is_marked_on_its_span(traced):
    exporter, _, agent = traced
    exporter.clear()
    async with grpc.aio.insecure_channel(agent.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError):
            await agent_pb2_grpc.AgentStub(channel).Run(pb.RunRequest(text=""))
    # The server's span ends once its answer is on its way: the client can have it a moment before.
    assert await until(lambda: any(server("/palimpsest.v1.Agent/Run")(s) for s in exporter.get_finished_spans()))
    (run,) = [s for s in exporter.get_finished_spans() if server("/palimpsest.v1.Agent/Run")(s)]
    # (the caller's mistake: by OpenTelemetry's conventions the code is noted, the server span not failed)
    assert run.attributes is not None
    assert run.attributes.get("rpc.grpc.status_code") == grpc.StatusCode.INVALID_ARGUMENT.value[0]


def test_tracing_off_imports_nothing_of_opentelemetry():
    """No endpoint: the services start without loading a module of OpenTelemetry (a process of its own,
    as this one has tracing loaded)."""
    script = (
        "import sys\n"
        "import palimpsest.agent.app, palimpsest.compressor.app, palimpsest.store.app\n"
        "from palimpsest.shared import tracing\n"
        "tracing.start('', 'palimpsest-tests')\n"
        "assert tracing.server_interceptors() == [] and tracing.channel_interceptors() == []\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "[]"


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver on loopback: what a collector would be sent."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, str]] = []  # (service.name, span name)

    async def Export(self, request, context):
        for resource_spans in request.resource_spans:
            service = next(
                (a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"), ""
            )
            self.spans += [(service, span.name) for scope in resource_spans.scope_spans for span in scope.spans]
        return trace_service_pb2.ExportTraceServiceResponse()


async def test_a_service_exports_its_spans_over_otlp_when_an_endpoint_is_set(store_server):
    collector = Collector()
    receiver = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, receiver)
    receiver_port = receiver.add_insecure_port("127.0.0.1:0")
    await receiver.start()
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PALIMPSEST_"))},
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver_port}",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "PALIMPSEST_STORE_ADDR": store_server.address,
        "PALIMPSEST_COMPRESSOR_ADDR": f"127.0.0.1:{port}",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "palimpsest.compressor", env=env, stderr=asyncio.subprocess.DEVNULL
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            estimate = compressor_pb2_grpc.CompressorStub(channel).EstimateTokens
            request = cpb.EstimateTokensRequest(model="m", messages=[common_pb2.Message(role="user", content="hi")])
            await estimate(request, wait_for_ready=True, timeout=60)
        assert await until(
            lambda: ("palimpsest-compressor", "/palimpsest.v1.Compressor/EstimateTokens") in collector.spans
        ), collector.spans
    finally:
        proc.terminate()
        await proc.wait()
        await receiver.stop(0)

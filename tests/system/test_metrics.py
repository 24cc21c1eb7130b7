"""Prometheus metrics: each service's real /metrics endpoint scraped over HTTP after real turns and
compressions against the simulator. The registry is the process's, shared with other tests on the
same worker, so every assertion is on what changed between two scrapes."""

from __future__ import annotations

import uuid
from dataclasses import replace

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ollama_sim import Reply
from palimpsest.shared.settings import Settings
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import agent_pb2_grpc, common_pb2, compressor_pb2_grpc, session_store_pb2_grpc
from palimpsest.v1 import compressor_pb2 as cpb
from palimpsest.v1 import session_store_pb2 as store_pb
from tests.conftest import three_services

Samples = dict[tuple[str, frozenset], float]


async def scrape(port: int) -> Samples:
    async with httpx.AsyncClient() as client:
        reply = await client.get(f"http://127.0.0.1:{port}/metrics")
    reply.raise_for_status()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(reply.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def grew(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


@pytest.fixture(scope="module")
async def observed(base_settings, database_url, ollama_sim, profiles_file):
    """A SessionStore, a Compressor and an Agent, each serving /metrics on a port of its own."""
    settings = replace(base_settings, metrics_port=0)
    async with three_services(settings, database_url, ollama_sim, profiles_file) as services:
        yield services


async def test_a_turn_is_counted_by_rpc_reason_and_tokens(observed, ollama_sim):
    _, _, agent = observed
    assert agent.metrics is not None
    before = await scrape(agent.metrics.port)
    ollama_sim.script(Reply(text="Counted."))
    async with grpc.aio.insecure_channel(agent.address) as channel:
        events = [e async for e in agent_pb2_grpc.AgentStub(channel).RunStream(pb.RunStreamRequest(text="count me"))]
    after = await scrape(agent.metrics.port)
    usage = next(e.usage for e in events if e.HasField("usage"))
    run_stream = {"method": "/palimpsest.v1.Agent/RunStream", "code": "OK"}
    assert grew(before, after, "palimpsest_rpc_duration_seconds_count", **run_stream) == 1
    assert grew(before, after, "palimpsest_rpc_duration_seconds_bucket", le="+Inf", **run_stream) == 1
    assert grew(before, after, "palimpsest_turns_total", reason="completed") == 1
    assert grew(before, after, "palimpsest_model_tokens_total", direction="in") == usage.prompt_tokens > 0
    assert grew(before, after, "palimpsest_model_tokens_total", direction="out") == usage.completion_tokens > 0
    # The simulator counts with the vocabulary the Compressor counted with: an exact count, judged.
    assert grew(before, after, "palimpsest_token_count_error_ratio_count", method="exact") == 1


async def test_a_refused_request_is_filed_under_its_status_code(observed):
    _, _, agent = observed
    assert agent.metrics is not None
    before = await scrape(agent.metrics.port)
    async with grpc.aio.insecure_channel(agent.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await agent_pb2_grpc.AgentStub(channel).Run(pb.RunRequest(text=""))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    after = await scrape(agent.metrics.port)
    assert (
        grew(
            before,
            after,
            "palimpsest_rpc_duration_seconds_count",
            method="/palimpsest.v1.Agent/Run",
            code="INVALID_ARGUMENT",
        )
        == 1
    )
    assert (
        grew(before, after, "palimpsest_rpc_duration_seconds_count", method="/palimpsest.v1.Agent/Run", code="OK") == 0
    )


async def test_a_compression_is_counted_by_path_and_reason_with_its_summary_time(observed, ollama_sim):
    store, compressor, _ = observed
    assert compressor.metrics is not None
    ollama_sim.set_responder(lambda body: Reply(text="- what was said\nKEYS: a, b"))
    try:
        async with (
            grpc.aio.insecure_channel(store.address) as store_channel,
            grpc.aio.insecure_channel(compressor.address) as compressor_channel,
        ):
            stub = session_store_pb2_grpc.SessionStoreStub(store_channel)
            session = (
                await stub.CreateSession(store_pb.CreateSessionRequest(profile_id="metrics", model="qwen3.6"))
            ).session
            words = " ".join(f"word{i}" for i in range(150))
            await stub.AppendMessages(
                store_pb.AppendMessagesRequest(
                    session_id=session.id,
                    messages=[
                        common_pb2.Message(role=role, content=f"{role} {turn}: {words}")
                        for turn in range(12)
                        for role in ("user", "assistant")
                    ],
                )
            )
            before = await scrape(compressor.metrics.port)
            events = [
                e
                async for e in compressor_pb2_grpc.CompressorStub(compressor_channel).Compress(
                    cpb.CompressRequest(
                        session_id=session.id, reason=cpb.COMPRESSION_REASON_FORCED, model="qwen3.6", window=8192
                    )
                )
            ]
    finally:
        ollama_sim.set_responder(None)
    after = await scrape(compressor.metrics.port)
    assert events[-1].compressed.method == cpb.COMPRESSION_METHOD_SUMMARY
    assert grew(before, after, "palimpsest_compressions_total", path="summary", reason="forced") == 1
    assert grew(before, after, "palimpsest_summary_duration_seconds_count", outcome="ok") >= 1
    assert (
        grew(
            before,
            after,
            "palimpsest_rpc_duration_seconds_count",
            method="/palimpsest.v1.Compressor/Compress",
            code="OK",
        )
        == 1
    )


async def test_a_cut_prompt_is_counted(observed):
    _, compressor, _ = observed
    assert compressor.metrics is not None
    before = await scrape(compressor.metrics.port)
    async with grpc.aio.insecure_channel(compressor.address) as channel:
        reply = await compressor_pb2_grpc.CompressorStub(channel).RecordBaseline(
            cpb.RecordBaselineRequest(
                model=f"cut-{uuid.uuid4().hex[:6]}",
                prompt_eval_count=4098,
                sent_tokens=6000,
                window=8192,
                method=cpb.ESTIMATE_METHOD_EXACT,
                shape=common_pb2.PromptShape(content_tokens=5900, messages=3),
            )
        )
    assert reply.truncated
    after = await scrape(compressor.metrics.port)
    assert grew(before, after, "palimpsest_cut_prompts_total") == 1


async def test_the_store_reports_its_database_pool(observed):
    store, _, _ = observed
    assert store.metrics is not None
    samples = await scrape(store.metrics.port)
    in_use = value(samples, "palimpsest_db_pool_connections", state="in_use")
    idle = value(samples, "palimpsest_db_pool_connections", state="idle")
    assert in_use >= 0 and idle >= 1  # at least the pool's minimum, open and waiting
    assert value(samples, "palimpsest_db_pool_max_connections") >= 10  # (the shared test store's pool counts too)


def test_metrics_are_off_unless_a_port_is_set(monkeypatch):
    monkeypatch.delenv("PALIMPSEST_METRICS_PORT", raising=False)
    assert Settings.from_env().metrics_port is None
    monkeypatch.setenv("PALIMPSEST_METRICS_PORT", "9464")
    assert Settings.from_env().metrics_port == 9464


async def test_a_taken_metrics_port_is_named_at_start(observed, base_settings):
    store, _, _ = observed
    assert store.metrics is not None
    from palimpsest.compressor.app import start_compressor

    with pytest.raises(SystemExit, match="PALIMPSEST_METRICS_PORT"):
        await start_compressor(
            replace(base_settings, metrics_port=store.metrics.port, store_addr=store.address), port=0
        )

"""One turn against a real Ollama, when OLLAMA_HOST answers; skipped otherwise (CI has none)."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import grpc
import httpx
import pytest

from palimpsest.shared.settings import _normalize_ollama_host
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import agent_pb2_grpc

HOST = _normalize_ollama_host(os.environ.get("OLLAMA_HOST", "http://127.0.0.1:11434"))


def _real_ollama_model() -> str | None:
    try:
        tags = httpx.get(f"{HOST}/api/tags", timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return None
    models = [m["name"] for m in tags.get("models", [])]
    return os.environ.get("PALIMPSEST_TEST_MODEL") or (models[0] if models else None)


MODEL = _real_ollama_model()
pytestmark = pytest.mark.skipif(MODEL is None, reason=f"no Ollama with a pulled model answers at {HOST}")


async def test_one_turn_against_a_real_ollama(base_settings, store_server, compressor_server, tmp_path):
    from palimpsest.agent.app import start_agent

    profiles = tmp_path / "profiles.json"
    profiles.write_text(
        json.dumps({"profiles": [{"id": "real", "model": MODEL, "context_window": 4096, "max_iterations": 3}]})
    )
    settings = replace(
        base_settings,
        ollama_host=HOST,
        store_addr=store_server.address,
        compressor_addr=compressor_server.address,
        profiles_path=str(profiles),
    )
    running = await start_agent(settings, port=0)
    try:
        async with grpc.aio.insecure_channel(running.address) as channel:
            events = [
                e
                async for e in agent_pb2_grpc.AgentStub(channel).RunStream(
                    pb.RunStreamRequest(text="Reply with the single word: pong")
                )
            ]
        ends = [e.stream_end for e in events if e.HasField("stream_end")]
        assert ends and ends[0].reason == pb.STREAM_END_REASON_COMPLETED and ends[0].text.strip()
        assert any(e.HasField("usage") and e.usage.prompt_tokens > 0 for e in events)
    finally:
        await running.stop(0)


async def test_the_models_own_vocabulary_counts_like_ollama(tmp_path):
    """The exact path against the real thing: the tokenizer built from the model's GGUF vocabulary
    counts the content, and Ollama's report adds only what the chat template wraps around it."""
    from palimpsest.compressor.model_tokenizers import ModelTokenizers
    from palimpsest.shared.ollama import OllamaClient

    client = OllamaClient(HOST)
    try:
        counter = await ModelTokenizers(client, tmp_path).counter(MODEL)
        if counter is None:
            pytest.skip(f"{MODEL}'s vocabulary is not one the Compressor builds exactly (it uses the calibrated line)")
        text = (
            "Deploy 2026-11-30T10:14:37Z ERROR [worker-3] 10.0.0.17:5432 reset id=0xdeadbeef\n"
            'def f(x):\n    return {"ok": x % 3 == 0}\n上下文窗口必须始终容纳完整的提示。 🎉'
        )
        reply = await client.chat(
            OllamaClient.chat_body(
                MODEL, [{"role": "user", "content": text}], num_ctx=4096, stream=False, options={"num_predict": 1}
            )
        )
    finally:
        await client.aclose()
    content = counter.count(text)
    assert reply.prompt_eval_count is not None
    # The template (and a Modelfile SYSTEM prompt, if the model has one) only ever adds tokens.
    assert content <= reply.prompt_eval_count <= content + 256, (content, reply.prompt_eval_count)

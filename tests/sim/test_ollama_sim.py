"""The Ollama simulator speaks the wire protocol the services (and the official client) expect."""

from __future__ import annotations

import base64
import io
import json
import math
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest
from PIL import Image

from ollama_sim import OllamaSimulator, Reply, count_prompt_tokens, count_text_tokens, render_prompt
from ollama_sim.embed import DIMENSIONS
from ollama_sim.prompt import tokenizer

METRICS = {
    "total_duration",
    "load_duration",
    "prompt_eval_count",
    "prompt_eval_duration",
    "eval_count",
    "eval_duration",
}


@pytest.fixture
def sim() -> Iterator[OllamaSimulator]:
    with OllamaSimulator() as server:
        yield server


def user(text: str, **extra: Any) -> dict[str, Any]:
    return {"role": "user", "content": text, **extra}


def chat_body(model: str = "qwen3.6", text: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [user(text)], **extra}


def stream_lines(sim: OllamaSimulator, body: dict[str, Any]) -> tuple[httpx.Response, list[str]]:
    """POST /api/chat and return the raw lines, blank ones included (there must be none)."""
    response = httpx.post(f"{sim.url}/api/chat", json=body, timeout=10)
    text = response.text
    assert text.endswith("\n")
    return response, text[:-1].split("\n")


def stream_chunks(sim: OllamaSimulator, body: dict[str, Any]) -> list[dict[str, Any]]:
    response, lines = stream_lines(sim, body)
    assert response.status_code == 200
    return [json.loads(line) for line in lines]


def post(sim: OllamaSimulator, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{sim.url}{path}", json=body, timeout=10)


def png_b64(width: int, height: int) -> str:
    buf = io.BytesIO()
    Image.new("1", (width, height)).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


# -- streaming format -----------------------------------------------------------------------


def test_stream_is_ndjson_without_blank_lines_and_metrics_only_at_the_end(sim: OllamaSimulator) -> None:
    sim.script(Reply(text="The quick brown fox jumps over the lazy dog."))
    response, lines = stream_lines(sim, chat_body())  # stream omitted: streaming is the default

    assert response.headers["content-type"] == "application/x-ndjson"
    assert all(line.strip() for line in lines)
    chunks = [json.loads(line) for line in lines]
    assert len(chunks) >= 5, "text must arrive as many small deltas"
    for chunk in chunks:
        assert {"model", "created_at", "message", "done"} <= chunk.keys()
        assert chunk["model"] == "qwen3.6"
        assert chunk["message"]["role"] == "assistant"
        assert isinstance(chunk["message"]["content"], str)
    *partial, final = chunks
    assert all(not c["done"] and not (METRICS & c.keys()) for c in partial)
    assert final["done"] is True and final["done_reason"] == "stop"
    assert METRICS <= final.keys()
    assert all(isinstance(final[m], int) and final[m] > 0 for m in METRICS)
    assert "".join(c["message"]["content"] for c in chunks) == "The quick brown fox jumps over the lazy dog."


def test_non_streaming_returns_one_object_with_everything(sim: OllamaSimulator) -> None:
    sim.script(Reply(text="one two three", thinking="pondering it", tool_calls=[("f", {"x": 1})]))
    response = post(sim, "/api/chat", chat_body(stream=False, think=True))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    answer = response.json()
    assert answer["done"] is True and answer["done_reason"] == "stop"
    assert answer["message"]["content"] == "one two three"
    assert answer["message"]["thinking"] == "pondering it"
    assert answer["message"]["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert METRICS <= answer.keys()


def test_default_reply_is_deterministic_echo(sim: OllamaSimulator) -> None:
    first = post(sim, "/api/chat", chat_body(text="what is up", stream=False)).json()
    second = post(sim, "/api/chat", chat_body(text="what is up", stream=False)).json()
    assert first["message"]["content"] == second["message"]["content"]
    assert "what is up" in first["message"]["content"]


def test_thinking_chunks_come_before_content(sim: OllamaSimulator) -> None:
    sim.script(Reply(text="It is sunny.", thinking="Let me check the sky first."))
    chunks = stream_chunks(sim, chat_body(think=True))
    kinds = ["thinking" if c["message"].get("thinking") else "content" for c in chunks[:-1]]
    assert kinds == sorted(kinds, key=lambda k: k != "thinking")
    assert kinds.count("thinking") >= 3
    assert "".join(c["message"].get("thinking", "") for c in chunks) == "Let me check the sky first."
    assert "".join(c["message"]["content"] for c in chunks) == "It is sunny."


def test_thinking_only_when_requested(sim: OllamaSimulator) -> None:
    sim.script(Reply(text="answer", thinking="hidden"))
    chunks = stream_chunks(sim, chat_body())
    assert not any("thinking" in c["message"] for c in chunks)


def test_tool_calls_arrive_whole_in_a_non_final_chunk(sim: OllamaSimulator) -> None:
    sim.script(Reply(tool_calls=[("get_weather", {"city": "Tokyo"}), ("get_time", {"tz": "JST"})]))
    chunks = stream_chunks(sim, chat_body())
    with_calls = [c for c in chunks if c["message"].get("tool_calls")]
    assert len(with_calls) == 1 and with_calls[0]["done"] is False
    calls = with_calls[0]["message"]["tool_calls"]
    assert [c["function"]["index"] for c in calls] == [0, 1]
    assert calls[0]["function"]["name"] == "get_weather"
    assert calls[0]["function"]["arguments"] == {"city": "Tokyo"}
    assert all(re.fullmatch(r"call_[a-z0-9]{8}", c["id"]) for c in calls)
    assert chunks[-1]["done"] and chunks[-1]["done_reason"] == "stop"


def test_done_reason_is_scripted(sim: OllamaSimulator) -> None:
    sim.script(Reply(text="cut short", done_reason="length"))
    assert stream_chunks(sim, chat_body())[-1]["done_reason"] == "length"


def test_eval_count_is_tokenized_and_zero_metrics_are_omitted(sim: OllamaSimulator) -> None:
    sim.script(Reply(text="Tokens are counted for real here."), Reply(text=""))
    final = stream_chunks(sim, chat_body())[-1]
    assert final["eval_count"] == count_text_tokens("Tokens are counted for real here.")
    empty = stream_chunks(sim, chat_body())[-1]
    assert "eval_count" not in empty and "eval_duration" not in empty
    assert "prompt_eval_count" in empty


# -- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/chat", {"model": "nope", "messages": [user("hi")]}),
        ("/api/show", {"model": "nope"}),
        ("/api/embed", {"model": "nope", "input": "hi"}),
    ],
)
def test_unknown_model_is_404(sim: OllamaSimulator, path: str, body: dict[str, Any]) -> None:
    response = post(sim, path, body)
    assert response.status_code == 404
    assert response.json() == {"error": "model 'nope' not found"}


def test_think_on_model_without_thinking_is_400(sim: OllamaSimulator) -> None:
    response = post(sim, "/api/chat", chat_body("summarizer", think=True))
    assert response.status_code == 400
    assert response.json() == {"error": '"summarizer" does not support thinking'}
    assert post(sim, "/api/chat", chat_body("summarizer", think=False, stream=False)).status_code == 200


def test_tools_on_model_without_tools_is_400(sim: OllamaSimulator) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    response = post(sim, "/api/chat", chat_body("summarizer", tools=tools))
    assert response.status_code == 400
    assert "does not support tools" in response.json()["error"]


def test_scripted_http_status_then_back_to_normal(sim: OllamaSimulator) -> None:
    sim.script(Reply(http_status=503, error="server busy"), Reply(error="boom"))
    busy = post(sim, "/api/chat", chat_body())
    assert busy.status_code == 503 and busy.json() == {"error": "server busy"}
    failed = post(sim, "/api/chat", chat_body())
    assert failed.status_code == 500 and failed.json() == {"error": "boom"}
    assert post(sim, "/api/chat", chat_body()).status_code == 200
    assert sim.pending == 0


def test_error_after_chunks_is_a_last_ndjson_line(sim: OllamaSimulator) -> None:
    sim.script(Reply(text="alpha beta gamma delta", error_after_chunks=2, error="model crashed"))
    response, lines = stream_lines(sim, chat_body())
    assert response.status_code == 200
    chunks = [json.loads(line) for line in lines]
    assert [c["message"]["content"] for c in chunks[:2]] == ["alpha ", "beta "]
    assert chunks[-1] == {"error": "model crashed"}
    assert len(chunks) == 3 and not any(c.get("done") for c in chunks)


def test_error_after_chunks_without_streaming_is_500(sim: OllamaSimulator) -> None:
    sim.script(Reply(text="a b c", error_after_chunks=1, error="model crashed"))
    response = post(sim, "/api/chat", chat_body(stream=False))
    assert response.status_code == 500 and response.json() == {"error": "model crashed"}


def test_scripted_status_without_message(sim: OllamaSimulator) -> None:
    sim.script(Reply(http_status=499), Reply(http_status=503))
    cancelled = post(sim, "/api/chat", chat_body())
    assert cancelled.status_code == 499 and cancelled.json()["error"]
    assert post(sim, "/api/chat", chat_body()).json() == {"error": "service unavailable"}


def test_invalid_json_is_400(sim: OllamaSimulator) -> None:
    response = httpx.post(f"{sim.url}/api/chat", content=b"{not json", timeout=5)
    assert response.status_code == 400 and "error" in response.json()


# -- prompt accounting and truncation ---------------------------------------------------------


def test_prompt_eval_count_is_the_counted_prompt(sim: OllamaSimulator) -> None:
    messages = [{"role": "system", "content": "Be brief."}, user("How many tokens is this prompt?")]
    final = stream_chunks(sim, {"model": "qwen3.6", "messages": messages})[-1]
    assert final["prompt_eval_count"] == count_prompt_tokens(messages)
    assert count_prompt_tokens(messages) == len(tokenizer().encode(render_prompt(messages)))
    assert sim.truncations == 0


def test_prompt_eval_count_grows_with_content(sim: OllamaSimulator) -> None:
    short = stream_chunks(sim, chat_body(text="short"))[-1]["prompt_eval_count"]
    long = stream_chunks(sim, chat_body(text="a much longer message " * 20))[-1]["prompt_eval_count"]
    assert long > short + 60


def test_images_add_their_own_cost(sim: OllamaSimulator) -> None:
    plain = chat_body(text="look", options={"num_ctx": 16384})
    with_image = chat_body(text="look", options={"num_ctx": 16384})
    with_image["messages"][0]["images"] = [png_b64(1024, 1024), png_b64(512, 512)]
    base = stream_chunks(sim, plain)[-1]["prompt_eval_count"]
    priced = stream_chunks(sim, with_image)[-1]["prompt_eval_count"]
    assert priced - base == 1026 + 258


def test_tools_and_tool_calls_are_counted_but_past_thinking_is_not() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    messages = [user("weather?")]
    assert count_prompt_tokens(messages, tools) > count_prompt_tokens(messages)
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}],
    }
    assert count_prompt_tokens([*messages, call]) > count_prompt_tokens(
        [*messages, {"role": "assistant", "content": ""}]
    )
    thought = {"role": "assistant", "content": "sunny", "thinking": "a very long chain of thought " * 50}
    plain = {"role": "assistant", "content": "sunny"}
    assert count_prompt_tokens([*messages, thought]) == count_prompt_tokens([*messages, plain])


def test_prompt_over_num_ctx_is_silently_truncated(sim: OllamaSimulator) -> None:
    body = chat_body(text="word " * 1000, options={"num_ctx": 512})
    response, lines = stream_lines(sim, body)
    assert response.status_code == 200
    final = json.loads(lines[-1])
    assert final["prompt_eval_count"] == 512 // 2 + 2
    assert not any("truncat" in line for line in lines), "nothing in the answer flags it"
    assert sim.truncations == 1
    record = sim.chats[-1]
    assert record.truncated and record.prompt_tokens > 512 and record.num_ctx == 512


def test_prompt_within_num_ctx_is_not_truncated(sim: OllamaSimulator) -> None:
    body = chat_body(text="word " * 1000, options={"num_ctx": 4096})
    final = stream_chunks(sim, body)[-1]
    assert final["prompt_eval_count"] == count_prompt_tokens(body["messages"]) > 1000
    assert sim.truncations == 0


def test_default_num_ctx_is_ollamas_small_4096(sim: OllamaSimulator) -> None:
    final = stream_chunks(sim, chat_body(text="word " * 5000))[-1]
    assert final["prompt_eval_count"] == 4096 // 2 + 2
    assert sim.truncations == 1


def test_num_ctx_is_clamped_to_the_models_context(sim: OllamaSimulator) -> None:
    # "tiny" was trained on 8192 tokens; asking for more does not buy more.
    final = stream_chunks(sim, chat_body("tiny", text="word " * 9000, options={"num_ctx": 100_000}))[-1]
    assert final["prompt_eval_count"] == 8192 // 2 + 2


def test_truncate_false_refuses_instead_since_0_12_6() -> None:
    with OllamaSimulator(version="0.12.6") as sim:
        response = post(sim, "/api/chat", chat_body(text="word " * 1000, options={"num_ctx": 256}, truncate=False))
    assert response.status_code == 400
    assert response.json() == {"error": "the input length exceeds the context length"}


def test_truncate_false_is_ignored_before_0_12_6(sim: OllamaSimulator) -> None:
    final = stream_chunks(sim, chat_body(text="word " * 1000, options={"num_ctx": 256}, truncate=False))[-1]
    assert final["prompt_eval_count"] == 256 // 2 + 2
    assert sim.truncations == 1


# -- timing, disconnects, concurrency --------------------------------------------------------


def test_delays_are_honoured_in_order(sim: OllamaSimulator) -> None:
    sim.script(Reply(text="one two three", first_chunk_delay=0.3, chunk_delay=0.1))
    started = time.monotonic()
    arrivals: list[tuple[float, dict[str, Any]]] = []
    with httpx.stream("POST", f"{sim.url}/api/chat", json=chat_body(), timeout=10) as response:
        for line in response.iter_lines():
            arrivals.append((time.monotonic() - started, json.loads(line)))
    times = [t for t, _ in arrivals]
    assert times[0] >= 0.25  # generous lower bound only
    assert times == sorted(times)
    assert times[-1] - times[0] >= 0.15  # two chunk delays between the three words
    assert [c["message"]["content"] for _, c in arrivals[:3]] == ["one ", "two ", "three"]


def test_client_closing_mid_stream_is_recorded_and_harmless(sim: OllamaSimulator) -> None:
    sim.script(Reply(text="many words " * 20, chunk_delay=0.05))
    with httpx.stream("POST", f"{sim.url}/api/chat", json=chat_body(), timeout=10) as response:
        first = next(response.iter_lines())
        assert json.loads(first)["done"] is False
    assert sim.wait_until(lambda: sim.disconnects == 1, timeout=5)
    record = sim.chats[-1]
    assert record.disconnected and not record.completed
    assert post(sim, "/api/chat", chat_body(stream=False)).status_code == 200


def test_client_timeout_during_first_chunk_delay_is_seen_promptly(sim: OllamaSimulator) -> None:
    sim.script(Reply(text="too late", first_chunk_delay=30))
    started = time.monotonic()
    with (
        pytest.raises(httpx.ReadTimeout),
        httpx.stream("POST", f"{sim.url}/api/chat", json=chat_body(), timeout=0.3) as response,
    ):
        list(response.iter_lines())
    assert sim.wait_until(lambda: sim.disconnects == 1, timeout=5)
    assert time.monotonic() - started < 10, "the server noticed without waiting out the delay"


def test_requests_are_recorded(sim: OllamaSimulator) -> None:
    body = chat_body(text="remember me", stream=False)
    post(sim, "/api/chat", body)
    httpx.get(f"{sim.url}/api/tags", timeout=5)
    assert sim.requests[0] == ("/api/chat", body)
    path, recorded = sim.requests[1]
    assert path == "/api/tags" and recorded is None
    assert sim.bodies("/api/chat") == [body]


def test_many_concurrent_requests(sim: OllamaSimulator) -> None:
    def ask(i: int) -> str:
        response = post(sim, "/api/chat", chat_body(text=f"question {i}", stream=False))
        assert response.status_code == 200
        return str(response.json()["message"]["content"])

    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = list(pool.map(ask, range(40)))
    assert all(f"question {i}" in answer for i, answer in enumerate(answers))
    assert len(sim.chats) == 40


def test_stop_does_not_wait_for_slow_streams() -> None:
    sim = OllamaSimulator().start()
    sim.script(Reply(text="slow " * 10, first_chunk_delay=30))
    outcome: list[BaseException] = []

    def wait_for_answer() -> None:
        try:
            httpx.post(f"{sim.url}/api/chat", json=chat_body(), timeout=60)
        except httpx.HTTPError as exc:  # the stream is cut by the stop: expected
            outcome.append(exc)

    client = threading.Thread(target=wait_for_answer, daemon=True)
    client.start()
    assert sim.wait_until(lambda: len(sim.chats) == 1)
    started = time.monotonic()
    sim.stop()
    assert time.monotonic() - started < 3
    client.join(timeout=5)
    assert not client.is_alive() and outcome


# -- other endpoints ------------------------------------------------------------------------


def test_tags_show_version(sim: OllamaSimulator) -> None:
    tags = httpx.get(f"{sim.url}/api/tags", timeout=5).json()
    names = {m["name"] for m in tags["models"]}
    assert {"qwen3.6:latest", "summarizer:latest", "tiny:latest"} <= names
    assert all({"model", "modified_at", "size", "digest", "details"} <= m.keys() for m in tags["models"])

    show = post(sim, "/api/show", {"model": "qwen3.6:latest"}).json()
    arch = show["model_info"]["general.architecture"]
    assert show["model_info"][f"{arch}.context_length"] == 262144
    assert set(show["capabilities"]) == {"completion", "tools", "vision", "thinking"}
    assert "thinking" not in post(sim, "/api/show", {"model": "summarizer"}).json()["capabilities"]

    assert httpx.get(f"{sim.url}/api/version", timeout=5).json() == {"version": "0.12.0"}


def test_embed_is_deterministic_unit_vectors_and_similarity_aware(sim: OllamaSimulator) -> None:
    texts = ["the cat sat on the mat", "the cat sat on a mat", "quarterly revenue forecast"]
    answer = post(sim, "/api/embed", {"model": "qwen3.6", "input": texts}).json()
    vectors = answer["embeddings"]
    assert answer["model"] == "qwen3.6" and answer["prompt_eval_count"] > 0
    assert len(vectors) == 3 and all(math.isclose(sum(v * v for v in vec), 1.0) for vec in vectors)

    def cosine(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True))

    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2])
    single = post(sim, "/api/embed", {"model": "qwen3.6", "input": texts[0]}).json()
    assert single["embeddings"] == [vectors[0]]


def test_embed_places_a_paraphrase_near_its_target(sim: OllamaSimulator) -> None:
    """What search by meaning is tested with: a paraphrase sharing no word with its target is
    nearer to it than texts that share words but not the meaning."""
    target = "The deploy crashed because the database password expired"
    paraphrase = "release failure: postgres credentials lapsed"
    same_words = "The deploy notes list every database table and the password policy document"
    answer = post(sim, "/api/embed", {"model": "nomic-embed-text", "input": [target, paraphrase, same_words]}).json()
    a, b, c = answer["embeddings"]

    def cosine(x: list[float], y: list[float]) -> float:
        return sum(p * q for p, q in zip(x, y, strict=True))

    assert not set(paraphrase.lower().split()) & set(target.lower().split())
    assert cosine(a, b) > 0.9 > cosine(b, c)
    # An embedding-only model, as Ollama serves one: /api/embed yes, /api/chat no.
    refused = post(sim, "/api/chat", {"model": "nomic-embed-text", "messages": [{"role": "user", "content": "hi"}]})
    assert refused.status_code == 400


def test_custom_models() -> None:
    from ollama_sim import ModelSpec

    with OllamaSimulator(models={"mine": ModelSpec(context_length=1000)}) as sim:
        assert post(sim, "/api/show", {"model": "mine"}).json()["model_info"]["qwen3.context_length"] == 1000
        assert post(sim, "/api/chat", chat_body("qwen3.6")).status_code == 404


def test_module_entry_point_serves() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "ollama_sim", "--port", "0"],
        cwd=Path(__file__).resolve().parents[2],  # the simulator is a repository package, not an installed one
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+", banner)
        assert url, banner
        assert httpx.get(f"{url.group(0)}/api/version", timeout=5).status_code == 200
    finally:
        process.terminate()
        assert process.wait(timeout=10) == 0


# -- the official client parses all of it ----------------------------------------------------


def test_official_client_streams_and_accumulates(sim: OllamaSimulator) -> None:
    client = ollama.Client(host=sim.url)
    sim.script(
        Reply(
            text="It is sunny.",
            thinking="Check the weather.",
            tool_calls=[("get_weather", {"city": "Tokyo"})],
        )
    )
    content, thinking = "", ""
    calls: list[ollama.Message.ToolCall] = []
    final = None
    for part in client.chat(model="qwen3.6", messages=[user("weather?")], think=True, stream=True):
        content += part.message.content or ""
        thinking += part.message.thinking or ""
        calls += part.message.tool_calls or []
        final = part
    assert content == "It is sunny." and thinking == "Check the weather."
    assert calls[0].function.name == "get_weather" and calls[0].function.arguments == {"city": "Tokyo"}
    assert final is not None and final.done and final.prompt_eval_count and final.eval_count


def test_official_client_non_streaming(sim: OllamaSimulator) -> None:
    client = ollama.Client(host=sim.url)
    sim.script(Reply(text="done", tool_calls=[("add", {"a": 1, "b": 2})]))
    answer = client.chat(model="tiny", messages=[user("add")], options={"num_ctx": 2048})
    assert answer.message.content == "done"
    assert answer.message.tool_calls and dict(answer.message.tool_calls[0].function.arguments) == {
        "a": 1,
        "b": 2,
    }
    assert answer.done_reason == "stop" and answer.prompt_eval_count == sim.chats[-1].prompt_eval_count


def test_official_client_raises_response_errors(sim: OllamaSimulator) -> None:
    client = ollama.Client(host=sim.url)
    with pytest.raises(ollama.ResponseError) as missing:
        client.chat(model="nope", messages=[user("hi")])
    assert missing.value.status_code == 404 and missing.value.error == "model 'nope' not found"

    with pytest.raises(ollama.ResponseError) as no_think:
        client.chat(model="summarizer", messages=[user("hi")], think=True)
    assert no_think.value.status_code == 400

    sim.script(Reply(http_status=503, error="server busy"))
    with pytest.raises(ollama.ResponseError) as busy:
        list(client.chat(model="qwen3.6", messages=[user("hi")], stream=True))
    assert busy.value.status_code == 503 and busy.value.error == "server busy"

    sim.script(Reply(text="partial answer here", error_after_chunks=1, error="model crashed"))
    seen: list[str] = []
    with pytest.raises(ollama.ResponseError, match="model crashed"):
        for part in client.chat(model="qwen3.6", messages=[user("hi")], stream=True):
            seen.append(part.message.content or "")
    assert seen == ["partial "]


def test_official_client_show_list_embed(sim: OllamaSimulator) -> None:
    client = ollama.Client(host=sim.url)
    show = client.show("qwen3.6")
    assert show.modelinfo is not None
    assert show.modelinfo[f"{show.modelinfo['general.architecture']}.context_length"] == 262144
    assert show.capabilities is not None and "vision" in show.capabilities
    assert {m.model for m in client.list().models} >= {"qwen3.6:latest", "tiny:latest"}
    embedded = client.embed(model="qwen3.6", input=["a", "b"])
    assert len(embedded.embeddings) == 2 and len(embedded.embeddings[0]) == DIMENSIONS


async def test_official_async_client_streams(sim: OllamaSimulator) -> None:
    client = ollama.AsyncClient(host=sim.url)
    sim.script(Reply(text="async works fine", chunk_delay=0.01))
    parts = [part async for part in await client.chat(model="qwen3.6", messages=[user("hi")], stream=True)]
    assert "".join(p.message.content or "" for p in parts) == "async works fine"
    assert parts[-1].done

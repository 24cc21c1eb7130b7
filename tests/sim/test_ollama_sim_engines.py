"""The simulator models both engines Ollama has shipped, chosen by the version it reports: the old
runners' silent front cut, and llama-server's (0.30.0 on) dropped messages, 400 on `truncate: false`,
cached + evaluated prompt_eval_count and num_ctx clamped to the trained context."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ollama_sim import ModelSpec, OllamaSimulator, count_prompt_tokens, default_models, engines
from ollama_sim.engines import Turn, engine_for, fit_llama_server, parse_version

LLAMA_SERVER_VERSION = "0.30.2"


@pytest.fixture
def new_sim() -> Iterator[OllamaSimulator]:
    models = {
        **default_models(),
        "deepseek": ModelSpec(context_length=8_192, architecture="deepseek2", context_shift=False),
    }
    with OllamaSimulator(models, version=LLAMA_SERVER_VERSION) as server:
        yield server


def say(role: str, words: int, tag: str = "") -> dict[str, Any]:
    return {"role": role, "content": f"{tag} " + "word " * words}


def chat(
    sim: OllamaSimulator, messages: list[dict[str, Any]], num_ctx: int, model: str = "qwen3.6", **extra: Any
) -> httpx.Response:
    body = {"model": model, "messages": messages, "stream": False, "options": {"num_ctx": num_ctx}, **extra}
    return httpx.post(f"{sim.url}/api/chat", json=body, timeout=10)


def test_the_reported_version_chooses_the_engine() -> None:
    assert parse_version("0.30.0-rc32") == (0, 30, 0) and parse_version("v0.12.6") == (0, 12, 6)
    assert parse_version("0.0.0") == (0, 0, 0) and parse_version("dev") == (0, 0, 0)
    assert engine_for("0.29.9") == engines.RUNNERS and engine_for("0.12.0") == engines.RUNNERS
    assert engine_for("0.30.0") == engines.LLAMA_SERVER and engine_for("1.2.3") == engines.LLAMA_SERVER
    with OllamaSimulator(version=LLAMA_SERVER_VERSION) as sim:
        assert httpx.get(f"{sim.url}/api/version", timeout=5).json() == {"version": LLAMA_SERVER_VERSION}
        assert sim.engine == engines.LLAMA_SERVER


def test_llama_server_drops_whole_old_messages_keeping_system_and_last(new_sim: OllamaSimulator) -> None:
    system = {"role": "system", "content": "You are terse."}
    history = [say("user" if i % 2 == 0 else "assistant", 300, f"m{i}") for i in range(8)]
    messages = [system, *history]
    answer = chat(new_sim, messages, num_ctx=1_200).json()
    record = new_sim.chats[-1]
    assert record.engine == engines.LLAMA_SERVER and record.truncated
    kept = [system, *history[record.dropped_messages :]]
    # What was read is whole messages: exactly the count of the system prompt and the newest ones,
    # the fewest dropped for them to fit (one more message would not have).
    assert answer["prompt_eval_count"] == count_prompt_tokens(kept) <= 1_200
    one_more = [system, *history[record.dropped_messages - 1 :]]
    assert count_prompt_tokens(one_more) > 1_200
    assert 0 < record.dropped_messages < len(history)
    assert new_sim.refusals == 0


def test_llama_server_refuses_an_overflow_when_truncate_is_false(new_sim: OllamaSimulator) -> None:
    messages = [say("user", 2_000)]
    response = chat(new_sim, messages, num_ctx=1_024, truncate=False)
    assert response.status_code == 400
    assert response.json() == {"error": "the request exceeds the available context size, try increasing it"}
    assert new_sim.refusals == 1 and new_sim.chats == []
    assert chat(new_sim, [say("user", 200)], num_ctx=1_024, truncate=False).status_code == 200


def test_a_last_message_too_long_alone_is_context_shifted_or_refused(new_sim: OllamaSimulator) -> None:
    shifted = chat(new_sim, [say("user", 3_000)], num_ctx=1_000).json()
    # num_keep (4) kept, then about half of the rest of the window.
    assert shifted["prompt_eval_count"] == 1_000 - (1_000 - 4) // 2
    assert new_sim.chats[-1].truncated and new_sim.chats[-1].dropped_messages == 0
    refused = chat(new_sim, [say("user", 3_000)], num_ctx=1_000, model="deepseek")
    assert refused.status_code == 400
    assert refused.json()["error"].startswith("the prompt is longer than the context length currently available")


def test_llama_server_counts_the_cached_prefix_in_prompt_eval_count(new_sim: OllamaSimulator) -> None:
    first = [{"role": "system", "content": "Be brief."}, say("user", 400, "q1")]
    chat(new_sim, first, num_ctx=8_192)
    second = [*first, say("assistant", 50, "a1"), say("user", 30, "q2")]
    answer = chat(new_sim, second, num_ctx=8_192).json()
    record = new_sim.chats[-1]
    # cache_n + prompt_n: the whole prompt, though only its new end was read again.
    assert answer["prompt_eval_count"] == count_prompt_tokens(second)
    assert record.cached_tokens == count_prompt_tokens(first) - count_prompt_tokens([])
    assert answer["prompt_eval_duration"] < answer["prompt_eval_count"] * 50_000


def test_llama_server_clamps_num_ctx_to_the_trained_context(new_sim: OllamaSimulator) -> None:
    # "tiny" was trained on 8192 tokens: a request for 100k still loses messages past 8192.
    messages = [say("user" if i % 2 == 0 else "assistant", 1_000, f"m{i}") for i in range(13)]
    answer = chat(new_sim, messages, num_ctx=100_000, model="tiny").json()
    assert new_sim.chats[-1].num_ctx == 8_192
    assert new_sim.chats[-1].dropped_messages > 0 and answer["prompt_eval_count"] <= 8_192
    refused = chat(new_sim, messages, num_ctx=100_000, model="tiny", truncate=False)
    assert refused.status_code == 400


def test_old_runners_cut_the_front_whatever_the_messages() -> None:
    with OllamaSimulator(version="0.29.1") as sim:
        messages = [say("user" if i % 2 == 0 else "assistant", 300, f"m{i}") for i in range(8)]
        answer = chat(sim, messages, num_ctx=1_200).json()
        assert answer["prompt_eval_count"] == 1_200 // 2 + 2
        assert sim.chats[-1].engine == engines.RUNNERS and sim.chats[-1].dropped_messages == 0
        refused = chat(sim, messages, num_ctx=1_200, truncate=False)
        assert refused.json() == {"error": "the input length exceeds the context length"}


def test_fit_keeps_system_messages_it_skips_over() -> None:
    turns = [Turn("system", 10), Turn("user", 100), Turn("system", 5), Turn("assistant", 100), Turn("user", 50)]
    fit = fit_llama_server(turns, 3, 100, True)
    assert fit.kept_turns == (0, 2, 4) and fit.kept_tokens == 68 and fit.dropped_messages == 2
    assert fit_llama_server(turns, 3, 1_000, True).kept_turns == (0, 1, 2, 3, 4)


def test_the_command_line_chooses_the_engine() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "ollama_sim", "--port", "0", "--version", LLAMA_SERVER_VERSION],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()
        assert "llama-server" in banner, banner
        url = re.search(r"http://127\.0\.0\.1:\d+", banner)
        assert url, banner
        assert json.loads(httpx.get(f"{url.group(0)}/api/version", timeout=5).text)["version"] == LLAMA_SERVER_VERSION
    finally:
        process.terminate()
        assert process.wait(timeout=10) == 0

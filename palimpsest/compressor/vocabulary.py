"""A model's own tokenizer, built from the GGUF vocabulary Ollama returns on ``/api/show`` (verbose).

An estimate from characters cannot be safe for every kind of text: one token costs 1.85 chars in
a dense log and ~4 in English prose. The model's vocabulary can count exactly, so this module
turns GGUF tokenizer metadata into a Hugging Face ``tokenizers.Tokenizer``. Nothing here encodes
by hand; it only maps GGUF's fields onto the library's models, the way the GGUF converters in
``transformers`` and llama.cpp's vocabulary loader read them:

- ``tokenizer.ggml.model == "gpt2"``: byte-level BPE. Tokens are already written in GPT-2's
  bytes-to-unicode alphabet (what ``ByteLevel`` produces), merges are given in priority order,
  and ``tokenizer.ggml.pre`` names llama.cpp's split rule applied before BPE (split_patterns).
- ``tokenizer.ggml.model == "llama"``: SentencePiece BPE. Spaces become ``▁``, merges follow the
  pieces' scores (a higher score merges first), and characters outside the vocabulary fall back
  to ``<0xNN>`` byte tokens.
- ``tokenizer.ggml.model == "gemma4"``: BPE with merges over the text's own characters.

Tokens llama.cpp matches whole in a prompt are added as special tokens (special_tokens). Anything
else raises ``UnsupportedVocabulary``: the caller falls back to the calibrated estimate. Every rule
here is checked against llama.cpp itself (tests/compressor/test_vocab_families.py, the table in docs/counting.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from palimpsest.compressor.special_tokens import matched_tokens
from palimpsest.compressor.split_patterns import SPLIT_RULES, SplitRule

PREFIX = "tokenizer.ggml."

# GGUF token types (llama.cpp's llama_token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

SPM_SPACE = "▁"


class UnsupportedVocabulary(ValueError):
    """The metadata names a vocabulary kind or pre-tokenizer this module cannot build exactly."""


@dataclass(frozen=True)
class GgufVocabulary:
    """The tokenizer fields of a GGUF file, as Ollama's ``model_info`` carries them."""

    kind: str  # tokenizer.ggml.model
    pre: str  # tokenizer.ggml.pre ("" when absent)
    tokens: Sequence[str]
    token_types: Sequence[int]
    merges: Sequence[str]
    scores: Sequence[float]
    add_space_prefix: bool
    model_name: str = ""  # general.name: llama.cpp gives Phi-3's special tokens an rstrip by it

    @classmethod
    def from_model_info(cls, info: Mapping[str, Any]) -> "GgufVocabulary":
        kind = info.get(PREFIX + "model")
        tokens = info.get(PREFIX + "tokens")
        if not kind or not tokens:
            raise UnsupportedVocabulary("the model carries no tokenizer vocabulary (was /api/show verbose?)")
        types = info.get(PREFIX + "token_type") or [NORMAL] * len(tokens)
        if len(types) != len(tokens):
            raise UnsupportedVocabulary(f"{len(types)} token types for {len(tokens)} tokens")
        return cls(
            kind=str(kind),
            pre=str(info.get(PREFIX + "pre") or ""),
            tokens=tokens,
            token_types=types,
            merges=info.get(PREFIX + "merges") or [],
            scores=info.get(PREFIX + "scores") or [],
            # llama.cpp's default: SentencePiece vocabularies prefix a space unless told not to.
            add_space_prefix=bool(info.get(PREFIX + "add_space_prefix", kind == "llama")),
            model_name=str(info.get("general.name") or ""),
        )


def build_tokenizer(info: Mapping[str, Any]) -> Tokenizer:
    """The model's tokenizer from its ``model_info``; raises ``UnsupportedVocabulary``.

    CPU-heavy for large vocabularies (about a second for 250k tokens): call it off the event loop.
    """
    vocab = GgufVocabulary.from_model_info(info)
    if vocab.kind == "gpt2":
        tokenizer = _byte_level_bpe(vocab)
    elif vocab.kind == "llama":
        tokenizer = _sentencepiece_bpe(vocab)
    elif vocab.kind == "gemma4":
        tokenizer = _gemma4_bpe(vocab)
    else:
        raise UnsupportedVocabulary(f"tokenizer.ggml.model {vocab.kind!r} is not supported")
    _add_special_tokens(tokenizer, vocab)
    return tokenizer


def _ids(vocab: GgufVocabulary) -> dict[str, int]:
    ids: dict[str, int] = {}
    for index, token in enumerate(vocab.tokens):
        ids.setdefault(token, index)  # a duplicate string keeps its first id, as llama.cpp does
    return ids


def _pairs(merges: Sequence[str]) -> list[tuple[str, str]]:
    """``"left right"`` merges, cut at the first space after the first character as llama.cpp
    cuts them (a left part may itself be a space)."""
    pairs = []
    for merge in merges:
        cut = merge.find(" ", 1)
        if cut < 0:
            raise UnsupportedVocabulary(f"malformed merge {merge!r}")
        pairs.append((merge[:cut], merge[cut + 1 :]))
    return pairs


def split_rule(pre: str) -> SplitRule:
    """The split llama.cpp applies for ``pre``: none named means llama.cpp's default, not GPT-2's."""
    rule = SPLIT_RULES.get(pre or "default")
    if rule is None:
        raise UnsupportedVocabulary(f"pre-tokenizer {pre!r} is not supported")
    return rule


def _splits(rule: SplitRule) -> list[pre_tokenizers.PreTokenizer]:
    return [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in rule.patterns]


def _byte_level_bpe(vocab: GgufVocabulary) -> Tokenizer:
    rule = split_rule(vocab.pre)
    if not vocab.merges:
        raise UnsupportedVocabulary("a byte-level BPE vocabulary without merges")
    tokenizer = Tokenizer(models.BPE(_ids(vocab), _pairs(vocab.merges), ignore_merges=rule.ignore_merges))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            *_splits(rule),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _gemma4_bpe(vocab: GgufVocabulary) -> Tokenizer:
    """Gemma 4: BPE with merges over the text's own characters (no byte-level alphabet), spaces
    written ``▁``, each line and each run of newlines merged apart, an unknown character as its
    ``<0xNN>`` bytes. llama.cpp takes a run of newlines that is itself a token whole."""
    if not vocab.merges:
        raise UnsupportedVocabulary("a gemma4 vocabulary without merges")
    bpe = models.BPE(_ids(vocab), _pairs(vocab.merges), byte_fallback=True, ignore_merges=True)
    tokenizer = Tokenizer(bpe)
    tokenizer.normalizer = normalizers.Replace(" ", SPM_SPACE)
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|[\n]+"), behavior="isolated", invert=False)
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace(SPM_SPACE, " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
        ]
    )
    return tokenizer


def spm_merges(vocab: GgufVocabulary) -> list[tuple[str, str]]:
    """Merges implied by SentencePiece scores: every split of a piece into two pieces, the merged
    piece's score deciding the order (higher first). llama.cpp merges the leftmost of two pairs that
    make the same piece; a merge list cannot say "leftmost", but ranking the split with the longer
    left part first gives the same tokens (runs of spaces: 16 + 7 ``▁``, not 8 + 15)."""
    if len(vocab.scores) != len(vocab.tokens):
        raise UnsupportedVocabulary("a SentencePiece vocabulary needs one score per token")
    ids = _ids(vocab)  # llama.cpp merges into any token of the vocabulary, whatever its type
    ranked: list[tuple[float, int, str, str]] = []
    for piece, index in ids.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids:
                ranked.append((-vocab.scores[index], -cut, left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _sentencepiece_bpe(vocab: GgufVocabulary) -> Tokenizer:
    ids = _ids(vocab)
    unknown = next((t for t, i in ids.items() if vocab.token_types[i] == UNKNOWN), None)
    merges = _pairs(vocab.merges) if vocab.merges else spm_merges(vocab)
    tokenizer = Tokenizer(models.BPE(ids, merges, unk_token=unknown, fuse_unk=True, byte_fallback=True))
    steps = [normalizers.Prepend(SPM_SPACE)] if vocab.add_space_prefix else []
    tokenizer.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", SPM_SPACE)])
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace(SPM_SPACE, " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
        ]
    )
    return tokenizer


def _add_special_tokens(tokenizer: Tokenizer, vocab: GgufVocabulary) -> None:
    """The tokens llama.cpp matches whole in a prompt (see special_tokens) are one token each:
    control ones as special tokens, user-defined ones as ordinary text."""
    matched = matched_tokens(vocab.tokens, vocab.token_types, vocab.model_name)

    def added(special: bool) -> list[AddedToken]:
        return [
            AddedToken(m.text, special=special, normalized=False, rstrip=m.rstrip)
            for m in matched
            if m.special == special
        ]

    special, user = added(True), added(False)
    if special:
        tokenizer.add_special_tokens(special)
    if user:
        tokenizer.add_tokens(user)

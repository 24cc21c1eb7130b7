"""Exact token counters per model, built once per model digest and kept in memory and on disk.

The vocabulary comes from Ollama (``/api/show`` verbose, ~13 MB for 248k tokens) and takes about
two seconds to turn into a tokenizer, so each digest is fetched and built once per process, the
result saved as ``<cache_dir>/<digest>.json`` for the next start, and every build runs in a
thread. A model whose vocabulary cannot be built is counted by the calibrated line: one warning,
never a failed request.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Encoding, Tokenizer

from palimpsest.compressor.exact_count import scaled_count
from palimpsest.compressor.vocabulary import UnsupportedVocabulary, build_tokenizer
from palimpsest.shared.context_view import SIZE_CHECK_SLICE_CHARS, slice_for_size_check
from palimpsest.shared.errors import PalimpsestError
from palimpsest.shared.ollama import OllamaClient

log = logging.getLogger("palimpsest.compressor")

# A re-pulled model gets a new digest; it is noticed within this many seconds.
DIGEST_TTL_S = 30.0
# Ollama down or the model missing: no count is exact meanwhile; ask again after this.
RETRY_AFTER_S = 60.0
# Counts of texts seen before (a long session resends the same messages on every call).
COUNT_CACHE_ENTRIES = 200_000
# Cut views of oversized messages (each about a message budget of text).
CUT_CACHE_ENTRIES = 2_000
# A text that may be cut right after it is counted (``for_cut``) and is this long in tokens keeps
# the count's encoding (its offsets) for the cut, which would otherwise encode it again. At most
# this many tokens' encodings are kept (~100 bytes a token). Any other text is encoded without
# offsets, which takes about two thirds of the time.
KEPT_ENCODING_MIN_TOKENS = 512
KEPT_ENCODING_TOKENS = 100_000


class TokenCounter:
    """Counts text with one model's own tokenizer. Thread-safe; repeated texts are counted once."""

    def __init__(self, tokenizer: Tokenizer, digest: str) -> None:
        self.tokenizer = tokenizer
        self.digest = digest
        self._cache: OrderedDict[tuple[int, int], int] = OrderedDict()
        self._cuts: OrderedDict[tuple[int, int, int, int], tuple[str, str]] = OrderedDict()
        self._encodings: OrderedDict[tuple[int, int], Encoding] = OrderedDict()  # long texts just counted
        self._encoded_tokens = 0
        self._lock = threading.Lock()

    def count(self, text: str) -> int:
        return self.counts([text])[0]

    def counts(self, texts: Sequence[str], *, for_cut: bool = False) -> list[int]:
        """Tokens of each text alone (no BOS/EOS); the uncached ones in one parallel batch. A text
        too long to size whole (see slice_for_size_check) is counted by its head and tail, scaled
        to its length: deterministic, and seconds faster for a many-megabyte tool output.
        ``for_cut``: the texts are contents a view may cut to a budget (see ``head_and_tail``)."""
        # (hash, length) identifies a text: a collision needs equal lengths and a 64-bit hash clash.
        keys = [(hash(t), len(t)) for t in texts]
        found: dict[int, int] = {}
        with self._lock:
            for i, key in enumerate(keys):
                if not texts[i]:
                    found[i] = 0
                elif key in self._cache:
                    self._cache.move_to_end(key)
                    found[i] = self._cache[key]
        missing = [i for i in range(len(texts)) if i not in found]
        if missing:
            sliced = [slice_for_size_check(texts[i]) or texts[i] for i in missing]
            encode = self.tokenizer.encode_batch if for_cut else self.tokenizer.encode_batch_fast
            encodings = encode(sliced, add_special_tokens=False)
            with self._lock:
                for i, text, encoding in zip(missing, sliced, encodings):
                    found[i] = scaled_count(len(encoding.ids), len(text), len(texts[i]))
                    self._cache[keys[i]] = found[i]
                    if for_cut and found[i] >= KEPT_ENCODING_MIN_TOKENS and len(text) == len(texts[i]):
                        self._keep_encoding(keys[i], encoding)
                while len(self._cache) > COUNT_CACHE_ENTRIES:
                    self._cache.popitem(last=False)
        return [found[i] for i in range(len(texts))]

    def _keep_encoding(self, key: tuple[int, int], encoding: Encoding) -> None:
        """Hold a long text's encoding for the cut that usually follows its count (under the lock)."""
        if key in self._encodings:
            return
        self._encodings[key] = encoding
        self._encoded_tokens += len(encoding)
        while self._encoded_tokens > KEPT_ENCODING_TOKENS and self._encodings:
            self._encoded_tokens -= len(self._encodings.popitem(last=False)[1])

    def _kept_offsets(self, text: str) -> list[tuple[int, int]] | None:
        """The offsets of ``text``'s tokens from the encoding its count made, if still held (taken:
        the cut made from them is remembered instead)."""
        with self._lock:
            encoding = self._encodings.pop((hash(text), len(text)), None)
            if encoding is not None:
                self._encoded_tokens -= len(encoding)
        return None if encoding is None else encoding.offsets

    def _cut_from_slices(self, text: str, head_tokens: int, tail_tokens: int) -> tuple[str, str] | None:
        """The cut of a very long text from its head and tail slices alone; None when a slice holds
        too few tokens for the cut to stay clear of its edge (then the whole text is encoded)."""
        edge = SIZE_CHECK_SLICE_CHARS * 9 // 10  # a token near a slice's edge may be split there
        head = self.tokenizer.encode(text[:SIZE_CHECK_SLICE_CHARS], add_special_tokens=False).offsets
        tail_text = text[-SIZE_CHECK_SLICE_CHARS:]
        tail = self.tokenizer.encode(tail_text, add_special_tokens=False).offsets
        if head_tokens > len(head) or tail_tokens > len(tail):
            return None
        head_end = head[head_tokens - 1][1] if head_tokens > 0 else 0
        tail_start = tail[len(tail) - tail_tokens][0] if tail_tokens > 0 else len(tail_text)
        if head_end > edge or tail_start < len(tail_text) - edge:
            return None
        return text[:head_end], tail_text[tail_start:]

    def head_and_tail(self, text: str, head_tokens: int, tail_tokens: int) -> tuple[str, str]:
        """The text of the first ``head_tokens`` and the last ``tail_tokens`` tokens, cut at token
        boundaries (so the pieces cost what they are said to, give or take a merge at the seam).
        Remembered: an oversized tool result is cut the same way on every later size check, and
        encoding it again would cost ~1 ms per 1,000 tokens each time."""
        key = (hash(text), len(text), head_tokens, tail_tokens)
        with self._lock:
            if key in self._cuts:
                self._cuts.move_to_end(key)
                return self._cuts[key]
        cut = self._cut_from_slices(text, head_tokens, tail_tokens) if len(text) > 2 * SIZE_CHECK_SLICE_CHARS else None
        if cut is None:
            offsets = self._kept_offsets(text) or self.tokenizer.encode(text, add_special_tokens=False).offsets
            cut = _cut(text, offsets, head_tokens, tail_tokens)
        with self._lock:
            self._cuts[key] = cut
            while len(self._cuts) > CUT_CACHE_ENTRIES:
                self._cuts.popitem(last=False)
        return cut


def _cut(text: str, offsets: Sequence[tuple[int, int]], head_tokens: int, tail_tokens: int) -> tuple[str, str]:
    if head_tokens + tail_tokens >= len(offsets):
        return text, ""
    return (
        text[: offsets[head_tokens - 1][1]] if head_tokens > 0 else "",
        text[offsets[len(offsets) - tail_tokens][0] :] if tail_tokens > 0 else "",
    )


# Bump when build_tokenizer changes what it builds: tokenizers cached by an older build are ignored.
BUILD_VERSION = 2


def _file_name(digest: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", digest) + f".v{BUILD_VERSION}.json"


class ModelTokenizers:
    """``await counter(model)``: the model's exact counter, or None (the calibrated line counts)."""

    def __init__(self, ollama: OllamaClient, cache_dir: Path | None) -> None:
        self.ollama = ollama
        self.cache_dir = cache_dir
        self._by_digest: dict[str, TokenCounter] = {}
        self._unsupported: set[str] = set()  # digests whose vocabulary cannot be built: never retried
        self._digests: dict[str, tuple[str, float]] = {}  # model -> (digest, when looked up)
        self._retry_at: dict[str, float] = {}  # model -> monotonic time of the next attempt
        self._locks: dict[str, asyncio.Lock] = {}

    async def counter(self, model: str) -> TokenCounter | None:
        if not model or time.monotonic() < self._retry_at.get(model, 0.0):
            return None
        try:
            digest = await self._digest(model)
            if digest in self._unsupported:
                return None
            if digest in self._by_digest:
                return self._by_digest[digest]
            async with self._locks.setdefault(digest, asyncio.Lock()):
                if digest not in self._by_digest and digest not in self._unsupported:
                    await self._load(model, digest)
            return self._by_digest.get(digest)
        except PalimpsestError as exc:
            self._retry_at[model] = time.monotonic() + RETRY_AFTER_S
            log.warning("no exact token count for %s for now (%s): using the calibrated estimate", model, exc)
            return None

    async def _digest(self, model: str) -> str:
        digest, seen = self._digests.get(model, ("", 0.0))
        if not digest or time.monotonic() - seen > DIGEST_TTL_S:
            # A model Ollama does not list has no digest: its name stands in (never cached on disk).
            digest = await self.ollama.digest(model) or f"name:{model}"
            self._digests[model] = (digest, time.monotonic())
        return digest

    async def _load(self, model: str, digest: str) -> None:
        path = self.cache_dir / _file_name(digest) if self.cache_dir and not digest.startswith("name:") else None
        tokenizer = await asyncio.to_thread(_read_cached, path) if path else None
        if tokenizer is None:
            info = (await self.ollama.show(model, verbose=True)).get("model_info") or {}
            try:
                tokenizer = await asyncio.to_thread(build_tokenizer, info)
            except BaseException as exc:  # noqa: BLE001 — the library panics (a BaseException) on bad data
                if isinstance(exc, (KeyboardInterrupt, SystemExit, asyncio.CancelledError)):
                    raise
                self._unsupported.add(digest)
                why = exc if isinstance(exc, UnsupportedVocabulary) else f"its vocabulary does not load ({exc!r:.200})"
                log.warning("model %s: %s; its prompts are counted by the calibrated estimate", model, why)
                return
            if path:
                await asyncio.to_thread(_write_cached, path, tokenizer)
        self._by_digest[digest] = TokenCounter(tokenizer, digest)
        log.info("model %s: exact token counts from its own vocabulary (%d tokens)", model, tokenizer.get_vocab_size())


def _read_cached(path: Path) -> Tokenizer | None:
    if not path.is_file():
        return None
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 — a damaged cache file is rebuilt, never fatal
        log.warning("ignoring the damaged tokenizer cache %s: %s", path, exc)
        return None


def _write_cached(path: Path, tokenizer: Tokenizer) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written aside and renamed: another replica starting at the same time never reads half a file.
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as out:
            out.write(tokenizer.to_str())
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("could not cache the tokenizer at %s: %s", path, exc)

"""llama.cpp's own tokenizer test data, fetched from PyPI into a cache outside the repository.

llama.cpp ships vocab-only GGUF files (``models/ggml-vocab-*.gguf``) with test vectors: ``.inp``
holds texts separated by ``__ggml_vocab_test__`` lines and ``.out`` one line of token ids per text,
produced by each model's reference tokenizer and checked against llama.cpp by its own tests. They
travel inside the llama.cpp sources that PyPI sdists vendor, so the source distribution of
``llama-cpp-python`` (pinned: the vectors must not move under the tests) is downloaded once per
machine with pip and only those files are kept.

``model_info`` turns a GGUF file into the fields Ollama's ``/api/show`` (verbose) gives, so a
vocabulary here is read by the same code as a model Ollama serves.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# llama.cpp as vendored in this release (upstream build of 2026-10).
SDIST = "llama-cpp-python==0.3.36"
MODELS_IN_SDIST = "/vendor/llama.cpp/models/"
VOCAB_PREFIX = "ggml-vocab-"
SEPARATOR = "\n__ggml_vocab_test__\n"
# Ollama's model_info carries the tokenizer's fields and the model's general ones (general.name
# decides phi-3's token attributes in llama.cpp).
INFO_PREFIXES = ("tokenizer.ggml.", "general.name")
DOWNLOAD_TIMEOUT_S = 600


class OracleUnavailable(RuntimeError):
    """PyPI could not be reached: the caller skips, saying so."""


def cache_root() -> Path:
    """``PALIMPSEST_VOCAB_CACHE``, else ``~/.cache/palimpsest-vocab``: never inside the repository."""
    configured = os.environ.get("PALIMPSEST_VOCAB_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "palimpsest-vocab"


def vocab_dir(root: Path | None = None) -> Path:
    """The folder of llama.cpp's vocab files and vectors, downloaded on first use.

    Parallel-safe: test workers take a file lock, the first downloads, the others find it done;
    the folder appears whole (renamed into place) or not at all."""
    root = root or cache_root()
    target = root / SDIST.replace("==", "-")
    if (target / ".complete").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / ".complete").is_file():
            _download(target)
    return target


def _download(target: Path) -> None:
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                   "--disable-pip-version-check", "--retries", "1", "--timeout", "30", "-d", scratch, SDIST]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise OracleUnavailable(f"pip download {SDIST} timed out") from exc
        archives = list(Path(scratch).glob("*.tar.gz"))
        if done.returncode != 0 or not archives:
            raise OracleUnavailable(f"pip download {SDIST} failed: {done.stderr.strip()[-400:]}")
        staged = Path(scratch) / "models"
        staged.mkdir()
        with tarfile.open(archives[0]) as archive:
            for member in archive.getmembers():
                name = member.name.rpartition("/")[2]
                if member.isfile() and MODELS_IN_SDIST in member.name and name.startswith(VOCAB_PREFIX):
                    source = archive.extractfile(member)
                    assert source is not None
                    with source, open(staged / name, "wb") as out:
                        shutil.copyfileobj(source, out)
        (staged / ".complete").write_text(SDIST)
        if target.exists():
            shutil.rmtree(target)
        staged.rename(target)


@dataclass(frozen=True)
class OracleVocab:
    """One of llama.cpp's vocab files and its test vectors (none for some)."""

    name: str  # e.g. "llama-bpe", from ggml-vocab-llama-bpe.gguf
    path: Path

    @property
    def has_vectors(self) -> bool:
        return self.path.with_name(self.path.name + ".inp").is_file()

    def vectors(self) -> list[tuple[str, list[int]]]:
        """(text, expected ids) pairs, read the way llama.cpp's test-tokenizer-0 reads them."""
        raw = self.path.with_name(self.path.name + ".inp").read_text(encoding="utf-8")
        texts: list[str] = []
        position = 0
        while position < len(raw):
            found = raw.find(SEPARATOR, position)
            if found < 0:
                texts.append(raw[position:])
                break
            texts.append(raw[position:found])
            position = found + len(SEPARATOR)
        lines = self.path.with_name(self.path.name + ".out").read_text(encoding="utf-8").splitlines()
        if len(lines) != len(texts):
            raise ValueError(f"{self.name}: {len(texts)} texts but {len(lines)} lines of ids")
        return [(text, [int(i) for i in line.split()]) for text, line in zip(texts, lines)]


def vocabularies(folder: Path) -> list[OracleVocab]:
    return [OracleVocab(p.name[len(VOCAB_PREFIX):-len(".gguf")], p)
            for p in sorted(folder.glob(VOCAB_PREFIX + "*.gguf"))]


# GGUF value types: (struct format, size) for scalars; 8 is a string, 9 an array.
_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
            6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
_STRING, _ARRAY = 8, 9


class _Reader:
    """The key-value header of a GGUF file (the format's spec, little-endian); tensors are not read."""

    def __init__(self, data: bytes):
        self.data = data
        self.at = 0

    def scalar(self, kind: int) -> Any:
        fmt, size = _SCALARS[kind]
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += size
        return value

    def string(self) -> str:
        length = self.scalar(10)
        text = self.data[self.at:self.at + length].decode("utf-8", "surrogateescape")
        self.at += length
        return text

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item_kind, count = self.scalar(4), self.scalar(10)
            if item_kind in _SCALARS:  # one unpack for the whole array
                fmt, size = _SCALARS[item_kind]
                values = struct.unpack_from(f"<{count}{fmt[1]}", self.data, self.at)
                self.at += size * count
                return list(values)
            return [self.value(item_kind) for _ in range(count)]
        return self.scalar(kind)


def model_info(path: Path) -> dict[str, Any]:
    """The GGUF file's tokenizer fields as Ollama's ``model_info`` (verbose) gives them."""
    reader = _Reader(path.read_bytes())
    if reader.data[:4] != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    reader.at = 8  # magic and version
    _tensors, pairs = reader.scalar(10), reader.scalar(10)
    info: dict[str, Any] = {}
    for _ in range(pairs):
        key = reader.string()
        value = reader.value(reader.scalar(4))
        if key.startswith(INFO_PREFIXES) and key != "tokenizer.chat_template":
            info[key] = value
    return info

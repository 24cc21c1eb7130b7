"""The key-value header of a GGUF file, read as Ollama's ``/api/show`` reports it in ``model_info``.

Only the header is read (the format's spec, little-endian); tensors are skipped. llama.cpp's
vocab-only files (``ggml-vocab-*.gguf``) hold nothing else, which is what the simulator serves a
model's vocabulary from and what the vocabulary tests read.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

# GGUF value types: (struct format, size) for scalars; 8 is a string, 9 an array.
_SCALARS = {
    0: ("<B", 1),
    1: ("<b", 1),
    2: ("<H", 2),
    3: ("<h", 2),
    4: ("<I", 4),
    5: ("<i", 4),
    6: ("<f", 4),
    7: ("<?", 1),
    10: ("<Q", 8),
    11: ("<q", 8),
    12: ("<d", 8),
}
_STRING, _ARRAY = 8, 9

# Ollama's model_info carries the tokenizer's fields and the model's general ones (general.name
# decides phi-3's token attributes in llama.cpp); the chat template is reported apart from it.
INFO_PREFIXES = ("tokenizer.ggml.", "general.name")


class _Reader:
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
        text = self.data[self.at : self.at + length].decode("utf-8", "surrogateescape")
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

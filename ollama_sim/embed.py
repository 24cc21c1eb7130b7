"""Deterministic stand-in embeddings: similar texts get similar unit vectors."""

from __future__ import annotations

import hashlib
import math

DIMENSIONS = 64


def _bucket(trigram: str) -> int:
    # blake2b, not hash(): Python's str hash is salted per process and would not be stable.
    digest = hashlib.blake2b(trigram.encode("utf-8"), digest_size=4).digest()
    return int.from_bytes(digest, "big") % DIMENSIONS


def embed_text(text: str, dimensions: int = DIMENSIONS) -> list[float]:
    """L2-normalised bag of hashed character trigrams (case-folded, padded at the edges)."""
    padded = f"  {text.casefold()} "
    vector = [0.0] * dimensions
    for i in range(len(padded) - 2):
        vector[_bucket(padded[i : i + 3]) % dimensions] += 1.0
    norm = math.sqrt(sum(v * v for v in vector))
    if norm == 0.0:
        # Unreachable with the padding, kept so a unit vector is guaranteed.
        vector[0], norm = 1.0, 1.0
    return [v / norm for v in vector]

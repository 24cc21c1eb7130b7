"""Deterministic stand-in embeddings in which related texts are near.

A real embedding model places "the deploy crashed" near "release failure" although they share no
word; tests of search by meaning need that property without a model. Each word is folded to a
concept (a small synonym map, then a crude stem), concepts are hashed into buckets, and the
bag is L2-normalised: texts naming the same concepts in other words get a high cosine, unrelated
texts a cosine near 0 (only bucket collisions). Common function words carry no meaning and are
left out, as a model's pooled embedding mostly ignores them.
"""

from __future__ import annotations

import hashlib
import math
import re

DIMENSIONS = 256

# Words of one meaning, folded to one concept. Small on purpose: enough for the paraphrases the
# tests and the demo use, not a thesaurus.
_SYNONYMS: dict[str, str] = {}
for _concept, _words in {
    "fail": "fail failed failing failure fails crash crashed crashes broke broken break error errors outage down",
    "deploy": "deploy deployed deploying deployment release released releases rollout ship shipped",
    "database": "database databases db postgres postgresql pg sql",
    "secret": "password passwords credential credentials secret secrets token tokens key keys",
    "expire": "expire expired expiry expires lapse lapsed stale outdated",
    "car": "car cars automobile automobiles vehicle vehicles auto",
    "repair": "repair repaired fix fixed fixing mend mended patch patched",
    "fast": "fast quick quickly speedy rapid slow slowness latency",
    "money": "money cost costs price prices budget revenue spend",
    "begin": "begin start started starting launch launched boot booted",
}.items():
    for _word in _words.split():
        _SYNONYMS[_word] = _concept

_STOP_WORDS = frozenset(
    "a an and are as at be because but by did do does for from had has have how i in is it its my no not of on "
    "or our so that the their then there this to was we were what when where which who why will with you your".split()
)


def concepts(text: str) -> list[str]:
    """The text's meaning-bearing words, each folded to its concept."""
    found = []
    for word in re.findall(r"[a-z0-9]+", text.casefold()):
        if word in _STOP_WORDS:
            continue
        if word not in _SYNONYMS:
            for suffix in ("ing", "ed", "es", "s"):  # crude stemming: "tables" and "table" meet
                if len(word) > len(suffix) + 2 and word.endswith(suffix):
                    word = word[: -len(suffix)]
                    break
        found.append(_SYNONYMS.get(word, word))
    return found


def _bucket(concept: str, dimensions: int) -> int:
    # blake2b, not hash(): Python's str hash is salted per process and would not be stable.
    digest = hashlib.blake2b(concept.encode("utf-8"), digest_size=4).digest()
    return int.from_bytes(digest, "big") % dimensions


def embed_text(text: str, dimensions: int = DIMENSIONS) -> list[float]:
    """L2-normalised bag of hashed concepts (a text of no such word: a fixed unit vector)."""
    vector = [0.0] * dimensions
    for concept in concepts(text):
        vector[_bucket(concept, dimensions)] += 1.0
    norm = math.sqrt(sum(v * v for v in vector))
    if norm == 0.0:
        vector[0], norm = 1.0, 1.0  # "the", "" ...: still a unit vector, as a model always answers one
    return [v / norm for v in vector]

"""What /api/tags and /api/show say about the simulator's models."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from . import families
from .models import ModelSpec
from .vocabulary import tokenizer_metadata

JsonObject = dict[str, Any]


def _model_details(spec: ModelSpec) -> JsonObject:
    return {
        "parent_model": "",
        "format": "gguf",
        "family": spec.architecture,
        "families": [spec.architecture],
        "parameter_size": spec.parameter_size,
        "quantization_level": spec.quantization_level,
    }


def _listed_name(name: str) -> str:
    return name if ":" in name else f"{name}:latest"


def model_digest(name: str, spec: ModelSpec) -> str:
    """What /api/tags reports: a model under the same name with another vocabulary is another model,
    so clients that cache a vocabulary per digest never mix the two."""
    vocabulary = spec.vocabulary or (spec.vocabulary_file.name if spec.vocabulary_file else "")
    return hashlib.sha256(f"{name}\0{vocabulary}".encode()).hexdigest()


@functools.lru_cache(maxsize=8)
def show_payload(spec: ModelSpec, verbose: bool) -> bytes:
    """The /api/show body, serialized once per model: verbose, it is about 12 MB of JSON."""
    arch = spec.architecture
    model_info: JsonObject = {
        "general.architecture": arch,
        "general.parameter_count": 0,
        f"{arch}.context_length": spec.context_length,
        f"{arch}.embedding_length": spec.embedding_length,
    }
    if spec.vocabulary is not None:
        model_info.update(tokenizer_metadata(spec.vocabulary, arrays=verbose))
    elif spec.vocabulary_file is not None:
        path = spec.vocabulary_file
        model_info.update(families.file_metadata(path) if verbose else families.file_header(path))
    body = {
        "modified_at": "2025-01-01T00:00:00Z",
        "details": _model_details(spec),
        "model_info": model_info,
        "capabilities": list(spec.capabilities),
    }
    # Raw UTF-8 like Go's encoder: escaping the tokens' non-ASCII characters would double the size.
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def tags(models: Mapping[str, ModelSpec]) -> JsonObject:
    return {
        "models": [
            {
                "name": _listed_name(name),
                "model": _listed_name(name),
                "modified_at": "2025-01-01T00:00:00Z",
                "size": spec.size,
                "digest": model_digest(name, spec),
                "details": _model_details(spec),
            }
            for name, spec in models.items()
        ]
    }

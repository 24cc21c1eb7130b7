"""An Ollama look-alike HTTP server for tests: see server.OllamaSimulator."""

from .models import ModelSpec, Reply, default_models
from .prompt import count_prompt_tokens, count_text_tokens, render_prompt
from .server import ChatRecord, OllamaSimulator, RecordedRequest

__all__ = [
    "ChatRecord",
    "ModelSpec",
    "OllamaSimulator",
    "RecordedRequest",
    "Reply",
    "count_prompt_tokens",
    "count_text_tokens",
    "default_models",
    "render_prompt",
]

"""A session's display name, made by the model after the first exchange.

The first words of the first message name a session at once (the fallback, before any model call);
after the first answer, off the client's path, the model is asked for a short title. The call goes
out with the conversation's own num_ctx: Ollama reloads a model whose context size changes.
"""

from __future__ import annotations

import re
from typing import Any

from palimpsest.shared.ollama import OllamaClient

TITLE_MAX_CHARS = 60
# What the model sees of the exchange: a title needs the gist, not the whole answer.
EXCHANGE_CHARS = 1500
TITLE_TOKENS = 24
# A title is a nicety: a model that takes longer is busy with more important work.
TITLE_TIMEOUT_S = 30.0

_INSTRUCTION = (
    "Name the conversation below with a title of at most six words, in the language the user "
    "wrote in. Answer with the title alone: no quotes, no label, no final punctuation."
)
_LABEL = re.compile(r"^(title|titre|titel|título)\s*[:：-]\s*", re.IGNORECASE)


def title_first_words(text: str) -> str:
    """The name a session gets before the model has answered: its first message's first words."""
    return " ".join(text.split())[:TITLE_MAX_CHARS]


def title_request(model: str, num_ctx: int, user_text: str, answer: str, thinking_model: bool) -> dict[str, Any]:
    exchange = f"User: {user_text[:EXCHANGE_CHARS]}\n\nAssistant: {answer[:EXCHANGE_CHARS]}"
    return OllamaClient.chat_body(
        model,
        [{"role": "system", "content": _INSTRUCTION}, {"role": "user", "content": exchange}],
        num_ctx=num_ctx,
        think=False if thinking_model else None,
        stream=False,
        options={"temperature": 0.2, "num_predict": TITLE_TOKENS},
    )


def clean_title(raw: str) -> str:
    """The model's answer as a name: its first line, without markdown, labels, quotes or a final
    full stop, within TITLE_MAX_CHARS (cut at a word); empty when nothing usable is left."""
    line = next((line for line in raw.splitlines() if line.strip()), "")
    line = line.strip().lstrip("#*-> ").rstrip("*")
    line = _LABEL.sub("", line).strip().strip("\"'“”‘’«»`*").strip()
    line = line.rstrip(".。!！ ")
    line = " ".join(line.split())
    if len(line) > TITLE_MAX_CHARS:
        line = line[:TITLE_MAX_CHARS].rsplit(" ", 1)[0] if " " in line[:TITLE_MAX_CHARS] else line[:TITLE_MAX_CHARS]
    return line

"""What the simulator records of the requests it served, for tests to assert on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from . import engines


class RecordedRequest(NamedTuple):
    """One request as received: its path and parsed JSON body (None for GET or bad JSON)."""

    path: str
    body: Any


@dataclass
class ChatRecord:
    """What the simulator did with one /api/chat request that reached generation."""

    model: str
    stream: bool
    prompt_tokens: int  # the full prompt, counted
    num_ctx: int
    prompt_eval_count: int  # what was reported: smaller than prompt_tokens when truncated
    truncated: bool
    disconnected: bool = False  # the client hung up before the answer was complete
    completed: bool = False
    engine: str = engines.RUNNERS
    dropped_messages: int = 0  # whole old messages llama-server left out
    cached_tokens: int = 0  # the prompt's head still in the prompt cache (llama-server's cache_n)

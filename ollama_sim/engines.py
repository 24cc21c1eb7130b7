"""How Ollama fits a chat prompt into ``num_ctx``, in each of the two engines it has shipped.

The version the simulator reports on ``/api/version`` chooses the engine, as it tells a client:
- before 0.30.0, Ollama's own runners: a prompt over the window loses its head (system prompt
  included) down to about half the window, silently; ``truncate: false`` is ignored before 0.12.6
  and refused with HTTP 400 since.
- since 0.30.0 (ollama/ollama#16031), llama.cpp's llama-server: whole old messages are dropped
  (system messages and the last message kept) until the rendered prompt fits; a last message that
  alone does not fit is shortened by a context shift, or refused where the model has none;
  ``truncate: false`` refuses any prompt over the window.

Pure functions over per-turn token counts (see prompt.turn_counts), so they are tested apart from HTTP.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

RUNNERS = "runners"
LLAMA_SERVER = "llama-server"

# ollama/ollama#16031 (v0.30.0, May 2026): every GGUF model runs on upstream llama-server.
LLAMA_SERVER_SINCE = (0, 30, 0)
# The chat API's `truncate` field is honoured from this version on; older ones ignore it.
TRUNCATE_HONOURED_SINCE = (0, 12, 6)
# Ollama's default options.num_keep: the prompt's first tokens a context shift never discards.
DEFAULT_NUM_KEEP = 4

# The error texts, as each engine words them.
RUNNER_REFUSAL = "the input length exceeds the context length"
LLAMA_SERVER_REFUSAL = "the request exceeds the available context size, try increasing it"
NO_CONTEXT_SHIFT_REFUSAL = (
    "the prompt is longer than the context length currently available to the model; shorten the prompt, "
    "adjust the context length in settings, or use a model with a longer context length"
)


def parse_version(text: str) -> tuple[int, int, int]:
    """``"0.30.1-rc2"`` → (0, 30, 1); a version without numbers (a dev build's) is (0, 0, 0)."""
    found = re.match(r"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?", text.strip())
    if found is None:
        return (0, 0, 0)
    major, minor, patch = (int(part or 0) for part in found.groups())
    return (major, minor, patch)


def engine_for(version: str) -> str:
    return LLAMA_SERVER if parse_version(version) >= LLAMA_SERVER_SINCE else RUNNERS


@dataclass(frozen=True)
class Turn:
    """One rendered turn of the prompt: its role and its tokens (images included)."""

    role: str
    tokens: int


@dataclass(frozen=True)
class Fit:
    """What the engine made of one prompt."""

    prompt_tokens: int  # the whole prompt as the client sent it
    kept_tokens: int  # what the model read: the prompt_eval_count to report
    kept_turns: tuple[int, ...] = ()  # indices of the turns read (llama-server's message dropping)
    dropped_messages: int = 0
    shifted: bool = False  # cut inside the prompt (the runners' front cut, or a context shift)
    refusal: str | None = None  # the HTTP 400's error text: nothing was generated

    @property
    def truncated(self) -> bool:
        return self.dropped_messages > 0 or self.shifted


def _total(turns: Sequence[Turn], indices: Sequence[int], closing: int) -> int:
    return sum(turns[i].tokens for i in indices) + closing


def fit_runners(turns: Sequence[Turn], closing: int, num_ctx: int, truncate: bool, version: str) -> Fit:
    """The runners: whole prompt if it fits; else refused (``truncate`` false, honoured since
    0.12.6) or its head dropped, keeping num_ctx/2 + 2 tokens, with nothing in the answer saying so."""
    everything = tuple(range(len(turns)))
    total = _total(turns, everything, closing)
    if total <= num_ctx:
        return Fit(total, total, everything)
    if not truncate and parse_version(version) >= TRUNCATE_HONOURED_SINCE:
        return Fit(total, 0, refusal=RUNNER_REFUSAL)
    return Fit(total, num_ctx // 2 + 2, everything, shifted=True)


def _with_skipped_systems(turns: Sequence[Turn], start: int) -> tuple[int, ...]:
    """Turns ``start`` on, after the system turns before it (chatPrompt keeps every system message)."""
    return (*(i for i in range(start) if turns[i].role == "system"), *range(start, len(turns)))


def context_shift_limit(num_ctx: int, num_keep: int) -> int:
    """What a context shift leaves of a prompt: num_keep, then about half of the rest of the window."""
    if num_ctx <= 1:
        return 0
    num_keep = max(0, min(num_keep, num_ctx - 1))
    return num_ctx - max((num_ctx - num_keep) // 2, 1)


def fit_llama_server(
    turns: Sequence[Turn],
    closing: int,
    num_ctx: int,
    truncate: bool,
    *,
    context_shift: bool = True,
    num_keep: int = DEFAULT_NUM_KEEP,
) -> Fit:
    """llama-server, behind Ollama's chatPrompt: with ``truncate``, the fewest old messages dropped
    for the rest to fit (system messages and the last one always kept); without, any prompt over the
    window is refused. A last message too long on its own is context-shifted, or refused without a
    context shift."""
    everything = tuple(range(len(turns)))
    total = _total(turns, everything, closing)
    if not truncate:
        # llama-server refuses a prompt that leaves no room in its slot: n_prompt >= n_ctx.
        if total >= num_ctx:
            return Fit(total, 0, refusal=LLAMA_SERVER_REFUSAL)
        return Fit(total, total, everything)
    last = len(turns) - 1
    kept = everything
    for start in range(len(turns)):
        kept = _with_skipped_systems(turns, start)
        if _total(turns, kept, closing) <= num_ctx or start >= last:
            break
    dropped = len(turns) - len(kept)
    tokens = _total(turns, kept, closing)
    if tokens <= num_ctx:
        return Fit(total, tokens, kept, dropped)
    if not context_shift:
        return Fit(total, 0, refusal=NO_CONTEXT_SHIFT_REFUSAL)
    return Fit(total, context_shift_limit(num_ctx, num_keep), kept, dropped, shifted=True)


def common_prefix_tokens(previous: Sequence[str], current: Sequence[str], counts: Sequence[int]) -> int:
    """The tokens of ``current``'s turns that begin it exactly as ``previous`` began: what the
    server's prompt cache still holds from the last request (llama-server reports them as cache_n)."""
    cached = 0
    for before, now, tokens in zip(previous, current, counts):
        if before != now:
            break
        cached += tokens
    return cached

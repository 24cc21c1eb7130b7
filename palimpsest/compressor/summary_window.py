"""The summary call's window: the num_ctx it is sent with, how much of it the input may take, and
how long the summary may be. Plain arithmetic over token counts, so it is tested without a server.

On Ollama a request whose num_ctx differs from the loaded runner's reloads the model (seconds to
minutes), so the window is chosen by who the summarizer is, never by how big its input is: the
input is cut to fit the window instead.
"""

from __future__ import annotations

import math

from palimpsest.compressor.token_estimate import output_reserve

# 5%: the estimate is a line fitted on the conversation's own prompts (or chars / 1.8); a summary
# input of other text can cost a little more than priced, and a prompt over num_ctx loses its head
# (the summary prompt first) without any error.
ESTIMATE_HEADROOM_PERCENT = 5


def summary_num_ctx(*, same_model: bool, conversation_window: int, summarizer_window: int, context_length: int) -> int:
    """The num_ctx of a summary call.

    The conversation's own model gets exactly the conversation's window (the num_ctx its chat calls
    use, so the loaded runner is reused); a separate summarizer model gets its configured window.
    Either way never more than the model's context length (0: unknown).
    """
    window = conversation_window if same_model else summarizer_window
    return min(window, context_length) if context_length > 0 else window


def padded(tokens: int) -> int:
    """An estimate with the headroom for its own error added."""
    return math.ceil(tokens * (100 + ESTIMATE_HEADROOM_PERCENT) / 100)


def input_limit(num_ctx: int, summary_max_tokens: int) -> int:
    """The most the request (summary prompt + input) may be priced at in ``num_ctx``.

    Room for the summary is kept free first: ``summary_max_tokens``, but at most a quarter of the
    window (the answer headroom rule of the size check), so the history to summarize always gets
    three quarters. A cap larger than that gives way through ``num_predict``, not the input.
    """
    usable = num_ctx - output_reserve(num_ctx, summary_max_tokens)
    return max(0, usable * 100 // (100 + ESTIMATE_HEADROOM_PERCENT))


def num_predict(num_ctx: int, prompt_tokens: int, summary_max_tokens: int) -> int:
    """``summary_max_tokens``, capped so that the priced prompt plus the summary fit ``num_ctx``
    (past it Ollama would shift the context and drop the head of the prompt mid-answer)."""
    return max(0, min(summary_max_tokens, num_ctx - padded(prompt_tokens)))


# A summary is about a twelfth of what it condenses (tool results counted at their preview):
# bullet points of the facts, not a retelling.
CONDENSE_RATIO = 12
# The least a summary is asked for (a few bullets and the KEYS line), and the share of the window
# the live summary may grow to before it is rewritten whole.
MIN_SUMMARY_TOKENS = 96
SUMMARY_WINDOW_SHARE = 16
# num_predict is this many times what was asked for: a model runs past a length it is given, and
# past num_predict Ollama stops it mid-sentence (the KEYS line is the first thing lost).
PREDICT_SLACK = 2
TOKENS_PER_WORD_NUMERATOR, TOKENS_PER_WORD_DENOMINATOR = 4, 3  # ~1.33 tokens a word in English


def summary_budget(window: int, summary_max_tokens: int) -> int:
    """The most the live summary may hold: a sixteenth of the window (the rest is the conversation),
    never above the configured cap."""
    return max(MIN_SUMMARY_TOKENS, min(summary_max_tokens, window // SUMMARY_WINDOW_SHARE))


def summary_length(input_tokens: int, budget: int) -> int:
    """How long a summary of ``input_tokens`` of history is asked to be: proportional to it, at
    least MIN_SUMMARY_TOKENS, at most ``budget``."""
    return max(MIN_SUMMARY_TOKENS, min(budget, input_tokens // CONDENSE_RATIO))


def predict_for(length: int, summary_max_tokens: int) -> int:
    """The num_predict of a summary asked to be ``length`` tokens long."""
    return max(1, min(summary_max_tokens, length * PREDICT_SLACK))


def words_for(tokens: int) -> int:
    """The length of ``tokens`` in words, as the request states it to the model."""
    return max(1, tokens * TOKENS_PER_WORD_DENOMINATOR // TOKENS_PER_WORD_NUMERATOR)

"""Which token texts llama.cpp matches whole in a prompt, before any splitting.

llama-server tokenizes a prompt with special tokens parsed, so the chat template's markers — and
the same text pasted by a user — are one token each. llama.cpp matches every token typed control,
user-defined or unknown in the GGUF, after correcting the types by name: tokens that look like an
end of turn or a fill-in-the-middle marker count as control whatever the file says, and a few
model-specific exceptions below. Everything here is pure; ``vocabulary`` applies the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# GGUF token types (llama.cpp's llama_token_type).
UNKNOWN, CONTROL, USER_DEFINED = 2, 3, 4

# Texts llama.cpp treats as control tokens by name (end of turn, end of generation, fill in the
# middle), as its vocabulary loader lists them.
CONTROL_BY_NAME = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|end_of_text|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "[EOS]",
        "<｜end▁of▁sentence｜>",
        "<end_of_utterance>",
        "<|eom_id|>",
        "<|return|>",
        "<|call|>",
        "<|flush|>",
        "<|calls|>",
        "</s>",
        "<eos>",
        "<turn|>",
        "<|tool_response>",
        "[e~[",
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<｜fim▁begin｜>",
        "<PRE>",
        "▁<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<｜fim▁hole｜>",
        "<SUF>",
        "▁<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<｜fim▁end｜>",
        "<MID>",
        "▁<MID>",
        "<|code_middle|>",
        "<|middle|>",
        "<|fim_pad|>",
        "<fim-pad>",
        "<fim_pad>",
        "<PAD>",
        "[PAD]",
        "<|fim_repo|>",
        "<|repo_name|>",
        "<fim-repo>",
        "<REPO>",
        "<reponame>",
        "<|file_sep|>",
    }
)
# Where one of these ends generation, "</s>" is an ordinary word (Gemma 4, PLaMo).
_PLAIN_END_OF_SENTENCE_WITH = ("<|tool_response>", "<|plamo:eos|>")
# Phi-3 (by general.name): special tokens swallow the whitespace after them, except these.
_PHI3_NAMES = ("phi-3", "phi3")
_PHI3_NO_RSTRIP = frozenset({"<unk>", "<s>", "<|endoftext|>"})


@dataclass(frozen=True)
class MatchedToken:
    text: str
    special: bool  # control or unknown (a chat-template marker), else user-defined
    rstrip: bool = False  # whitespace after it is dropped, as llama.cpp does for Phi-3


def matched_tokens(tokens: Sequence[str], types: Sequence[int], model_name: str = "") -> list[MatchedToken]:
    """The tokens llama.cpp matches whole in text, in vocabulary order, each text once."""
    present = set(tokens)
    plain_eos = any(marker in present for marker in _PLAIN_END_OF_SENTENCE_WITH)
    phi3 = any(name in model_name.lower() for name in _PHI3_NAMES)
    matched: list[MatchedToken] = []
    seen: set[str] = set()
    for text, kind in zip(tokens, types):
        if not text or text in seen:
            continue
        by_name = text in CONTROL_BY_NAME and not (plain_eos and text == "</s>")
        if kind not in (UNKNOWN, CONTROL, USER_DEFINED) and not by_name:
            continue
        if plain_eos and text == "</s>":
            continue
        seen.add(text)
        special = kind != USER_DEFINED or by_name
        rstrip = phi3 and text not in _PHI3_NO_RSTRIP
        matched.append(MatchedToken(text, special, rstrip))
    return matched

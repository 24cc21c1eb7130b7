"""What a model's report of its prompt size (Ollama's ``prompt_eval_count``) may teach.

One set of rules for both places a report arrives: the Compressor's RecordBaseline, and the Agent,
which folds a turn's report into the append that stores the reply (one write between the model's
last token and ``stream_end``). A report can prove the prompt was cut, become the session's
baseline and the model's calibration observation, or be left out because it looks like a cut.
"""

from __future__ import annotations

from dataclasses import dataclass

from palimpsest.v1 import common_pb2, compressor_pb2
from palimpsest.v1 import session_store_pb2 as store_pb

# A report this far under the content's own exact count is a cut prompt; the slack covers tokens
# that merge across a message's seam with its template (a few per message, never 2% of them).
CUT_PROOF_RATIO = 0.98
# The most a chat template can add to a prompt's exact content: a generous cost per message and per
# tool call, a fixed part as large as a long Modelfile system prompt, and images at the highest
# scale the image fit accepts. A report above it did not come from that prompt.
MAX_TEMPLATE_PER_MESSAGE = 64
MAX_TEMPLATE_FIXED = 8192
MAX_IMAGE_SCALE = 20


def proves_cut(reported: int, content_tokens: int) -> bool:
    """True when Ollama evaluated fewer tokens than the prompt's content alone has: it dropped the
    head of the prompt. The template only ever adds tokens, so no honest report is this low."""
    return content_tokens > 0 and reported < content_tokens * CUT_PROOF_RATIO


def plausible_report(reported: int, shape: common_pb2.PromptShape) -> bool:
    """False when Ollama's count is more than any template could add to the exact content: such
    an observation would swell every later count of the model (the services alone may report, so
    this guards against a broken or compromised one)."""
    ceiling = (
        shape.content_tokens
        + MAX_TEMPLATE_FIXED
        + MAX_TEMPLATE_PER_MESSAGE * (shape.messages + shape.tool_calls)
        + MAX_IMAGE_SCALE * shape.image_prior_tokens
    )
    return shape.content_tokens <= 0 or reported <= ceiling


def near_cut_size(reported: int, window: int) -> bool:
    """A report within 1% of half the window is what a cut prompt looks like (Ollama keeps about
    num_ctx/2 + 2 tokens). Even when our estimate was too low to prove the cut, such a count must not
    become a baseline or bend the calibration line: one honest report lost costs nothing, one cut
    report learned makes every later estimate too low."""
    return window > 0 and abs(reported - (window // 2 + 2)) <= window // 100


@dataclass(frozen=True)
class Verdict:
    """What one report teaches."""

    problem: str = ""  # not a report of this prompt at all ("field: why"); nothing else applies
    prompt_cut: bool = False  # proven cut: flag the session, learn nothing
    learned: bool = False  # the session's new baseline (and the observation, when there is one)
    observation: store_pb.Observation | None = None


def counted_exactly(method: int, shape: common_pb2.PromptShape) -> bool:
    """The prompt was counted by the model's own tokenizer: its report is judged against that count,
    and the prompt's characters (``judge``'s ``sent_chars``, ``had_images``) play no part."""
    return method == compressor_pb2.ESTIMATE_METHOD_EXACT and shape.content_tokens > 0


def judge(
    reported: int,
    *,
    model: str,
    method: int,
    shape: common_pb2.PromptShape,
    window: int,
    sent_chars: int,
    had_images: bool,
) -> Verdict:
    """The verdict on a report of ``reported`` tokens for a prompt sized by ``method`` with ``shape``
    and sent with num_ctx ``window``."""
    exact = counted_exactly(method, shape)
    if window > 0 and reported > window:
        return Verdict(problem=f"prompt_eval_count: more than the window of {window} tokens")
    if exact and not plausible_report(reported, shape):
        return Verdict(
            problem=f"prompt_eval_count: {reported} tokens is more than any chat template adds to "
            f"this prompt's {shape.content_tokens} content tokens"
        )
    if exact and proves_cut(reported, shape.content_tokens):
        return Verdict(prompt_cut=True)
    # Images are priced apart from the content, so a cut of an image-heavy prompt cannot be proven
    # against the content: a report of about half the window is then not learned from either.
    if (not exact or shape.images) and near_cut_size(reported, window):
        return Verdict()
    if exact:
        return Verdict(learned=True, observation=store_pb.Observation(model=model, tokens=reported, exact=shape))
    if sent_chars > 0 and not had_images:
        # Image tokens are not chars: a prompt with images would bend the line for text. The shape
        # (its characters by class) teaches the per-class rates.
        return Verdict(
            learned=True, observation=store_pb.Observation(model=model, chars=sent_chars, tokens=reported, exact=shape)
        )
    return Verdict(learned=True)

"""Exact prompt sizes: content counted by the model's own tokenizer, the chat template's cost fitted.

What a prompt costs is its content (messages, tool-call arguments, tool schemas) in the model's
own tokens — counted exactly — plus what the chat template wraps around it: role markers per
message, the tool-result and tool-call wrappers, the tools block, the generation prompt, and each
image's tokens. Those few constants differ per template, so they are fitted per model from
Ollama's real ``prompt_eval_count`` (a ridge fit that starts from ChatML's values), and the worst
under-count of the recent reports is added back as a margin so a count is never low.

Everything here is pure: the counter is any object with ``counts(texts)`` and ``head_and_tail``.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from palimpsest.shared.context_view import TRUNCATABLE_ROLES, truncation_marker, with_content
from palimpsest.shared.image_tokens import image_tokens
from palimpsest.v1.common_pb2 import Message


class Counter(Protocol):
    # for_cut: the texts may be cut right after (a counter may keep what the cut needs).
    def counts(self, texts: Sequence[str], *, for_cut: bool = False) -> list[int]: ...

    def head_and_tail(self, text: str, head_tokens: int, tail_tokens: int) -> tuple[str, str]: ...


@dataclass(frozen=True)
class Shape:
    """What a prompt is made of, as the exact count saw it."""

    content_tokens: int = 0
    messages: int = 0
    tool_results: int = 0
    tool_calls: int = 0
    tools: int = 0
    image_prior_tokens: int = 0
    images: int = 0
    # The content's characters by class (see calibration.CHAR_CLASSES): what a model without a
    # vocabulary is priced by.
    chars_space: int = 0
    chars_digit: int = 0
    chars_latin: int = 0
    chars_cjk: int = 0
    chars_other_letter: int = 0
    chars_symbol: int = 0

    def features(self) -> tuple[float, ...]:
        """What the template's cost depends on, in the order of ``CHATML_PRIOR``."""
        return (1.0, self.messages, self.tool_results, self.tool_calls, 1.0 if self.tools else 0.0, self.tools)


# ChatML as Qwen renders it: the generation prompt (3), <|im_start|>role\n … <|im_end|>\n per message
# (5), <tool_response> wrapping per result (4), <tool_call> wrapping per call (4), the tools block's
# header (~40) and a line per schema (2). Only the starting point: reports move it to the real template.
CHATML_PRIOR = (3.0, 5.0, 4.0, 4.0, 40.0, 2.0)
# How strongly the fit holds to the prior where the reports cannot tell the constants apart (a
# feature that never varies, like the tools block in a session that always sends its tools).
RIDGE = 1.0
# Before any report of this model: the template may differ from ChatML by this much per message.
UNOBSERVED_MARGIN_PER_MESSAGE = 4
UNOBSERVED_MARGIN = 64
IMAGE_SCALE_BOUNDS = (0.05, 20.0)
# A template that misses a report by more than this is not a template: such a report (a prompt
# with a Modelfile system prompt the fit has not absorbed yet, or a lie) must not swell every count.
MAX_MARGIN = 512


@dataclass(frozen=True)
class ExactObservation:
    shape: Shape
    tokens: int  # Ollama's prompt_eval_count for that prompt


@dataclass(frozen=True)
class Template:
    """A model's chat-template cost: tokens = content + coefficients · features + images + margin."""

    coefficients: tuple[float, ...] = CHATML_PRIOR
    # The worst under-count of the fitted reports, added to every count (None: no reports yet).
    margin: int | None = None
    # Real tokens per area-priced image token (1.0 until an image prompt was reported).
    image_scale: float = 1.0
    observed: int = 0

    def overhead(self, shape: Shape) -> float:
        return sum(c * f for c, f in zip(self.coefficients, shape.features()))

    def text_tokens(self, shape: Shape) -> int:
        """The prompt without images and without the safety margin: the fit's own prediction."""
        return shape.content_tokens + max(0, math.ceil(self.overhead(shape)))

    def safety_margin(self, shape: Shape) -> int:
        if self.margin is not None:
            return self.margin
        return UNOBSERVED_MARGIN + UNOBSERVED_MARGIN_PER_MESSAGE * shape.messages

    def image_tokens(self, shape: Shape) -> int:
        return math.ceil(shape.image_prior_tokens * self.image_scale)

    def tokens(self, shape: Shape) -> int:
        return self.text_tokens(shape) + self.image_tokens(shape) + self.safety_margin(shape)


def solve_linear(matrix: list[list[float]], vector: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting for the small, positive-definite ridge system."""
    n = len(vector)
    a = [row[:] + [vector[i]] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, n):
            factor = a[r][col] / a[col][col]
            for c in range(col, n + 1):
                a[r][c] -= factor * a[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (a[r][n] - sum(a[r][c] * x[c] for c in range(r + 1, n))) / a[r][r]
    return x


def fit_template(observations: Sequence[ExactObservation], prior: tuple[float, ...] = CHATML_PRIOR) -> Template:
    """The template's cost from reports (any order). Text-only reports fit the constants; reports
    with images then fit how many real tokens an area-priced image token is."""
    return _fit_template(tuple(observations), prior)


# Every size check fits the same newest reports again until a new one arrives: fitted once.
@functools.lru_cache(maxsize=256)
def _fit_template(observations: tuple[ExactObservation, ...], prior: tuple[float, ...]) -> Template:
    text = [o for o in observations if o.shape.images == 0 and o.tokens > 0 and o.shape.content_tokens > 0]
    coefficients = prior
    if text:
        k = len(prior)
        gram = [[RIDGE if i == j else 0.0 for j in range(k)] for i in range(k)]
        rhs = [RIDGE * p for p in prior]
        for o in text:
            x = o.shape.features()
            residual = o.tokens - o.shape.content_tokens
            for i in range(k):
                rhs[i] += x[i] * residual
                for j in range(k):
                    gram[i][j] += x[i] * x[j]
        coefficients = tuple(solve_linear(gram, rhs))
    fitted = Template(coefficients=coefficients)
    margin = max((o.tokens - fitted.text_tokens(o.shape) for o in text), default=None)
    if margin is not None:
        margin = min(margin, MAX_MARGIN)
    scales = [
        (o.tokens - fitted.text_tokens(o.shape)) / o.shape.image_prior_tokens
        for o in observations
        if o.shape.images and o.shape.image_prior_tokens > 0 and o.tokens > 0
    ]
    low, high = IMAGE_SCALE_BOUNDS
    # The largest recent scale: an image is never priced below what one was seen to cost.
    scale = min(high, max(low, max(scales))) if scales else 1.0
    return Template(
        coefficients=coefficients,
        margin=None if margin is None else max(0, margin),
        image_scale=scale,
        observed=len(text),
    )


def call_text(name: str, arguments_json: str) -> str:
    """A tool call as templates render it (a JSON object of name and arguments)."""
    return f'{{"name": "{name}", "arguments": {arguments_json or "{}"}}}'


def message_texts(message: Message) -> list[str]:
    return [message.content, *(call_text(c.name, c.arguments_json) for c in message.tool_calls)]


def scaled_count(tokens: int, counted_chars: int, chars: int) -> int:
    """A count made on part of a text, scaled up to the whole text's length."""
    if counted_chars >= chars or counted_chars <= 0:
        return tokens
    return math.ceil(tokens * chars / counted_chars)


def content_md5(message: Message) -> str:
    """What a stored count is tied to: the md5 of the content it was made from (as PostgreSQL's
    md5() of the row's content gives it)."""
    return hashlib.md5(message.content.encode()).hexdigest()


# A stored row's content tokens by the message object's identity, the object kept beside them so
# its id is not reused: for one request, whose rows are priced dozens of times and never changed (a
# cut or pruned message is a copy). Each read of a protobuf string field copies the string, and the
# copy's hash is computed anew: the lookup of a cached count cost as much as hashing the context.
# Only stored rows (seq > 0) are remembered: the summary inputs and trial cuts a request prices once
# would be kept alive by it, images and all.
Memo = dict[int, tuple[Message, int]]


def unmemoized(messages: Sequence[Message], memo: Memo | None) -> list[int]:
    """The indexes of ``messages`` whose tokens ``memo`` does not hold (all of them without one)."""
    if not memo:
        return list(range(len(messages)))
    return [i for i, m in enumerate(messages) if (known := memo.get(id(m))) is None or known[0] is not m]


def message_tokens(messages: Sequence[Message], counter: Counter, memo: Memo | None = None) -> list[int]:
    """Content tokens of each message (content plus each tool call), in one batch; what ``memo``
    holds is taken from it, and the stored rows counted are added to it."""
    if memo is None:
        return _message_tokens(messages, counter)
    todo = unmemoized(messages, memo)
    fresh = dict(zip(todo, _message_tokens([messages[i] for i in todo], counter)))
    memo.update((id(messages[i]), (messages[i], n)) for i, n in fresh.items() if messages[i].seq > 0)
    return [fresh[i] if i in fresh else memo[id(m)][1] for i, m in enumerate(messages)]


def _message_tokens(messages: Sequence[Message], counter: Counter) -> list[int]:
    if not messages:
        return []
    texts: list[str] = []
    spans: list[int] = []
    for m in messages:
        if m.tool_calls:
            parts = message_texts(m)
            texts.extend(parts)
            spans.append(len(parts))
        else:  # most messages: no call texts to build (this runs over the context dozens of times)
            texts.append(m.content)
            spans.append(1)
    counts = counter.counts(texts)
    out, at = [], 0
    for message, span in zip(messages, spans):
        content = counts[at]
        if message.sliced_from_chars:  # the size check got only its head and tail: scaled to its length
            content = scaled_count(content, len(message.content), message.sliced_from_chars)
        out.append(content + sum(counts[at + 1 : at + span]) if span > 1 else content)
        at += span
    return out


def shape_of(messages: Sequence[Message], tool_schemas: Sequence[str], counter: Counter, image_fallback: int) -> Shape:
    """The shape of a prompt made of ``messages`` (the view the model gets) and ``tool_schemas``."""
    return shape_from(messages, message_tokens(messages, counter), tool_schemas, counter, image_fallback)


def shape_from(
    messages: Sequence[Message],
    tokens: Sequence[int],
    tool_schemas: Sequence[str],
    counter: Counter,
    image_fallback: int,
) -> Shape:
    """The shape of a prompt whose messages' content tokens are ``tokens`` (``message_tokens`` of them)."""
    tool_results = tool_calls = 0
    images: list[bytes] = []
    for m in messages:
        if m.role == "tool":
            tool_results += 1
        if m.tool_calls:
            tool_calls += len(m.tool_calls)
        if m.images:
            images.extend(m.images)
    return Shape(
        content_tokens=sum(tokens) + (sum(counter.counts(list(tool_schemas))) if tool_schemas else 0),
        messages=len(messages),
        tool_results=tool_results,
        tool_calls=tool_calls,
        tools=len(tool_schemas),
        image_prior_tokens=sum(image_tokens(i, image_fallback) for i in images),
        images=len(images),
    )


# Room for the marker's own tokens ("\n[…truncated ~12345 tokens…]\n" is about a dozen).
MARKER_TOKENS = 16


@dataclass(frozen=True)
class CutPlan:
    """What a cut keeps of a content: the first ``head_tokens`` and last ``tail_tokens`` tokens,
    and the marker says ``removed`` tokens were left out."""

    head_tokens: int
    tail_tokens: int
    removed: int


def cut_plan(message: Message, tokens: int, budget: int, counter: Counter) -> CutPlan | None:
    """How a message of ``tokens`` content tokens is cut to ``budget``; None when it already fits
    or cutting cannot help."""
    if tokens <= budget:
        return None
    calls = sum(counter.counts(message_texts(message)[1:]))  # tool calls are never cut
    keep = budget - calls - MARKER_TOKENS
    if keep < 2:
        return None
    return CutPlan(keep - keep // 2, keep // 2, tokens - calls - keep)


def joined_cut(plan: CutPlan, head: str, tail: str) -> str:
    """The cut content: head, the marker, tail."""
    return head + truncation_marker(plan.removed) + tail


def cut_content(message: Message, tokens: int, budget: int, counter: Counter) -> str | None:
    """The content cut to head + marker + tail so the message costs at most ``budget`` content
    tokens; None when it already fits or cutting cannot help. Token boundaries, not a char rate,
    decide the cut, so the same message and budget always give the same view."""
    plan = cut_plan(message, tokens, budget, counter)
    if plan is None:
        return None
    head, tail = counter.head_and_tail(message.content, plan.head_tokens, plan.tail_tokens)
    return joined_cut(plan, head, tail)


def exact_view(
    messages: Sequence[Message],
    budget: int,
    counter: Counter,
    budgets: dict[int, int] | None = None,
) -> tuple[list[Message], dict[int, str]]:
    """The view the model is sent: every oversized assistant/tool message cut to ``budget`` content
    tokens (``budgets`` overrides it per index). Returns the view and the cut contents by index."""
    if budget <= 0 and not budgets:
        return list(messages), {}
    view, cuts, _ = counted_view(messages, budget, counter, budgets)
    return view, cuts


def counted_view(
    messages: Sequence[Message],
    budget: int,
    counter: Counter,
    budgets: dict[int, int] | None = None,
    memo: Memo | None = None,
) -> tuple[list[Message], dict[int, str], list[int]]:
    """``exact_view`` and the content tokens of each message of the view, as ``message_tokens`` of
    the view gives them (a message the view keeps whole is not counted twice; a cut one is its cut)."""
    if budget <= 0 and not budgets:
        return list(messages), {}, message_tokens(messages, counter, memo)
    # The contents that may be over their limit (a token is at least one of a char's <= 4 UTF-8
    # bytes) are counted first, told they may be cut; the count of the rest needs no offsets.
    limits = [budgets.get(i, budget) if budgets else budget for i in range(len(messages))]
    cuttable = [
        text
        for i in unmemoized(messages, memo)
        if limits[i] > 0 and messages[i].role in TRUNCATABLE_ROLES and 4 * len(text := messages[i].content) > limits[i]
    ]
    if cuttable:
        counter.counts(cuttable, for_cut=True)
    tokens = message_tokens(messages, counter, memo)
    view: list[Message] = []
    cuts: dict[int, str] = {}
    for index, (message, count, limit) in enumerate(zip(messages, tokens, limits)):
        content = None
        if limit > 0 and count > limit and message.role in TRUNCATABLE_ROLES:
            content = cut_content(message, count, limit, counter)
        if content is None:
            view.append(message)
            continue
        copy = with_content(message, content)
        copy.sliced_from_chars = 0  # the cut is whole text: its count is not scaled
        view.append(copy)
        cuts[index] = content
    view_tokens = list(tokens)
    if cuts:
        for index, n in zip(cuts, message_tokens([view[i] for i in cuts], counter)):
            view_tokens[index] = n
    return view, cuts, view_tokens

"""The summarizer's input: the messages to summarize as bounded plain text plus images.

Every cap here exists because an unbounded input to the summarizer overflows its own window,
gets silently truncated by Ollama, and comes back as a summary written as if the history had
been read. The last cap is the summary's own window: the request (prompt + input) is priced and
cut until it leaves room for the summary (see ``summary_window``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from palimpsest.compressor.summary_guess import RenderedCosts, block_rates, cut_guess
from palimpsest.compressor.summary_window import input_limit
from palimpsest.shared.context_view import largest_fitting
from palimpsest.shared.image_tokens import DEFAULT_FALLBACK_TOKENS, image_tokens
from palimpsest.v1.common_pb2 import Message

Estimator = Callable[[Sequence[Message]], int]

# Several old summaries past this many chars crowd the summarizer input: consolidate them first.
META_SUMMARY_THRESHOLD = 10_600
# A call's name and the start of its arguments say what was done; the rest is in the result.
TOOL_ARGS_PREVIEW_CHARS = 120
# Critical results (declared by the profile or flagged on the message) survive nearly whole.
CRITICAL_RESULT_MAX_CHARS = 4_000
CRITICAL_HEAD_CHARS = 2_000
CRITICAL_TAIL_CHARS = 2_000
# Other results: the start usually holds the status line and the answer's shape.
RESULT_PREVIEW_CHARS = 800
# Images may take a quarter of the summarizer's window; text needs the rest.
IMAGE_BUDGET_FRACTION = 0.25
# The formatted input's cap; 75% head keeps the oldest history, 25% tail the work closest to
# the kept window (a head-only cut silently dropped the newest summarized work).
MAX_SUMMARY_INPUT_CHARS = 32_000
HEAD_SHARE_PERCENT = 75

SUMMARY_PROMPT = """\
You condense an earlier part of a conversation between a user and an AI assistant that uses \
tools, so that the assistant can carry on the work without the original messages.

Write a concise bullet-point summary. Keep:
- what the user asked for and every decision taken, with its reason;
- facts established along the way: results, numbers, names, errors and how they were resolved;
- exact file paths, commands, configuration keys, identifiers and links;
- what is still open: unfinished tasks, next steps, questions waiting for an answer.
Leave out greetings, small talk and reasoning that led nowhere. Do not invent anything.

Finish with exactly one line of the form
KEYS: item, item, item
listing the names, commands, paths, config keys, amounts, tickets, decisions and links a reader \
would search for later."""

META_SUMMARY_PROMPT = """\
Below are several summaries of consecutive earlier parts of one conversation, oldest first. \
Merge them into one bullet-point summary that keeps every decision, fact, file path, command \
and open task, dropping only repetition. Where they disagree, the later summary wins."""

_KEYS_LINE = re.compile(r"^[ \t>*_\-•]*keys[*_]*\s*:[*_]*(?P<keys>.*)$", re.I | re.M)
# A comma separates keys unless it sits inside a number such as 1,000.
_KEY_SEPARATOR = re.compile(r"\s*(?:;|(?<!\d),|,(?!\d))\s*")
_EMPTY_KEYS = frozenset({"", "none", "n/a", "-", "—"})


@dataclass(frozen=True)
class SummaryInput:
    """What the summarizer is given: text, the images that fit, and how many were left out."""

    text: str
    images: list[bytes] = field(default_factory=list)
    omitted_images: int = 0
    omitted_chars: int = 0  # rendered history cut out (the text says so where it was cut)


def split_summaries(messages: Sequence[Message]) -> tuple[list[Message], list[Message]]:
    """(existing summaries, everything else), each in the given order."""
    summaries = [m for m in messages if m.is_summary]
    others = [m for m in messages if not m.is_summary]
    return summaries, others


def needs_meta_summary(messages: Sequence[Message]) -> bool:
    """True when several existing summaries together pass META_SUMMARY_THRESHOLD chars."""
    summaries, _ = split_summaries(messages)
    return len(summaries) >= 2 and sum(len(m.content) for m in summaries) > META_SUMMARY_THRESHOLD


# The search for a cut that fits: at most this many exact counts after the first. It aims a
# sixty-fourth under the limit (a guess that lands a little high still fits, where one aimed at the
# limit itself fell over it half the time and took a bisection of ~17 counts) and stops at the first
# cut that fits within a sixteenth of it.
SEARCH_STEPS = 4
AIM_DIVISOR = 64
ENOUGH_DIVISOR = 16


def omission_marker(chars: int) -> str:
    """Stands in for text cut out of the summarizer input."""
    return f"\n[… {chars} chars omitted …]\n"


def preview_arguments(arguments_json: str) -> str:
    """Tool-call arguments cut to TOOL_ARGS_PREVIEW_CHARS."""
    if len(arguments_json) <= TOOL_ARGS_PREVIEW_CHARS:
        return arguments_json
    return arguments_json[:TOOL_ARGS_PREVIEW_CHARS] + "…"


def critical_result_text(content: str) -> str:
    """Verbatim up to 4,000 chars; beyond that the first and last 2,000 around a marker."""
    if len(content) <= CRITICAL_RESULT_MAX_CHARS:
        return content
    omitted = len(content) - CRITICAL_HEAD_CHARS - CRITICAL_TAIL_CHARS
    return content[:CRITICAL_HEAD_CHARS] + omission_marker(omitted) + content[-CRITICAL_TAIL_CHARS:]


def result_preview(content: str) -> str:
    """The first RESULT_PREVIEW_CHARS chars of an ordinary tool result."""
    if len(content) <= RESULT_PREVIEW_CHARS:
        return content
    return content[:RESULT_PREVIEW_CHARS] + f"… [{len(content) - RESULT_PREVIEW_CHARS} more chars]"


def _is_critical(message: Message, critical_tools: frozenset[str]) -> bool:
    return message.is_compression_critical or (bool(message.name) and message.name in critical_tools)


def render_message(message: Message, critical_tools: frozenset[str] = frozenset()) -> str:
    """One message as a block of the summarizer's input (thinking is left out: it is not
    what was said or done, and it would double the input)."""
    if message.role == "tool":
        if _is_critical(message, critical_tools):
            body = critical_result_text(message.content)
        else:
            body = result_preview(message.content)
        label = f"Tool result ({message.name})" if message.name else "Tool result"
        lines = [f"{label}: {body}"]
    elif message.is_summary:
        lines = [f"Earlier summary: {message.content}"]
    else:
        lines = [f"{message.role.capitalize()}: {message.content}".rstrip()]
    for call in message.tool_calls:
        lines.append(f"  → {call.name}({preview_arguments(call.arguments_json)})")
    if message.images:
        lines.append(f"[+ {len(message.images)} image(s)]")
    return "\n".join(lines)


def cut_text(text: str, limit: int = MAX_SUMMARY_INPUT_CHARS) -> tuple[str, int]:
    """(``text`` within ``limit`` chars, marker included: 75% head, 25% tail; chars cut out)."""
    if len(text) <= limit:
        return text, 0
    room = max(0, limit - len(omission_marker(len(text))))  # the real count has no more digits
    head = room * HEAD_SHARE_PERCENT // 100
    tail = room - head
    omitted = len(text) - head - tail
    return text[:head] + omission_marker(omitted) + text[len(text) - tail :], omitted


def cap_text(text: str, limit: int = MAX_SUMMARY_INPUT_CHARS) -> str:
    """``text`` within ``limit`` chars (marker included): 75% head, 25% tail."""
    return cut_text(text, limit)[0]


def collect_images(
    messages: Sequence[Message], *, window: int, image_fallback: int = DEFAULT_FALLBACK_TOKENS
) -> tuple[list[bytes], int]:
    """Images in order while their priced total stays within window × 0.25; (kept, left out).

    Collection stops at the first image that does not fit, so what the summarizer sees is an
    unbroken stretch of history rather than a sample.
    """
    budget = window * IMAGE_BUDGET_FRACTION
    kept: list[bytes] = []
    spent = 0
    all_images = [image for m in messages for image in m.images]
    for image in all_images:
        cost = image_tokens(image, image_fallback)
        if spent + cost > budget:
            break
        kept.append(image)
        spent += cost
    return kept, len(all_images) - len(kept)


def summary_messages(prompt: str, text: str, images: Sequence[bytes] = ()) -> list[Message]:
    """The summary request: what is priced is exactly what is sent."""
    return [Message(role="system", content=prompt), Message(role="user", content=text, images=list(images))]


def fit_text(
    text: str,
    fits: Callable[[str], bool],
    price: Callable[[str], int] | None = None,
    limit: int = 0,
    guess: Callable[[int], int] | None = None,
) -> tuple[str, int]:
    """(``text`` cut as ``cut_text`` does, at MAX_SUMMARY_INPUT_CHARS and further until it ``fits``;
    chars cut out). ValueError when not even the omission marker alone fits.

    With ``price`` (what ``fits`` compares with ``limit``), the cut is found by proportional steps
    (a text's tokens grow about linearly with its chars) aimed a little under ``limit``: usually
    one count, where a bisection takes ~17. With ``guess`` (the price of the text cut to
    ``shortest + n`` chars, from rates already known), the first step is the guess's own answer,
    so the text is counted whole only when it is guessed to fit."""
    capped = cut_text(text)
    shortest = len(omission_marker(len(text)))  # head and tail empty: only the marker is left
    room = len(capped[0]) - shortest
    if price is not None and limit > 0:
        aim, enough = limit - limit // AIM_DIVISOR, limit - limit // ENOUGH_DIVISOR
        n = room
        if guess is not None and guess(room) > aim:
            n = max(0, largest_fitting(room, lambda k: guess(k) <= aim))  # arithmetic, no count
        best = -1
        for _ in range(1 + SEARCH_STEPS):
            candidate = cap_text(text, shortest + n)
            tokens = price(candidate)
            if tokens <= limit and fits(candidate):
                best = max(best, n)
                if n >= room or tokens >= enough:
                    break
            step = min(room, n * aim // max(1, tokens))
            n = step if step != n else n - 1 if tokens > limit else min(room, n + 1)
            if n < 0:
                break
        if best >= 0:
            return cut_text(text, shortest + best)
    elif fits(capped[0]):
        return capped
    extra = largest_fitting(room, lambda k: fits(cap_text(text, shortest + k)))
    if extra < 0:
        raise ValueError("the summary prompt alone fills the summary's window")
    return cut_text(text, shortest + extra)


def format_for_summary(
    messages: Sequence[Message],
    *,
    critical_tools: Iterable[str] = (),
    vision: bool,
    window: int,
    image_fallback: int = DEFAULT_FALLBACK_TOKENS,
    prompt: str = "",
    summary_max_tokens: int = 0,
    estimate: Estimator | None = None,
    costs: Callable[[Sequence[Message]], list[int]] | None = None,
) -> SummaryInput:
    """The summarizer's input for ``messages`` (call ``needs_meta_summary`` first).

    ``window`` is the summary call's num_ctx. With ``estimate`` (the pricing of the summarizer's
    model), the text is also cut until ``summary_messages(prompt, text, images)`` leaves room for
    ``summary_max_tokens`` of summary in that window (``summary_window.input_limit``); without it
    only the MAX_SUMMARY_INPUT_CHARS cap applies. ``costs`` (each message's own tokens, as that
    pricing counts them) guesses where the cut falls before anything is counted.
    """
    critical = frozenset(critical_tools)
    blocks = [render_message(m, critical) for m in messages]
    rendered = "\n\n".join(blocks)
    if vision:
        images, omitted = collect_images(messages, window=window, image_fallback=image_fallback)
    else:
        images, omitted = [], sum(len(m.images) for m in messages)
    if estimate is None:
        text, cut = cut_text(rendered)
    else:
        limit = input_limit(window, summary_max_tokens)
        # What each message costs a character (counted already): the first guess of the search.
        guess = None
        if costs is not None and len(rendered) > MAX_SUMMARY_INPUT_CHARS // 2:
            guess = cut_guess(
                RenderedCosts(blocks, block_rates(messages, costs(messages))),
                estimate(summary_messages(prompt, "", images)),
                omission_marker(len(rendered)),
                HEAD_SHARE_PERCENT,
                len(omission_marker(len(rendered))),
            )
        try:
            text, cut = fit_text(
                rendered,
                lambda t: estimate(summary_messages(prompt, t, images)) <= limit,
                lambda t: estimate(summary_messages(prompt, t, images)),
                limit,
                guess,
            )
        except ValueError:
            if not images:
                raise
            # Prompt and images alone leave no room for the history: the words matter more.
            images, omitted = [], omitted + len(images)
            text, cut = fit_text(
                rendered,
                lambda t: estimate(summary_messages(prompt, t)) <= limit,
                lambda t: estimate(summary_messages(prompt, t)),
                limit,
            )
    return SummaryInput(text=text, images=images, omitted_images=omitted, omitted_chars=cut)


def split_keys_line(text: str) -> tuple[str, list[str]]:
    """(summary without its last ``KEYS:`` line, the keys); (text, []) when there is none."""
    matches = list(_KEYS_LINE.finditer(text))
    if not matches:
        return text, []
    last = matches[-1]
    raw = last.group("keys").strip().strip("*_ ").rstrip(".")
    keys = [k.strip().strip("`") for k in _KEY_SEPARATOR.split(raw)]
    keys = [k for k in keys if k.lower() not in _EMPTY_KEYS]
    remaining = (text[: last.start()] + text[last.end() :]).strip("\n")
    return remaining.rstrip(), keys

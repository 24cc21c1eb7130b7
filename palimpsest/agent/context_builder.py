"""What the model sees on each call: the system prompt rebuilt from the current profile, an
optional memory message, the stored context (service records only from the allowlist), and the
turn's notes. Which oversized messages are cut, and how, is the Compressor's answer to the size
check (one owner of the view): ``apply_cuts`` puts it in place."""

from __future__ import annotations

import re
from collections.abc import Sequence

from palimpsest.agent.profiles import Profile
from palimpsest.agent.untrusted import fence, fence_overhead
from palimpsest.shared.context_view import TASK_NOTE, heuristic_tokens, reaches_model, with_content
from palimpsest.v1 import common_pb2, compressor_pb2

Message = common_pb2.Message


def note_messages(notes: Sequence[str]) -> list[Message]:
    """Notes as stored task notes: in the model's context where they were given, never shown.
    Sent only with one call, they made every later prompt differ from the one before at that
    place, and Ollama evaluated the rest of the prompt again."""
    out = []
    for note in notes:
        message = Message(role="system", content=note, explicit_flags=True, is_context=True, is_display=False)
        message.metadata["source"] = TASK_NOTE
        out.append(message)
    return out


def apply_cuts(messages: Sequence[Message], cuts: Sequence[compressor_pb2.ViewCut]) -> list[Message]:
    """The view the model is sent: the size check's cut contents in place (copies; stored rows are
    never changed)."""
    view = list(messages)
    for cut in cuts:
        if 0 <= cut.index < len(view):
            view[cut.index] = with_content(view[cut.index], cut.content)
    return view


class ContextBuilder:
    def __init__(self, persona: str) -> None:
        self.persona = persona
        self._system_prompts: dict[tuple[str, bool], str] = {}

    def system_prompt(self, profile: Profile, *, subagent: bool = False) -> str:
        """persona + profile prompt, cached per profile until the profile is reloaded."""
        key = (profile.id, subagent)
        if key not in self._system_prompts:
            own = profile.subagent_system_prompt if subagent else profile.system_prompt
            self._system_prompts[key] = f"{self.persona}\n---\n{own}" if own else self.persona
        return self._system_prompts[key]

    def invalidate(self, profile_id: str | None = None) -> None:
        if profile_id is None:
            self._system_prompts.clear()
        else:
            for key in [k for k in self._system_prompts if k[0] == profile_id]:
                del self._system_prompts[key]

    @staticmethod
    def build(system_prompt: str, context: Sequence[Message], memory: str = "") -> list[Message]:
        """The messages of one call, uncut (the size check says what to cut): the system prompt,
        the memory message when there is one, then the context as stored (task notes and recalled
        excerpts where they were given)."""
        head = [Message(role="system", content=system_prompt)]
        if memory:
            head.append(Message(role="system", content=memory))
        return [*head, *(m for m in context if reaches_model(m))]


MEMORY_HEADING = "## What I remember about the user"


def memory_message(entries: Sequence[str], max_tokens: int) -> str:
    """What the session holds of its owner's memory, as the model reads it: the entries oldest
    first under the heading, as many as fit ``max_tokens`` at the heuristic rate (the Agent holds
    no tokenizer; 1.8 chars a token over-counts prose); "" when there are none."""
    if not entries:
        return ""
    items = ["- " + "\n  ".join(text.splitlines()) for text in entries]
    whole = "\n".join([MEMORY_HEADING, *items])
    if heuristic_tokens(len(whole)) <= max_tokens:
        return whole
    lines = [MEMORY_HEADING]  # the oldest that fit, and a line saying how many did not
    for n, item in enumerate(items):
        if heuristic_tokens(len("\n".join([*lines, item, _left_out(len(items) - n - 1, max_tokens)]))) > max_tokens:
            break
        lines.append(item)
    return "\n".join([*lines, _left_out(len(items) - len(lines) + 1, max_tokens)])


def _left_out(count: int, max_tokens: int) -> str:
    return f"- ({count} more not shown: past the {max_tokens:,}-token budget of this message)"


def iteration_budget_note(iteration: int, max_iterations: int) -> str:
    remaining = max_iterations - iteration
    hurry = " Wrap up now: give your final answer." if remaining <= 2 else ""
    return f"[Iteration {iteration + 1} of {max_iterations}; {remaining - 1} left after this one.{hurry}]"


def goal_anchor_note(goal: str) -> str:
    return f"[Goal reminder — the task you are working on: {goal[:2000]}]"


def anti_stall_note(iterations: int) -> str:
    return (
        f"[Warning: {iterations} iterations without progress on the todo list. You may be looping. "
        "Step back: check what is blocking you, update the todo, or give the user your best answer.]"
    )


# Recalled excerpts take at most a sixteenth of the window (a quarter of the room the default
# trigger and target leave between compressions), priced at two characters a token (dense logs
# run about that; prose is cheaper). At 2,000 characters each, two excerpts of dense logs took
# 2,200 tokens of an 8,192 window right after a compression, and brought the next one within a
# turn or two.
RECALL_WINDOW_SHARE = 16
RECALL_CHARS_PER_TOKEN = 2
EXCERPT_MAX_CHARS = 2_000
RECALL_HEADING = "## Recalled from earlier in this conversation (verbatim excerpts)"
RECALL_SOURCE = "memory recall"
MIN_EXCERPT_CHARS = 200  # less says too little to be worth a place in the prompt


def recall_chars(window: int) -> int:
    """What the recalled excerpts in the context may hold together, in characters."""
    return window // RECALL_WINDOW_SHARE * RECALL_CHARS_PER_TOKEN


def excerpt(content: str, query: str, limit: int) -> str:
    """At most ``limit`` characters of ``content``, around the first place a word of the query
    (the longest first: the rarest, as a rule) appears; its beginning when none does. Cut ends
    are marked with an ellipsis."""
    if len(content) <= limit:
        return content
    lowered = content.lower()
    words = sorted({w for w in re.findall(r"\w{3,}", query.lower())}, key=len, reverse=True)
    at = next((i for i in (lowered.find(w) for w in words) if i >= 0), 0)
    start = max(0, min(at - limit // 4, len(content) - limit))
    text = content[start : start + limit]
    return ("…" if start else "") + text + ("…" if start + limit < len(content) else "")


def _label(chunk: common_pb2.RawChunk) -> str:
    return f"[messages {chunk.turn_range.first}–{chunk.turn_range.last}]\n"


def recall_overhead(chunks: Sequence[common_pb2.RawChunk], untrusted: bool) -> int:
    """The characters of a recall message that are not excerpts: the heading, each label, the
    separators and the two ellipses an excerpt may get (and each fence, for a tainted session)."""
    fences = len(chunks) * fence_overhead(RECALL_SOURCE) if untrusted else 0
    return len(RECALL_HEADING) + sum(len(_label(c)) + 2 + 2 for c in chunks) + fences


def fitting_chunks(chunks: Sequence[common_pb2.RawChunk], max_chars: int, untrusted: bool) -> list[common_pb2.RawChunk]:
    """The most leading ``chunks`` whose excerpts each get MIN_EXCERPT_CHARS of ``max_chars`` once
    the message's own overhead is paid. Counting the excerpts by the budget alone let a small
    window's recall (512 characters at 4,096, two fences of about 200) carry a dozen characters of
    history in 150 tokens of heading and fences."""
    for n in range(len(chunks), 0, -1):
        if (max_chars - recall_overhead(chunks[:n], untrusted)) // n >= MIN_EXCERPT_CHARS:
            return list(chunks[:n])
    return []


def recall_message(
    chunks: Sequence[common_pb2.RawChunk],
    query: str = "",
    max_chars: int = 2 * EXCERPT_MAX_CHARS + 200,
    *,
    untrusted: bool = False,
) -> Message:
    """Excerpts of compressed-away history, recalled because they match the new request: stored
    in the context just before it (is_recall), never shown; at most ``max_chars`` in all.
    ``untrusted``: the session has taken in outside content, and each excerpt is fenced as such."""
    labels = [_label(c) for c in chunks]
    each = min(EXCERPT_MAX_CHARS, (max_chars - recall_overhead(chunks, untrusted)) // max(1, len(chunks)))
    excerpts = [excerpt(c.content, query, each) for c in chunks]
    if untrusted:
        excerpts = [fence(text, RECALL_SOURCE) for text in excerpts]
    parts = [RECALL_HEADING] + [label + text for label, text in zip(labels, excerpts)]
    return Message(
        role="system",
        content="\n\n".join(parts),
        is_recall=True,
        explicit_flags=True,
        is_context=True,
        is_display=False,
    )

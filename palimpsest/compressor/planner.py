"""The one compression plan: what to summarize, what to keep verbatim.

WouldCompress (the dry run) and Compress both call ``plan_compression``, so the prediction and
the real compression can never drift apart. The plan only partitions; summarizing is elsewhere.

Vocabulary:
- a *turn* is a user message (not a summary) and every following message up to the next one;
  messages before the first user message form a turn of their own (the oldest);
- a *tool group* is an assistant message with tool calls plus the tool results right after it;
  it is never split, because a tool result without its call is rejected by chat templates;
- *system* messages (stored service records) are always kept, first (task notes and recalled
  excerpts aside: they go with their turn);
- existing *summaries* always go into ``to_summarize`` when anything is summarized, so a
  compression leaves exactly one live summary however many there were.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Sequence

from palimpsest.compressor.prefilter import Needs, has_digit, may_match
from palimpsest.shared.context_view import is_transient
from palimpsest.v1.common_pb2 import Message

Estimator = Callable[[list[Message]], int]

# Keeping only the newest request and its last call + result is the least that lets the model
# continue a tool loop; below that there is nothing left to continue from.
MIN_RECENT_MESSAGES = 2
# Mid-turn, a long tool loop keeps at least this many of its newest messages verbatim.
INTRA_TURN_MIN_KEEP = 12


def intra_turn_keep(keep_recent_turns: int) -> int:
    """Messages an intra-turn compression keeps: twice the turns kept, at least a dozen."""
    return max(INTRA_TURN_MIN_KEEP, 2 * keep_recent_turns)


# Importance scores (a plain turn scores BASE_IMPORTANCE). An old turn at least IMPORTANT_AT_LEAST
# may displace a kept turn at most FILLER_AT_MOST: a plain turn never displaces another.
BASE_IMPORTANCE = 1.0
FILLER_IMPORTANCE = 0.2
IMPORTANT_AT_LEAST = 2.0
FILLER_AT_MOST = 0.5
USER_MARKED_BONUS = 2.0  # the user said so: the strongest signal there is
CRITICAL_RESULT_BONUS = 2.0  # a result the profile declared must survive compression
ERROR_BONUS = 1.5  # what failed and why is what a summary most often blurs
DECISION_BONUS = 1.0
REFERENCE_BONUS = 0.5  # file paths, ticket ids, hashes: cheap to keep, costly to reinvent
# An acknowledgement turn longer than this carries content after all.
FILLER_MAX_CHARS = 200

_ACKNOWLEDGEMENTS = frozenset(
    {
        "ok",
        "okay",
        "k",
        "kk",
        "thanks",
        "thank you",
        "thx",
        "ty",
        "cool",
        "great",
        "nice",
        "yes",
        "no",
        "sure",
        "got it",
        "fine",
        "good",
        "perfect",
        "yep",
        "nope",
        "alright",
        "👍",
        "ok thanks",
        "ok, thanks",
        "thanks!",
        "great, thanks",
    }
)
_USER_MARKED = re.compile(
    r"\b(important|remember( this| that)?|don'?t forget|do not forget|keep in mind|note that)\b", re.I
)
_ERROR = re.compile(r"\b(error|errors|exception|traceback|failed|failure|fatal|panic)\b", re.I)
_DECISION = re.compile(r"\b(decided|decision|we will|we'll go with|let'?s go with|agreed|chose|settled on)\b", re.I)
# Concrete references (a path, a ticket, an issue number, a commit hash), each with what a text
# must hold before it is run (prefilter): together they took 10 ms over 60,000 characters of prose
# that held none of them.
_REFERENCES: tuple[tuple[re.Pattern[str], Needs], ...] = (
    (
        re.compile(
            r"(?:^|[\s(\"'`])(?:~|\.{1,2})?/[\w.\-]+/[\w.\-/]*"  # /a/b, ./x/y, ~/z/w
            r"|\b[\w.\-]+/[\w.\-/]*\.\w{1,8}\b"  # src/app.py
        ),
        ("/",),
    ),
    (re.compile(r"\b[A-Z][A-Z0-9]+-\d+\b"), ("-",)),  # ABC-123
    (re.compile(r"(?<![\w&])#\d+\b"), ("#",)),  # #123
    (re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,64}\b"), has_digit),  # commit hashes
)


def has_reference(text: str) -> bool:
    """Whether ``text`` names a path, a ticket, an issue number or a commit hash."""
    return any(may_match(needs, text) and pattern.search(text) is not None for pattern, needs in _REFERENCES)


@dataclass(frozen=True)
class Plan:
    """A partition of a context: the new context is system + [summary] + to_keep."""

    to_summarize: list[Message]
    to_keep: list[Message]
    system: list[Message]
    # "turns", "messages" (intra-turn) or "none": for logs and events, never for decisions.
    mode: str = "none"
    kept_turns: int = field(default=0)

    @property
    def is_empty(self) -> bool:
        """Nothing to summarize: compressing would change nothing."""
        return not self.to_summarize

    @property
    def replaced_range(self) -> tuple[int, int] | None:
        """(first seq, last seq) of the summarized messages, for the summary's ``replaces``."""
        if not self.to_summarize:
            return None
        # An older summary stands for the range it replaced, so the new one starts where that began.
        firsts = [m.replaces.first if m.is_summary and m.HasField("replaces") else m.seq for m in self.to_summarize]
        return min(firsts), max(m.seq for m in self.to_summarize)


def is_turn_start(message: Message) -> bool:
    """A user message that is not a summary opens a turn."""
    return message.role == "user" and not message.is_summary


# However much else the prompt carries, the kept region may take this share of the window.
MIN_KEPT_SHARE = 0.1


def kept_always(message: Message) -> bool:
    """Stored service records stay through every compression; task notes and recalled excerpts,
    though system messages, go with the turn they were given in."""
    return message.role == "system" and not is_transient(message)


def split_turns(messages: Sequence[Message]) -> list[list[Message]]:
    """Turns in order; leading messages before any user message form the first turn."""
    turns: list[list[Message]] = []
    for message in messages:
        if is_turn_start(message) or not turns:
            turns.append([message])
        else:
            turns[-1].append(message)
    return turns


def tool_groups(messages: Sequence[Message]) -> list[list[Message]]:
    """Indivisible units: an assistant with tool calls and the tool results right after it."""
    units: list[list[Message]] = []
    for message in messages:
        joins_call = bool(
            message.role == "tool" and units and units[-1][0].role == "assistant" and len(units[-1][0].tool_calls) > 0
        )
        if joins_call:
            units[-1].append(message)
        else:
            units.append([message])
    return units


def _is_acknowledgement(turn: Sequence[Message]) -> bool:
    request = turn[0]
    if not is_turn_start(request):
        return False
    text = request.content.strip().lower().rstrip("!. ")
    if text not in _ACKNOWLEDGEMENTS:
        return False
    if any(m.tool_calls or m.role == "tool" or m.images for m in turn):
        return False
    return sum(len(m.content) for m in turn) <= FILLER_MAX_CHARS


def marked_important(message: Message) -> bool:
    if message.metadata.fields.get("important") is not None:
        value = message.metadata.fields["important"]
        if value.WhichOneof("kind") == "bool_value":
            return value.bool_value
    return message.role == "user" and bool(_USER_MARKED.search(message.content))


def turn_importance(turn: Sequence[Message], critical_tools: Iterable[str] = ()) -> float:
    """How much a turn deserves to stay verbatim: higher for errors, decisions, critical results,
    user-marked content and concrete references; FILLER_IMPORTANCE for a bare acknowledgement."""
    if not turn:
        return 0.0
    if _is_acknowledgement(turn):
        return FILLER_IMPORTANCE
    critical = set(critical_tools)
    score = BASE_IMPORTANCE
    if any(marked_important(m) for m in turn):
        score += USER_MARKED_BONUS
    if any(m.role == "tool" and (m.is_compression_critical or m.name in critical) for m in turn):
        score += CRITICAL_RESULT_BONUS
    texts = [m.content for m in turn] + [c.arguments_json for m in turn for c in m.tool_calls]
    if any(_ERROR.search(t) for t in texts if t):
        score += ERROR_BONUS
    if any(_DECISION.search(m.content) for m in turn if m.role != "tool"):
        score += DECISION_BONUS
    if any(has_reference(t) for t in texts if t):
        score += REFERENCE_BONUS
    return score


def _flatten(turns: Iterable[Sequence[Message]]) -> list[Message]:
    return [m for turn in turns for m in turn]


def _in_order(context: Sequence[Message], chosen: Iterable[Message]) -> list[Message]:
    """``chosen`` in context order (identity, not equality: two rows may compare equal)."""
    ids = {id(m) for m in chosen}
    return [m for m in context if id(m) in ids]


def widen_kept(plan: Plan) -> Plan:
    """The plan a summarizer's retry runs: the newer half of what was to be summarized is kept
    verbatim instead (a wider keep window), so the retry asks less of the model than the call that
    failed. Split by whole turns, or by tool-call groups within one long turn; the plan as it was
    when what it summarizes cannot be split so."""
    turns = split_turns(plan.to_summarize)
    if len(turns) > 1:
        units = turns
    elif plan.to_summarize and not is_turn_start(plan.to_summarize[0]):  # the middle of one long turn
        units = tool_groups(plan.to_summarize)
    else:  # one whole turn: its request is not kept without its answer
        return plan
    if len(units) < 2:
        return plan
    older = (len(units) + 1) // 2
    moved = [m for unit in units[older:] for m in unit]
    return replace(
        plan,
        to_summarize=[m for unit in units[:older] for m in unit],
        to_keep=sorted([*moved, *plan.to_keep], key=lambda m: m.seq),
        kept_turns=plan.kept_turns + (len(units) - older if units is turns else 0),
    )


def apply_plan(plan: Plan, summary: Message | None) -> list[Message]:
    """The context after compression: system + [summary] + to_keep (no summary: just dropped)."""
    if plan.is_empty or summary is None:
        return list(plan.system) + list(plan.to_keep)
    return list(plan.system) + [summary] + list(plan.to_keep)


class _Partitioner:
    """Holds the pieces of one planning call so the modes stay short."""

    def __init__(
        self,
        context: Sequence[Message],
        window: int,
        target: float,
        estimate: Estimator,
        critical_tools: Iterable[str],
        reserve: int = 0,
    ) -> None:
        self.context = list(context)
        self.system = [m for m in self.context if kept_always(m)]
        self.summaries = [m for m in self.context if not kept_always(m) and m.is_summary]
        body = [m for m in self.context if not kept_always(m) and not m.is_summary]
        self.turns = split_turns(body)
        # What the kept region may cost: the target less what the prompt carries besides the stored
        # context (system prompt, tool schemas) and the new summary, so the prompt after the
        # compression is at the target, not above it and a few messages from the next one.
        self.budget = max(target * window - reserve, MIN_KEPT_SHARE * window)
        self.estimate = estimate
        self.critical_tools = tuple(critical_tools)

    def fits(self, kept: Sequence[Message]) -> bool:
        return self.estimate(self.system + list(kept)) <= self.budget

    def plan(self, summarize: Iterable[Message], keep: Iterable[Message], mode: str, kept_turns: int) -> Plan:
        return Plan(
            to_summarize=_in_order(self.context, list(self.summaries) + list(summarize)),
            to_keep=_in_order(self.context, keep),
            system=list(self.system),
            mode=mode,
            kept_turns=kept_turns,
        )

    def empty(self) -> Plan:
        rest = [m for m in self.context if not kept_always(m)]
        return Plan(to_summarize=[], to_keep=rest, system=list(self.system), mode="none")

    def only_summaries(self) -> Plan:
        """Two or more live summaries and nothing else to do: merge them (legacy sessions)."""
        if len(self.summaries) < 2:
            return self.empty()
        return self.plan([], _flatten(self.turns), "summaries", len(self.turns))

    # -- turn mode ------------------------------------------------------------------------
    def kept_turn_indices(self, keep_recent: int) -> list[int]:
        n = len(self.turns)
        k = max(1, min(keep_recent, n))
        while k > 1 and not self.fits(_flatten(self.turns[n - k :])):
            k -= 1
        return self.swap_important(list(range(n - k, n)))

    def swap_important(self, kept: list[int]) -> list[int]:
        """Swap important old turns in for filler kept ones; the newest turn never leaves."""
        newest = len(self.turns) - 1
        score = {i: turn_importance(self.turns[i], self.critical_tools) for i in kept}
        fillers = sorted((i for i in kept if i != newest and score[i] <= FILLER_AT_MOST), key=lambda i: (score[i], i))
        if not fillers:  # nothing to swap out: spare scoring the whole history (O(history) regexes)
            return kept
        kept_set = set(kept)
        score.update(
            {i: turn_importance(t, self.critical_tools) for i, t in enumerate(self.turns) if i not in kept_set}
        )
        old = sorted(
            (i for i in range(len(self.turns)) if i not in kept_set and score[i] >= IMPORTANT_AT_LEAST),
            key=lambda i: (-score[i], -i),
        )
        for candidate in old:
            if not fillers:
                break
            trial = sorted(set(kept) - {fillers[0]} | {candidate})
            if self.fits(_flatten(self.turns[i] for i in trial)):
                kept = trial
                fillers.pop(0)
        return kept

    def turn_plan(self, keep_recent: int) -> Plan:
        kept = self.kept_turn_indices(keep_recent)
        summarize = [self.turns[i] for i in range(len(self.turns)) if i not in kept]
        if not summarize:
            return self.empty()
        return self.plan(_flatten(summarize), _flatten(self.turns[i] for i in kept), "turns", len(kept))

    # -- intra-turn mode ------------------------------------------------------------------
    def intra_cut(self, rest: Sequence[Message], keep_messages: int) -> int:
        """How many of ``rest`` to summarize so the newest ``keep_messages`` stay, never
        splitting a tool group (the cut moves earlier, to the group's call)."""
        cut = len(rest) - max(1, keep_messages)
        if cut <= 0:
            return 0
        start = 0
        for unit in tool_groups(rest):
            if start + len(unit) > cut:
                return start
            start += len(unit)
        return cut

    def intra_plan(self, keep_messages: int) -> Plan | None:
        newest = self.turns[-1]
        request = newest[:1] if is_turn_start(newest[0]) else []
        rest = newest[len(request) :]

        def plan_for(n: int) -> Plan | None:
            cut = self.intra_cut(rest, n)
            if cut <= 0:
                return None
            summarize = _flatten(self.turns[:-1]) + list(rest[:cut])
            return self.plan(summarize, list(request) + list(rest[cut:]), "messages", 1)

        found = plan_for(keep_messages)
        if found is None:
            # Nothing older than the newest N: retry keeping only the last call and its result.
            return plan_for(MIN_RECENT_MESSAGES) if keep_messages > MIN_RECENT_MESSAGES else None
        n = keep_messages
        while not self.fits(found.to_keep) and n > MIN_RECENT_MESSAGES:
            n -= 1
            found = plan_for(n) or found
        return found


def plan_compression(
    context: Sequence[Message],
    *,
    keep_recent: int,
    window: int,
    target: float,
    estimate: Estimator,
    keep_recent_messages: int | None = None,
    critical_tools: Iterable[str] = (),
    reserve: int = 0,
) -> Plan:
    """Partition ``context`` (the LLM context, seq order) into to_summarize / to_keep / system.
    ``reserve``: tokens of the prompt the kept region shares the target with (see _Partitioner).

    Turn mode keeps the newest ``keep_recent`` turns, shrinking that number (down to 1) until the
    kept region fits ``target × window`` by ``estimate``, then swaps important old turns in for
    filler kept ones. Intra-turn mode keeps the newest turn's request plus its newest
    ``keep_recent_messages`` messages and summarizes everything older; it runs when
    ``keep_recent_messages`` is set and the newest turn alone exceeds the target, or when turn
    mode finds nothing (then with ``keep_recent_messages`` or 2). An unsplittable context gives
    an empty plan, never an error.
    """
    parts = _Partitioner(context, window, target, estimate, critical_tools, reserve)
    if not parts.turns:
        return parts.only_summaries()
    turn_plan = parts.turn_plan(keep_recent)
    newest_too_big = keep_recent_messages is not None and not parts.fits(parts.turns[-1])
    if turn_plan.is_empty or newest_too_big:
        intra = parts.intra_plan(keep_recent_messages or MIN_RECENT_MESSAGES)
        if intra is not None:
            return intra
    if turn_plan.is_empty:
        return parts.only_summaries()
    return turn_plan


def freed_tokens(plan: Plan, estimate: Estimator, *, summary_tokens: int = 0) -> int:
    """What applying ``plan`` frees of the stored context (0 or less: nothing), ``summary_tokens``
    being the expected size of the new summary (0 when unknown). Re-summarizing a lone existing
    summary is not progress: 0."""
    if plan.is_empty:
        return 0
    summaries = sum(1 for m in plan.to_summarize if m.is_summary)
    if summaries == len(plan.to_summarize) and summaries < 2:
        return 0
    before = estimate(plan.system + plan.to_summarize + plan.to_keep)
    return before - estimate(plan.system + plan.to_keep) - max(0, summary_tokens)


def would_compress(plan: Plan, estimate: Estimator, *, summary_tokens: int = 0) -> bool:
    """True only when applying ``plan`` would shrink the stored context."""
    return freed_tokens(plan, estimate, summary_tokens=summary_tokens) > 0

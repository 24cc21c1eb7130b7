"""A compression's two stages, sharing the work: pruning first (old tool results and call
arguments, older iterations of the current turn), then a summary of only what remains over the
target. Pruning that frees a few thousand tokens used to be thrown away whenever it did not
reach the target alone, and the summary then evicted (and the model re-read) more than it needed.

Pure: the servicer decides from a ``Staged`` and commits the ``Outcome`` it becomes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from palimpsest.compressor import pipeline
from palimpsest.compressor.breadcrumbs import entity_source, extract_entities, merge_breadcrumbs
from palimpsest.compressor.planner import Plan, apply_plan, is_turn_start, kept_always, split_turns, widen_kept
from palimpsest.compressor.pricing import Knobs, Pricing
from palimpsest.compressor.pruning import (
    PRUNED_AT_TURN_END,
    PRUNED_FROM,
    PRUNED_TOKENS,
    Pruning,
    plan_pruning,
    preview,
    prose_prunable,
    protected,
    prunable,
    recent_turns,
)
from palimpsest.compressor.summarizer import Prefix, Summarizer, condensed_tokens
from palimpsest.compressor.summary_format import META_SUMMARY_THRESHOLD
from palimpsest.compressor.summary_prefix import scope_of
from palimpsest.compressor.summary_window import summary_length
from palimpsest.compressor.token_estimate import trigger_tokens
from palimpsest.shared.context_view import is_task_note, is_transient, recalled_before
from palimpsest.shared.prose_weight import PROSE_KEEP_TURNS, PruneSizes, prune_sizes
from palimpsest.v1 import common_pb2
from palimpsest.v1 import compressor_pb2 as pb

log = logging.getLogger("palimpsest.compressor")

Message = common_pb2.Message

NO_PRUNING = Pruning(pruned=[], previews=[])
# Room kept after a compression: this many turns of the conversation's own size (a compression
# within 3 turns of the last is a re-fire; 4, not 3: turns vary), measured over its newest GROWTH_TURNS.
HEADROOM_TURNS = 4
GROWTH_TURNS = 6
MIN_TARGET = 0.05
SUMMARY_HEADER = "[Summary of the earlier conversation"


@dataclass(frozen=True)
class Staged:
    """What pruning replaces, and the summary plan over the context it leaves."""

    pruning: Pruning
    context: list[Message]  # after pruning: each preview stands with its original's seq
    freed: int  # tokens pruning frees of the context
    plan: Plan  # over ``context``
    reaches_target: bool  # pruning alone brings the prompt to the target
    pruned_stage: bool  # whether pruning was allowed (not for a forced compaction)


def standing(preview: Message) -> Message:
    """A preview as it stands in the context while planning: with its original's seq, so the plan's
    order, ranges and kept set name the rows they will be."""
    out = Message()
    out.CopyFrom(preview)
    out.seq = preview.replaces.first
    return out


def pruned_tokens(preview: Message) -> int:
    """What the message a preview stands for cost the prompt (0 when the preview does not say)."""
    value = preview.metadata[PRUNED_TOKENS] if PRUNED_TOKENS in preview.metadata else 0
    return int(value) if isinstance(value, (int, float)) else 0


def recent_complete_turns(context: list[Message]) -> list[list[Message]]:
    """The newest GROWTH_TURNS complete turns (the newest alone when there is no other)."""
    turns = split_turns([m for m in context if not kept_always(m) and not m.is_summary])
    return turns[-GROWTH_TURNS - 1 : -1] or turns[-1:]


def unpruned(message: Message, pricing: Pricing) -> int:
    """What pruning took off a preview's original (0 for any other message)."""
    return max(0, pruned_tokens(message) - pricing.added([message])) if PRUNED_TOKENS in message.metadata else 0


def turn_growth(context: list[Message], pricing: Pricing) -> float:
    """What a turn of this conversation adds to the prompt, on average over its newest complete
    turns: each as the model was first sent it (a result pruned since at its size then), but a
    result pruned when its turn ended at its preview's size (that turn's spike, not lasting growth)."""
    recent = recent_complete_turns(context)
    if not recent:
        return 0.0
    messages = [m for turn in recent for m in turn]
    lasting = sum(unpruned(m, pricing) for m in messages if PRUNED_AT_TURN_END not in m.metadata)
    return (pricing.added(messages) + lasting) / len(recent)


def turn_spike(context: list[Message], pricing: Pricing) -> int:
    """The most a recent turn's results added while it ran, pruned in that turn (at its end, or by
    a compression within it): room the next compression must leave once, not for every turn."""
    recent = recent_complete_turns(context)
    return max(
        (sum(unpruned(m, pricing) for m in turn if PRUNED_AT_TURN_END in m.metadata) for turn in recent), default=0
    )


def headroom_level(context: list[Message], pricing: Pricing, knobs: Knobs, window: int) -> float:
    """The share of the window a compression must bring the prompt under so that HEADROOM_TURNS
    more turns of this conversation's usual size fit before the trigger (and its largest turn's
    results, where results are pruned when their turn ends)."""
    trigger = trigger_tokens(knobs.threshold, window, knobs.output_reserve)
    return (trigger - HEADROOM_TURNS * turn_growth(context, pricing) - turn_spike(context, pricing)) / window


def stage(
    context: list[Message],
    pricing: Pricing,
    knobs: Knobs,
    window: int,
    keep_recent_messages: int,
    prompt_tokens: int,
    prune: bool,
) -> Staged:
    """Prune (when ``prune``), then plan the summary over what is left, at the prompt's size less
    what pruning freed. Either stage aims below the level that leaves HEADROOM_TURNS of room."""
    level = headroom_level(context, pricing, knobs, window)
    deep = max(MIN_TARGET, min(pipeline.summary_target(knobs, window), level))
    kept = protected(context)
    sizes = prune_sizes(window)
    pruning = (
        plan_pruning(context, kept, knobs.critical_tools, recent_turns(context, PROSE_KEEP_TURNS), sizes)
        if prune
        else NO_PRUNING
    )
    if not pruning.pruned:
        plan = pipeline.make_plan(context, pricing, knobs, window, keep_recent_messages, prompt_tokens, deep)
        return Staged(pruning, context, 0, plan, False, prune)
    freed = _freed(pruning, pricing)
    current = {m.seq for m in recent_turns(context, 1)}  # results pruned in their own turn: a spike
    for original, stand_in in zip(pruning.pruned, pruning.previews):
        if original.seq in current and original.role == "tool":
            stand_in.metadata[PRUNED_AT_TURN_END] = True
    by_seq = {p.replaces.first: standing(p) for p in pruning.previews}
    pruned = [by_seq.get(m.seq, m) for m in context]
    after = max(0, prompt_tokens - freed)
    # Pruning alone must leave the same room, but never has to go deeper than a summary would:
    # where turns are mostly tool output the level is out of reach, and a summary every time
    # would cost the LLM calls pruning is there to save. The room is judged after the turn under
    # way, whose results go when it ends.
    reaches = (
        after - pending_spike(context, kept, pricing, knobs, sizes)
        <= min(pipeline.effective_target(knobs, window), max(level, pipeline.summary_target(knobs, window))) * window
    )
    plan = pipeline.make_plan(pruned, pricing, knobs, window, keep_recent_messages, after, deep)
    return Staged(pruning, pruned, freed, plan, reaches, prune)


def pending_spike(
    context: list[Message], kept: list[Message], pricing: Pricing, knobs: Knobs, sizes: PruneSizes
) -> int:
    """What pruning at its end will take off the turn under way (its results a compression keeps),
    where this session's results are pruned as turns end (its previews say so); else 0."""
    if not any(PRUNED_AT_TURN_END in m.metadata for m in context):
        return 0
    results = [m for m in kept if prunable(m, set(), knobs.critical_tools, sizes)]
    return sum(max(0, pricing.added([m]) - pricing.added([preview(m, knobs.critical_tools, sizes)])) for m in results)


def turn_end_pruning(
    context: list[Message], pricing: Pricing, knobs: Knobs, window: int, next_prompt_tokens: int = 0
) -> Pruning | None:
    """At a turn's end: its tool results and long call arguments (and any older ones left) replaced
    by previews, its request and final answer kept; and the long requests and answers older than
    the newest PROSE_KEEP_TURNS turns condensed. Inside a tool loop (the newest message a result, or
    the plan a tool call of the batch made): the loop's older iterations, before the next call, the
    newest call's results kept for the call that reads them, and no prose (the answer the user is
    replying to stays whole while the loop works on it). Each part only when it frees ``min_freed`` of the
    window (None when neither does, or pruning is off): the results change only the prompt's tail,
    prose the turns after it, which the next call then evaluates again. Inside a loop whose next
    prompt (``next_prompt_tokens``, the size check's count; 0 when not counted) reaches the trigger,
    the excerpts recalled for its request go too when that is what keeps it under (``shed_recall``)."""
    if not knobs.prune_tool_results:
        return None
    turns = split_turns([m for m in context if not kept_always(m)])
    if not turns:
        return None
    newest = turns[-1]
    last = newest[-1]
    # A plan message (the plan tool's, stored after its batch's results) does not end the turn.
    over = last.role == "assistant" and not last.tool_calls and not last.is_plan
    if over:  # the turn is over: its request and answer stay
        kept = [newest[0], last] if is_turn_start(newest[0]) else [last]
    else:  # a tool loop goes on: its older iterations go, the newest call's results stay
        kept = protected(context)
    gate = max(1, knobs.min_freed * window)
    sizes = prune_sizes(window)
    results = plan_pruning(context, kept, knobs.critical_tools, sizes=sizes)
    for stand_in in results.previews:
        stand_in.metadata[PRUNED_AT_TURN_END] = True
    recent = {m.seq for m in recent_turns(context, PROSE_KEEP_TURNS)}
    old_prose = [m for m in context if prose_prunable(m, recent, sizes)] if over else []  # not inside a loop
    prose = Pruning(old_prose, [preview(m, sizes=sizes) for m in old_prose])
    freed = [(part, _freed(part, pricing)) for part in (results, prose) if part.pruned]
    parts = [part for part, tokens in freed if tokens >= gate]
    running = None if over or not is_turn_start(newest[0]) else newest[0].seq
    pairs = sorted(((m, p) for part in parts for m, p in zip(part.pruned, part.previews)), key=lambda mp: mp[0].seq)
    pruning = (
        Pruning([m for m, _ in pairs], [p for _, p in pairs], spent(context, pairs[0][0].seq, running))
        if pairs
        else None
    )
    if running is not None and next_prompt_tokens > 0:
        spent_notes = pricing.added(pruning.dropped) if pruning is not None and pruning.dropped else 0
        after = next_prompt_tokens - sum(tokens for _, tokens in freed if tokens >= gate) - spent_notes
        pruning = shed_recall(context, pruning, running, after, pricing, knobs, window)
    return pruning


def shed_recall(
    context: list[Message],
    pruning: Pruning | None,
    running: int,
    prompt_tokens: int,
    pricing: Pricing,
    knobs: Knobs,
    window: int,
) -> Pruning | None:
    """``pruning`` with the excerpts recalled for the request at seq ``running`` left out too, when
    the next prompt (``prompt_tokens``, after ``pruning``) reaches the trigger and would stay under it
    without them; else ``pruning`` as it was. A loop's prompt just over the trigger otherwise ends
    in a summary of the whole history (bench compaction, 4,096 with loops: 20 tokens over it, with
    141 of recall, began a chain of 2 re-fires in 21 compressions). The excerpts served the
    request's first call and stay in memory_search; the next call evaluates again only from them:
    the request and the loop so far."""
    trigger = int(trigger_tokens(knobs.threshold, window, knobs.output_reserve))  # as the size check decides
    if prompt_tokens < trigger:
        return pruning
    recalled = recalled_before(context, next((i for i, m in enumerate(context) if m.seq == running), 0))
    if not recalled or prompt_tokens - pricing.added(recalled) >= trigger:
        return pruning
    base = pruning or NO_PRUNING
    dropped = {m.seq: m for m in [*base.dropped, *recalled]}
    return Pruning(base.pruned, base.previews, [dropped[seq] for seq in sorted(dropped)])


def spent(context: list[Message], after: int, running: int | None = None) -> list[Message]:
    """The transient messages past seq ``after`` whose moment has passed: task notes (each spoke to
    one call, made since) and excerpts recalled for a turn that has ended (not for the request at
    seq ``running``, whose loop still works on it). The prompt changes from ``after`` on anyway, so
    leaving them out costs no evaluated prefix. Each stayed until the next summary: a note 20
    tokens of a 4,096 window for every turn that followed (a goal reminder up to 500), a recall
    about 150, and the room it held kept the next turns from recalling anything."""
    # The recalls before ``ended`` are ended turns': all, or while a loop runs those before the
    # request of the turn before it (the running turn's own recall stands after that request).
    ended: float = float("inf")
    if running is not None:
        ended = max((m.seq for m in context if is_turn_start(m) and m.seq < running), default=-1)
    return [m for m in context if m.seq > after and (is_task_note(m) or (m.is_recall and m.seq < ended))]


def _freed(pruning: Pruning, pricing: Pricing) -> int:
    """What ``pruning`` frees (and each preview's PRUNED_TOKENS set)."""
    for original, stand_in in zip(pruning.pruned, pruning.previews):
        stand_in.metadata[PRUNED_TOKENS] = pricing.added([original])
    return sum(pruned_tokens(p) for p in pruning.previews) - pricing.added(pruning.previews)


def decide(staged: Staged, pricing: Pricing, knobs: Knobs, window: int, any_gain: bool) -> tuple[str, int]:
    """("prune", "summary" or "none", the tokens it is expected to free). Pruning alone when it
    reaches the target, or when no summary is worth its LLM call but pruning frees enough; else
    the summary (after the pruning) when it is worth running."""
    if staged.reaches_target:
        return "prune", staged.freed
    worth, frees = pipeline.worth_running(staged.plan, staged.context, pricing, knobs, window, any_gain)
    if worth:
        return "summary", staged.freed + frees
    if staged.freed > 0 and (any_gain or staged.freed >= max(1, knobs.min_freed * window)):
        return "prune", staged.freed
    return "none", max(frees, staged.freed)


def originals(context: list[Message]) -> dict[int, Message]:
    return {m.seq: m for m in context}


def summary_outcome(
    context: list[Message], staged: Staged, plan: Plan, summary: Message, crumbs: list[str]
) -> pipeline.Outcome:
    """The outcome of a summary over the pruned context: what was summarized is demoted as it is
    stored (the originals of its previews), and the pruned rows the kept region still holds are
    replaced by their previews."""
    rows = originals(context)
    fresh = {m.seq for m in staged.pruning.pruned}
    summarized = [rows.get(m.seq, m) if m.seq in fresh else m for m in plan.to_summarize]
    kept_previews = [m for m in plan.to_keep if m.seq in fresh and PRUNED_FROM in m.metadata]
    replacements = []
    for m in kept_previews:
        out = Message()
        out.CopyFrom(m)
        out.ClearField("seq")
        replacements.append(out)
    demoted = summarized + [rows[m.seq] for m in kept_previews]
    return pipeline.Outcome(
        pb.COMPRESSION_METHOD_SUMMARY, demoted, apply_plan(plan, summary), summary, crumbs, replacements
    )


def summarized_originals(context: list[Message], staged: Staged, plan: Plan) -> list[Message]:
    """What a plan over the pruned context summarizes, as stored (a pruned result whole, so the
    summarizer sees its usual preview of it rather than the pruning note)."""
    rows = originals(context)
    fresh = {m.seq for m in staged.pruning.pruned}
    return [rows.get(m.seq, m) if m.seq in fresh else m for m in plan.to_summarize]


def live_text(summary: Message) -> str:
    """A live summary's text without its header line (the range it covers is said anew)."""
    first, _, rest = summary.content.partition("\n")
    return rest if first.startswith(SUMMARY_HEADER) else summary.content


def folds(live: list[Message], fresh: list[Message], pricing: Pricing, budget: int) -> bool:
    """Whether the new history is summarized on its own and appended to the live summary: one live
    summary, which with the new part stays within ``budget`` tokens and the meta-summary
    threshold; else the summary is rewritten whole (and shrinks)."""
    if len(live) != 1 or not fresh:
        return False
    added = summary_length(condensed_tokens(fresh, pricing), budget)
    return pricing.added(live) + added <= budget and len(live[0].content) + added * 4 <= META_SUMMARY_THRESHOLD


PrefixSource = Callable[[list[Message], str], "Prefix | None"]


async def _summary(
    summarizer: Summarizer, summarized: list[Message], pricing: Pricing, prefix_for: PrefixSource | None
) -> tuple[str, list[str]]:
    """(text, keys) of the new live summary: the new history folded into the live one, or the
    whole rewritten; through the prefix form when there is one, else (or when it fails) standalone."""
    live = [m for m in summarized if m.is_summary]
    fresh = [m for m in summarized if not m.is_summary and not is_transient(m)]
    folding = folds(live, fresh, pricing, summarizer.budget)
    text = ""
    keys: list[str] = []
    prefix = None
    if prefix_for is not None:  # prices the whole prompt's view: off the event loop
        prefix = await asyncio.to_thread(prefix_for, summarized, scope_of(summarized, folding))
    if prefix is not None:
        try:
            text, keys = await summarizer.summarize_prefix(prefix, pricing)
        except Exception as exc:  # noqa: BLE001 — the standalone form follows
            log.info("prefix summary failed, standalone instead: %s", exc)
    if not text:
        text, keys = await summarizer.summarize(fresh if folding else live + fresh, pricing)
    if folding:
        return f"{live_text(live[0]).rstrip()}\n{text}", [*keys, *live[0].breadcrumbs]
    return text, keys


async def summarize_or_truncate(
    context: list[Message],
    staged: Staged,
    pricing: Pricing,
    knobs: Knobs,
    summarizer: Summarizer,
    window: int,
    prefix_for: PrefixSource | None = None,
) -> pipeline.Outcome:
    """The summary of what remains over the target after pruning (one retry that summarizes
    less, standalone), or the hard-truncate fallback when the summarizer fails twice."""
    plan = staged.plan
    last_error: Exception | None = None
    for attempt in range(1, pipeline.SUMMARY_ATTEMPTS + 1):
        if attempt > 1:  # the retry keeps more verbatim and summarizes less
            plan = widen_kept(plan)
        summarized = summarized_originals(context, staged, plan)
        try:
            text, keys = await _summary(summarizer, summarized, pricing, prefix_for if attempt == 1 else None)
            break
        except Exception as exc:  # noqa: BLE001 — any summarizer failure takes the fallback
            last_error = exc
            log.warning(
                "summarizer attempt %d/%d failed (%d messages to summarize): %s",
                attempt,
                pipeline.SUMMARY_ATTEMPTS,
                len(plan.to_summarize),
                exc,
            )
    else:
        return await asyncio.to_thread(pipeline.truncate_outcome, context, pricing, window, last_error)
    dropped_text = entity_source([m for m in summarized if not m.is_summary])
    crumbs = merge_breadcrumbs(keys, await asyncio.to_thread(extract_entities, dropped_text))
    replaced = plan.replaced_range
    assert replaced is not None  # a plan that summarizes has messages to summarize
    covered = common_pb2.SeqRange(first=replaced[0], last=replaced[1])
    summary = Message(
        role="user",
        content=f"{SUMMARY_HEADER}, messages {covered.first}–{covered.last}]\n{text}",
        is_summary=True,
        is_context=True,
        is_display=False,
        explicit_flags=True,
        breadcrumbs=crumbs,
        replaces=covered,
    )
    return summary_outcome(context, staged, plan, summary, crumbs)

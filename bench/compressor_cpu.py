"""Where a compression's CPU goes: the Compressor's own work for one compression of 120 varied
messages (prose, code, JSON, dense logs, CJK), stage by stage, in this process (no gRPC, no
store, no model): with the model's tokenizer cache cold (a replica that never saw the session) and
warm (the replica that answered the size check before it, which counted every message)."""

from __future__ import annotations

import random
import time

from bench import _common
from bench.compressor import conversation, exact_counter
from palimpsest.compressor import pipeline, stages
from palimpsest.compressor.breadcrumbs import entity_source, extract_entities, merge_breadcrumbs
from palimpsest.compressor.exact_count import Counter
from palimpsest.compressor.model_tokenizers import TokenCounter
from palimpsest.compressor.pricing import Knobs, Pricing
from palimpsest.compressor.stored_counts import fresh_counts, primed
from palimpsest.compressor.summary_format import SUMMARY_PROMPT, format_for_summary
from palimpsest.compressor.summary_prefix import build_prefix, scope_of
from palimpsest.shared.settings import Settings
from palimpsest.v1 import common_pb2

NEEDS_POSTGRES = False
Message = common_pb2.Message
WINDOW = 8192
MESSAGES = 120
ROUNDS = 20
CACHES = ("cold", "stored counts", "warm")
HEAD = [Message(role="system", content="You are a careful assistant. " * 20)]
STAGES = (
    "read the context (protobuf)",
    "count it (tokenizer)",
    "plan: prune, then the summary",
    "summary input: standalone text",
    "summary input: prefix form",
    "breadcrumbs from what is dropped",
    "the store's commit request",
)


def varied_context(rng: random.Random) -> bytes:
    """120 stored messages of the bench's mixed corpus, serialized as the store sends them."""
    messages = conversation(rng, 400_000, images=False)[1 : MESSAGES + 1]
    for seq, m in enumerate(messages, start=1):
        m.seq = seq
    return common_pb2.Session(id="bench", context=messages).SerializeToString()


def one(wire: bytes, counter, knobs: Knobs, clock: dict[str, float]) -> None:
    """One forced compression's CPU work, each stage timed into ``clock`` (process time)."""

    def timed(name, fn, *args):
        started = time.process_time()
        out = fn(*args)
        clock[name] = clock.get(name, 0.0) + time.process_time() - started
        return out

    context = list(timed(STAGES[0], common_pb2.Session.FromString, wire).context)
    pricing = Pricing.build([], WINDOW, knobs, None, counter)
    current = timed(STAGES[1], lambda: pricing.with_baseline(context)[0].tokens)

    def plan():
        staged = stages.stage(context, pricing, knobs, WINDOW, 0, current, False)
        stages.decide(staged, pricing, knobs, WINDOW, True)
        return staged

    staged = timed(STAGES[2], plan)
    summarized = stages.summarized_originals(context, staged, staged.plan)
    timed(
        STAGES[3],
        lambda: format_for_summary(
            summarized,
            vision=False,
            window=WINDOW,
            prompt=SUMMARY_PROMPT,
            summary_max_tokens=knobs.summary_max_tokens,
            estimate=pricing.estimate,
            costs=pricing.message_costs,
        ),
    )
    timed(STAGES[4], lambda: build_prefix(HEAD, [], context, summarized, pricing, False, scope_of(summarized, False)))
    crumbs = timed(
        STAGES[5],
        lambda: merge_breadcrumbs([], extract_entities(entity_source([m for m in summarized if not m.is_summary]))),
    )
    last = staged.plan.to_summarize[-1].seq

    def commit():
        summary = Message(
            role="user", content="[Summary]\n- done", is_summary=True, replaces=common_pb2.SeqRange(first=1, last=last)
        )
        outcome = stages.summary_outcome(context, staged, staged.plan, summary, crumbs)
        accounting = pipeline.account(outcome, context, pricing, knobs, WINDOW, current)
        return pipeline.commit_request(
            common_pb2.Session(id="bench"), context, outcome, 4, accounting
        ).SerializeToString()

    timed(STAGES[6], commit)


def stored_by_size_check(
    wire: bytes, shared: TokenCounter, knobs: Knobs
) -> tuple[list[Message], list[common_pb2.TokenCount]]:
    """The context and what the store holds of it once a size check on another replica counted it:
    each row's count (stored with the call's report) and, for a row it cut, the cut beside it
    (SetTokenCounts), as CheckContextSize writes them, read back with GetBaseline's counts."""
    rows = list(common_pb2.Session.FromString(wire).context)
    size_check = TokenCounter(shared.tokenizer, "size check")  # the other replica's own caches
    pricing = Pricing.build([], WINDOW, knobs, None, size_check)
    pricing.count_view(pricing.view([*HEAD, *rows])[0])
    counts, with_cuts = fresh_counts(rows, size_check, pricing.budget)
    cuts = {c.seq: c for c in with_cuts}
    return rows, [cuts.get(c.seq, c) for c in counts]


def breakdown(rounds: int) -> dict[str, dict[str, float]]:
    """Milliseconds per compression by stage, cold and warm."""
    knobs = Knobs.resolve(Settings(), None)
    shared = exact_counter()
    contexts = [varied_context(random.Random(i)) for i in range(rounds)]
    out: dict[str, dict[str, float]] = {}
    for cache in CACHES:
        clock: dict[str, float] = {}
        for wire in contexts:
            counter: Counter = TokenCounter(shared.tokenizer, "bench")
            if cache == "stored counts":  # counted by another replica's size check, kept by the store
                counter = primed(counter, *stored_by_size_check(wire, shared, knobs))
            if cache == "warm":  # what the size check on this replica counted a moment before
                context = list(common_pb2.Session.FromString(wire).context)
                Pricing.build([], WINDOW, knobs, None, counter).with_baseline([*HEAD, *context])
            one(wire, counter, knobs, clock)
        out[cache] = {name: seconds / rounds * 1000 for name, seconds in clock.items()}
    return out


async def run(args) -> str:
    rounds = 5 if args.quick else ROUNDS
    measured = breakdown(rounds)
    rows = [[name, *(f"{measured[c][name]:.1f}" for c in CACHES)] for name in STAGES]
    rows.append(
        [
            "total (standalone summary)",
            *(f"{sum(v for k, v in measured[c].items() if k != STAGES[4]):.1f}" for c in CACHES),
        ]
    )
    rows.append(
        ["total (prefix form)", *(f"{sum(v for k, v in measured[c].items() if k != STAGES[3]):.1f}" for c in CACHES)]
    )
    return (
        f"The Compressor's CPU for one forced compression of {MESSAGES} varied messages in a {WINDOW:,}-token "
        "window, by stage, in milliseconds of process time (mean of "
        f"{rounds} contexts); in this process, without gRPC, the store or the model. *Cold*: the tokenizer's "
        "cache has never seen the session (a replica other than the one that answered the size check); "
        "*stored counts*: cold, but every message's count read from the store (each is counted once, by the size "
        "check after it was written); *warm*: it counted every message a moment before (the replica that did). "
        "A compression uses one of the two summary inputs: the standalone text, or the prefix form when the "
        "Agent sent its prompt head.\n\n" + _common.table(["stage", *(f"{c} (ms)" for c in CACHES)], rows)
    )

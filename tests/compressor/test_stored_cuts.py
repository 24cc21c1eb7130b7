"""The view's cut of a long row, stored beside its count: a replica that never saw the session cuts
and counts the row from it, and gets exactly the view and the counts its own tokenizer would."""

from __future__ import annotations

import asyncio
import hashlib
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ollama_sim.prompt import encoding
from ollama_sim.vocabulary import QWEN3_6, tokenizer_metadata
from palimpsest.compressor.exact_count import exact_view, message_tokens
from palimpsest.compressor.model_tokenizers import TokenCounter
from palimpsest.compressor.stored_counts import PrimedCounter, fresh_counts, known_counts, primed
from palimpsest.compressor.vocabulary import build_tokenizer
from palimpsest.v1 import common_pb2
from palimpsest.v1 import compressor_pb2 as pb
from palimpsest.v1 import session_store_pb2 as store_pb
from tests.helpers.compressor_calls import MODEL, PIECES, Watched, session_with

Message = common_pb2.Message


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(tokenizer_metadata(QWEN3_6))


def context_of(rng: random.Random, rows: int) -> list[Message]:
    out = []
    for seq in range(1, rows + 1):
        role = rng.choice(["user", "assistant", "tool"])
        text = "".join(rng.choice(PIECES) for _ in range(rng.choice([1, 3, 40, 120])))
        out.append(Message(seq=seq, role=role, content=text, name="read_log" if role == "tool" else ""))
    return out


def stored(messages: list[Message], counter, budget: int) -> list[common_pb2.TokenCount]:
    """What the store holds once a size check counted ``messages``: the counts, a cut beside each it cut."""
    exact_view(messages, budget, counter)
    counts, with_cuts = fresh_counts(messages, counter, budget)
    cuts = {c.seq: c for c in with_cuts}
    return [cuts.get(c.seq, c) for c in counts]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), budget=st.sampled_from([40, 200, 700, 1_365]))
def test_a_replica_primed_with_stored_cuts_gets_the_very_view_and_counts(tokenizer, seed, budget):
    messages = context_of(random.Random(seed), 12)
    counts = stored(messages, TokenCounter(tokenizer, "size check"), budget)
    own = TokenCounter(tokenizer, "own")  # the replica that counts everything itself
    watched = Watched(tokenizer)
    other = primed(watched, messages, counts)  # the replica that never saw the session

    view, cuts = exact_view(messages, budget, own)
    primed_view, primed_cuts = exact_view(messages, budget, other)
    assert primed_cuts == cuts and [m.content for m in primed_view] == [m.content for m in view]
    assert message_tokens(primed_view, other) == message_tokens(view, own)  # exact, never low
    assert [len(encoding().encode(c, allowed_special="all")) for c in cuts.values()] == [
        n for i, n in enumerate(message_tokens(primed_view, other)) if i in cuts
    ]
    assert watched.counted == [] and watched.cut == []  # nothing encoded again


def test_a_cut_is_trusted_only_for_the_text_it_was_made_of(tokenizer):
    big = Message(seq=1, role="tool", content=PIECES[3] * 200)
    (count,) = stored([big], TokenCounter(tokenizer, "size check"), 300)
    assert count.HasField("cut") and count.cut.head_chars > 0 and count.cut.tail_chars > 0
    assert known_counts([big], [count]).cuts

    other_marker = common_pb2.TokenCount()
    other_marker.CopyFrom(count)
    other_marker.cut.content_md5 = hashlib.md5(b"a cut marked otherwise").hexdigest()
    known = known_counts([big], [other_marker])
    assert not known.cuts and len(known.counts) == 1  # the row's own count still stands

    edited = Message(seq=1, role="tool", content=big.content + "!")
    assert not known_counts([edited], [count])  # another content: neither count nor cut

    watched = Watched(tokenizer)
    view, _ = exact_view([big], 300, PrimedCounter(watched, known))
    assert watched.cut == [big.content]  # no cut it can trust: its own tokenizer cuts
    assert view[0].content == exact_view([big], 300, TokenCounter(tokenizer, "own"))[0][0].content


async def test_a_size_check_stores_its_cuts_and_a_compression_reads_them(compressor, compressor_server, store, profile):
    rows = [
        Message(role="user", content="read the log"),
        Message(role="tool", name="read_log", content=PIECES[3] * 400),
        Message(role="assistant", content="the log shows resets"),
    ]
    session_id = await session_with(store, profile, rows)
    context = (
        await store.GetSession(store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_CONTEXT))
    ).session.context
    check = await compressor.CheckContextSize(
        pb.CheckContextSizeRequest(model=MODEL, messages=list(context), window=8_192, session_id=session_id)
    )
    await asyncio.gather(*compressor_server.servicer._writes)  # the cuts go to the store off the check's path
    (cut_view,) = check.cuts
    reply = await store.GetBaseline(
        store_pb.GetBaselineRequest(session_id=session_id, token_digest=check.token_digest, with_counts=True)
    )
    by_seq = {c.seq: c for c in reply.context_tokens.counts}
    tool = context[1]
    cut = by_seq[tool.seq].cut
    assert cut_view.content.startswith(tool.content[: cut.head_chars])
    assert cut_view.content.endswith(tool.content[len(tool.content) - cut.tail_chars :])
    assert cut.tokens == len(encoding().encode(cut_view.content, allowed_special="all"))
    assert list(by_seq) == [tool.seq]  # the other counts travel with the call's report (the Agent's)
    assert [c.seq for c in check.new_counts] == [m.seq for m in context] and not any(
        c.HasField("cut") for c in check.new_counts
    )  # the report stays small

    known = known_counts(context, reply.context_tokens.counts)
    assert len(known.cuts) == 1 and len(known.counts) == 2  # the row, and its cut

    # Another tokenizer's cut is not this one's; a later count without a cut keeps the row's cut.
    other = await store.GetBaseline(
        store_pb.GetBaselineRequest(session_id=session_id, token_digest="another", with_counts=True)
    )
    assert not other.context_tokens.counts
    plain = common_pb2.TokenCount(
        seq=tool.seq, tokens=by_seq[tool.seq].tokens, content_md5=by_seq[tool.seq].content_md5
    )
    await store.SetTokenCounts(
        store_pb.SetTokenCountsRequest(session_id=session_id, token_digest=check.token_digest, counts=[plain])
    )
    again = await store.GetBaseline(
        store_pb.GetBaselineRequest(session_id=session_id, token_digest=check.token_digest, with_counts=True)
    )
    assert {c.seq: c for c in again.context_tokens.counts}[tool.seq].cut == cut

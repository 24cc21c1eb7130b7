"""A compression prices the rows a size check counted by the counts the store keeps, instead of
encoding the whole context again on a replica that never saw it."""

from __future__ import annotations

import hashlib

from palimpsest.compressor.stored_counts import PrimedCounter, known_counts
from palimpsest.v1 import common_pb2
from palimpsest.v1 import compressor_pb2 as pb
from palimpsest.v1 import session_store_pb2 as store_pb
from tests.helpers.compressor_calls import MODEL, compress, session_with, turns

Message = common_pb2.Message


def md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


async def test_the_store_gives_each_counted_rows_count_when_asked(store, profile):
    session_id = await session_with(store, profile, turns(3))
    context = (
        await store.GetSession(store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_CONTEXT))
    ).session.context
    await store.SetTokenCounts(
        store_pb.SetTokenCountsRequest(
            session_id=session_id,
            token_digest="d",
            counts=[common_pb2.TokenCount(seq=m.seq, tokens=7, content_md5=md5(m.content)) for m in context[:4]],
        )
    )
    reply = await store.GetBaseline(
        store_pb.GetBaselineRequest(session_id=session_id, token_digest="d", with_counts=True)
    )
    counts = sorted((c.seq, c.tokens, c.content_md5) for c in reply.context_tokens.counts)
    assert counts == [(m.seq, 7, md5(m.content)) for m in context[:4]]
    assert not reply.context_tokens.uncounted  # the caller has the rows: large ones would pass the limit
    plain = await store.GetBaseline(store_pb.GetBaselineRequest(session_id=session_id, token_digest="d"))
    assert not plain.context_tokens.counts  # only when asked: the size check's read stays small
    assert [m.seq for m in plain.context_tokens.uncounted] == [m.seq for m in context[4:]]


def test_a_stored_count_stands_only_for_the_content_it_was_made_from():
    rows = [
        Message(seq=1, role="user", content="hello there"),
        Message(seq=2, role="assistant", content="hi"),
        Message(
            seq=3, role="assistant", content="calling", tool_calls=[common_pb2.ToolCall(name="x", arguments_json="{}")]
        ),
    ]
    counts = [
        common_pb2.TokenCount(seq=1, tokens=5, content_md5=md5("hello there")),
        common_pb2.TokenCount(seq=2, tokens=9, content_md5=md5("something else")),
        common_pb2.TokenCount(seq=3, tokens=4, content_md5=md5("calling")),
    ]  # includes its call
    known = known_counts(rows, counts)
    assert known.counts == {(hash("hello there"), len("hello there")): 5} and not known.cuts

    class Counting:
        asked: list[str] = []

        def counts(self, texts, *, for_cut=False):
            self.asked.extend(texts)
            return [len(t) for t in texts]

        def head_and_tail(self, text, head, tail):
            return text[:head], text[-tail:]

    inner = Counting()
    assert PrimedCounter(inner, known).counts(["hello there", "hi"]) == [5, 2]
    assert inner.asked == ["hi"]


async def test_a_compression_prices_stored_rows_by_their_stored_counts(compressor, store, profile, ollama_sim):
    session_id = await session_with(store, profile, turns(30, 1_200))
    context = (
        await store.GetSession(store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_CONTEXT))
    ).session.context
    check = await compressor.CheckContextSize(
        pb.CheckContextSizeRequest(model=MODEL, messages=list(context), window=32_768)
    )
    assert check.token_digest == "" and check.tokens > 6_000  # counted, not stored (no session named)
    digest = (
        await compressor.CheckContextSize(
            pb.CheckContextSizeRequest(model=MODEL, messages=list(context), window=32_768, session_id=session_id)
        )
    ).token_digest
    # Counts the tokenizer would never give: the compression's figures show which were used.
    await store.SetTokenCounts(
        store_pb.SetTokenCountsRequest(
            session_id=session_id,
            token_digest=digest,
            counts=[common_pb2.TokenCount(seq=m.seq, tokens=1, content_md5=md5(m.content)) for m in context],
        )
    )
    events = await compress(compressor, session_id, window=32_768)
    assert events[-1].compressed.tokens_before < check.tokens // 10

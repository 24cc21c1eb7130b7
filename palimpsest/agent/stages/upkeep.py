"""The session's upkeep around a turn's model calls: its name and title, the memory excerpts a
message recalls, and compressions (before a call when the Compressor says so, after the turn)."""

from __future__ import annotations

import asyncio
import logging

from google.protobuf import struct_pb2

from palimpsest.agent import context_builder as cb
from palimpsest.agent.conversation import Conversation
from palimpsest.agent.events import EventSink
from palimpsest.agent.profiles import Profile
from palimpsest.agent.titles import TITLE_TIMEOUT_S, clean_title, title_first_words, title_request
from palimpsest.shared.context_view import recalled_before
from palimpsest.shared.errors import Aborted, FailedPrecondition, PalimpsestError
from palimpsest.shared.ollama import OllamaClient
from palimpsest.shared.prose_weight import PROSE_KEEP_TURNS, PruneSizes, weighted_chars
from palimpsest.shared.stubs import AsyncCompressorStub, AsyncStoreStub
from palimpsest.v1 import agent_pb2, common_pb2
from palimpsest.v1 import compressor_pb2 as cpb
from palimpsest.v1 import session_store_pb2 as store_pb

log = logging.getLogger("palimpsest.agent")

Message = common_pb2.Message


async def compress(
    compressor: AsyncCompressorStub, conv: Conversation, sink: EventSink, request: cpb.CompressRequest
) -> bool:
    """Run one compression, forwarding its events; a failure is logged and the turn goes on.
    Whether it ran (the conversation is then reloaded); not when it answered nothing at all (a
    TURN_END with nothing worth pruning)."""
    committed, answered = 0, False
    try:
        async for event in compressor.Compress(request):
            sink.compression(event)
            answered = True
            if event.HasField("compressed"):
                committed = event.compressed.revision
    except Aborted:
        raise
    except FailedPrecondition:  # nothing to compress: not a failure
        return False
    except PalimpsestError as exc:
        log.warning("compression (%s) failed for %s: %s", request.reason, request.session_id, exc)
        return False
    if not answered:
        return False
    await conv.load()
    if committed and conv.revision != committed:
        raise Aborted(f"another writer changed session {request.session_id} right after its compression")
    return True


def worth_pruning_after(context: list[Message], min_chars: int, sizes: PruneSizes, *, in_loop: bool = False) -> bool:
    """Whether a TURN_END compression would free ``min_chars`` (weighted) by one of its parts: the turn that just ended's
    long tool results, still whole, to previews, and the long requests and answers older than the
    newest PROSE_KEEP_TURNS turns condensed. A cheap test, so a turn with nothing worth pruning (a
    short result, a short exchange) costs no call; the Compressor decides exactly (at ``sizes``,
    the window's: prune_sizes). ``in_loop``: between a tool loop's calls, where the newest call's
    results (and the plan a call of its batch made) stay whole for the call that reads them, and
    no prose is condensed (the answer the user is replying to stays whole while the loop runs).
    Each part must free ``min_chars`` on its own, as the Compressor runs each part only then."""
    turns, results, prose = 0, 0, 0  # turns: of the message at hand, from the newest
    newest = len(context)
    while in_loop and newest and (context[newest - 1].role == "tool" or context[newest - 1].is_plan):
        newest -= 1
    for message in reversed(context[:newest]):
        whole = "pruned_from_seq" not in message.metadata and not message.is_summary
        if message.role == "tool" and turns == 0 and whole and len(message.content) >= sizes.prune_min_chars:
            results += weighted_chars(message.content) - sizes.preview_kept_chars
        elif (
            not in_loop
            and turns >= PROSE_KEEP_TURNS
            and message.role in ("user", "assistant")
            and whole
            and weighted_chars(message.content) >= sizes.prose_min_chars
        ):
            prose += weighted_chars(message.content) - sizes.condensed_chars
        if message.role == "user" and not message.is_summary:
            turns += 1
    return max(results, prose) >= min_chars


def recalled_for_request(context: list[Message]) -> bool:
    """Whether the newest request (a user message not a summary) recalled excerpts."""
    at = next(
        (i for i in range(len(context) - 1, -1, -1) if context[i].role == "user" and not context[i].is_summary), 0
    )
    return bool(recalled_before(context, at))


def pruning_request(
    session_id: str, profile: Profile, window: int, current_tokens: int, revision: int | None
) -> cpb.CompressRequest:
    """A COMPRESSION_REASON_TURN_END request: after a turn, or between a tool loop's iterations
    (then at the turn's ``revision``)."""
    request = cpb.CompressRequest(
        session_id=session_id,
        reason=cpb.COMPRESSION_REASON_TURN_END,
        model=profile.model,
        window=window,
        current_tokens=current_tokens,
        settings=profile.compression_settings(),
    )
    if revision is not None:
        request.expected_revision = revision
    return request


async def compress_after_turn(compressor: AsyncCompressorStub, sink: EventSink, request: cpb.CompressRequest) -> bool:
    """The post-turn compression, its events for the session's watchers (the turn's stream has
    ended); whether it committed one. A failure is logged."""
    compressed = False
    try:
        async for event in compressor.Compress(request):
            # After stream_end: for the session's watchers.
            sink.compression(event, watchers_only=True)
            compressed = compressed or event.HasField("compressed")
    except FailedPrecondition:  # nothing to compress
        pass
    except PalimpsestError as exc:
        log.warning("post-turn compression failed for %s: %s", request.session_id, exc)
    return compressed


async def title_session(
    ollama: OllamaClient,
    conv: Conversation,
    sink: EventSink,
    *,
    model: str,
    window: int,
    thinking: bool,
    goal: str,
    answer: str,
    first_words: str,
) -> None:
    """The model's short title for a session a turn named by its first words, once its first
    answer is in. A failed call, an unusable answer or a rename meanwhile (the revision moved)
    keeps the first words."""
    try:
        async with asyncio.timeout(TITLE_TIMEOUT_S):
            reply = await ollama.chat(title_request(model, window, goal, answer, thinking))
    except (PalimpsestError, TimeoutError) as exc:
        log.info("no title for session %s (%s): its first words stay its name", conv.session_id, exc)
        return
    title = clean_title(reply.content)
    if not title or title == first_words:
        return
    try:
        await conv.update(name=title)
    except PalimpsestError as exc:  # renamed (or written) by someone else meanwhile: theirs stands
        log.info("session %s not titled: %s", conv.session_id, exc)
        return
    sink.announce(session_renamed=agent_pb2.SessionRenamed(name=title))


async def name_session(conv: Conversation, sink: EventSink, text: str) -> str:
    """A session without a name is named by the first words of its first message: the name given
    ("" when none was)."""
    session = conv.session
    if session is None or session.name or not text.strip():
        return ""
    name = title_first_words(text)
    try:
        await conv.update(name=name)
    except PalimpsestError:
        log.warning("could not name session %s", conv.session_id)
        return ""
    sink.announce(session_renamed=agent_pb2.SessionRenamed(name=name))
    return name


async def recall(store: AsyncStoreStub, conv: Conversation, profile: Profile, window: int, text: str) -> list[Message]:
    """Up to k relevant excerpts of compressed-away history, each injected once per session, within
    their share of the window (none in a sub-agent's conversation: it has no summary)."""
    p = profile
    if not (p.memory_recall_enabled and text.strip() and conv.has_summary()):
        return []
    # Excerpts stay in the context until a turn-end prune past them or the next compression: what
    # earlier turns recalled and is still there counts against the same share of the window.
    room = cb.recall_chars(window) - sum(len(m.content) for m in conv.context if m.is_recall)
    if room < cb.MIN_EXCERPT_CHARS:
        return []
    try:
        found = await store.SearchMemory(
            store_pb.SearchMemoryRequest(
                session_id=conv.session_id,
                query=text[:500],
                limit=max(1, p.memory_recall_k) * 3,
                min_similarity=p.memory_recall_min_similarity,
                embed_model=p.embed_model,
            )
        )
    except PalimpsestError as exc:
        log.warning("memory recall failed for %s: %s", conv.session_id, exc)
        return []
    session = conv.session
    injected = session.metadata["injected_chunk_ids"] if session and "injected_chunk_ids" in session.metadata else None
    seen = set(injected) if isinstance(injected, struct_pb2.ListValue) else set()
    # Each excerpt long enough to say something.
    unseen = [c for c in found.chunks if float(c.id) not in seen][: p.memory_recall_k]
    fresh = cb.fitting_chunks(unseen, room, conv.untrusted)
    if not fresh:
        return []
    await conv.update(metadata={"injected_chunk_ids": sorted(seen | {float(c.id) for c in fresh})})
    return [cb.recall_message(fresh, text, room, untrusted=conv.untrusted)]

"""The semantic tier of memory search: chunks embedded by Ollama's /api/embed, kept on pgvector.

The store embeds, not the Compressor or the Agent: the index, its rebuilds and its retries then live
beside the chunks they describe, a compression hands over chunks exactly as before, and a search
embeds its query where the vectors are. Everything here is best effort: a missing pgvector, a
missing model, an embedder that is down or slow only take the semantic tier away (memory search
is then lexical), never a save, a compression or a turn.

Sessions are searched by meaning through their summaries and every displayed user and assistant
message (session_search, ListSessions' query), embedded by the same task after the chunks and
summaries, in the same batches and back-off: the indexer's whole budget.

Indexing runs in one background task, after commits: CommitCompression and IndexChunks poke it
once their transaction is over, and a chunk without a vector stays pending until embedded, so a
failed attempt is simply retried (after the back-off). A rebuild is the same loop: a new space
has every chunk pending.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from typing import Any

import asyncpg

from palimpsest.shared.errors import PalimpsestError
from palimpsest.shared.ollama import OllamaClient
from palimpsest.store.repository.vectors import MemoryVectors, vector_text

log = logging.getLogger("palimpsest.store.semantic")

# Chunks per /api/embed call while indexing, and the time such a call may take: indexing is off
# every client's path, and a batch of long chunks on a CPU takes seconds.
INDEX_BATCH = 16
INDEX_TIMEOUT_S = 60.0
# What of a chunk is embedded: an embedding model's window is a few thousand tokens (Ollama would
# truncate anyway); a shorter request costs less to send.
EMBED_CHARS = 8_000
# What of a message is embedded for session search: its opening says what it is about, and every
# displayed message of every session is embedded, so the indexer's time goes further on less.
MESSAGE_EMBED_CHARS = 2_000
# How long a profile's model stays marked as searched before it is written again.
_SPACE_TOUCH_S = 3600.0


def checked_vectors(vectors: Any, count: int) -> list[list[float]] | None:
    """The embedder's answer when it is `count` vectors of one positive size of finite numbers
    (anything else would fail inside PostgreSQL, or rank nonsense)."""
    if not isinstance(vectors, list) or len(vectors) != count or not vectors:
        return None
    size = len(vectors[0]) if isinstance(vectors[0], list) else 0
    if size == 0:
        return None
    for vector in vectors:
        if not isinstance(vector, list) or len(vector) != size:
            return None
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in vector):
            return None
    return vectors


class Embedder:
    """/api/embed behind a back-off per model: after a failure (down, slow, model not pulled), no
    call for that model for `retry_s`; the tier answers "no vector" at once meanwhile."""

    def __init__(self, client: OllamaClient, *, retry_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.retry_s = retry_s
        self.clock = clock
        self._retry_at: dict[str, float] = {}

    def retry_in(self, model: str) -> float:
        """Seconds until `model` may be asked again (0: now)."""
        return max(0.0, self._retry_at.get(model, 0.0) - self.clock())

    async def embed(self, model: str, texts: Sequence[str], *, timeout: float) -> list[list[float]] | None:
        if self.retry_in(model) > 0:
            return None
        try:
            vectors = checked_vectors(await self.client.embed(model, texts, timeout=timeout), len(texts))
            problem = "" if vectors is not None else "an answer that is not one vector of numbers per text"
        except PalimpsestError as exc:
            vectors, problem = None, str(exc)
        if vectors is None:
            if model not in self._retry_at:  # once per outage, not once per search
                log.warning(
                    "embedding model %s is not usable (%s): memory search is lexical, retrying every %g s",
                    model,
                    problem,
                    self.retry_s,
                )
            self._retry_at[model] = self.clock() + self.retry_s
            return None
        if self._retry_at.pop(model, None) is not None:
            log.info("embedding model %s answers again: memory search ranks by meaning too", model)
        return vectors


class MemoryIndex:
    """The semantic tier: `start` decides whether it is on, `nearest` serves searches, `poke`
    wakes the indexer."""

    def __init__(
        self,
        vectors: MemoryVectors,
        embedder: Embedder,
        *,
        model: str,
        query_timeout_s: float,
        min_similarity: float,
        where: str = "PostgreSQL",
        messages_quiet_s: float = 0.0,
    ) -> None:
        self.vectors = vectors
        self.embedder = embedder
        self.model = model
        self.query_timeout_s = query_timeout_s
        self.min_similarity = min_similarity
        self.where = where
        self.enabled = False
        self._dimensions: dict[str, int] = {}
        self._touched: dict[str, float] = {}
        self._wake = asyncio.Event()
        # A poke for new messages only (an append) looks for nothing else: the pending chunks'
        # question reads every chunk, and appends come several a turn.
        self._everything = True
        self.messages_quiet_s = messages_quiet_s
        # When the sessions appended to since the last pass will have been quiet long enough.
        self._messages_due: float | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if not self.model:
            log.info(
                "semantic memory search is off: no embedding model (PALIMPSEST_EMBED_MODEL is empty); "
                "memory search is lexical"
            )
            return
        if not await self.vectors.available():
            log.warning(
                "semantic memory search is off: %s has no pgvector (the `vector` extension); memory search is lexical",
                self.where,
            )
            return
        dropped = await self.vectors.keep_space(self.model, from_settings=True)
        if dropped:
            log.info(
                "memory index: dropped the vectors of %s; building them in %s in the background",
                ", ".join(dropped),
                self.model,
            )
        self.enabled = True
        self._task = asyncio.create_task(self._run(), name="memory-index")
        self.poke()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task

    def poke(self, *, messages_only: bool = False) -> None:
        """New chunks were committed (or a space changed): index what is pending. `messages_only`:
        only messages were appended."""
        if not self.enabled:
            return
        if messages_only and self.messages_quiet_s > 0:
            # The first append since the last pass sets the time; later ones are caught by it or by
            # the pass their own next append schedules (never pushed back, so a busy store still
            # gets its passes).
            if self._messages_due is None:
                self._messages_due = self.embedder.clock() + self.messages_quiet_s + 1.0
                self._wake.set()  # to wait for that time instead
            return
        self._everything = self._everything or not messages_only
        self._wake.set()

    # -- search ------------------------------------------------------------------------------
    async def embed_query(self, query: str, model: str) -> list[float] | None:
        """The query's vector in `model` (the profile's, else the store's), or None when the tier
        is off or the embedder is down, slow or backing off."""
        if not self.enabled:
            return None
        model = model or self.model
        if model != self.model and self.embedder.clock() - self._touched.get(model, -math.inf) > _SPACE_TOUCH_S:
            # A profile's own model: kept (and indexed) while searches ask for it.
            try:
                await self.vectors.keep_space(model, from_settings=False)
            except asyncpg.PostgresError as exc:
                log.warning("could not record embedding model %s (%s): its index waits for the next search", model, exc)
                return None
            self._touched[model] = self.embedder.clock()
            self.poke()
        vectors = await self.embedder.embed(model, [query], timeout=self.query_timeout_s)
        return vectors[0] if vectors else None

    async def nearest(
        self, session_id: uuid.UUID, model: str, vector: Sequence[float], limit: int
    ) -> list[dict[str, Any]] | None:
        """The session's chunks nearest `vector` at or above the similarity floor, nearest first."""
        model = model or self.model
        try:
            await self.settle(model, len(vector))
            return await self.vectors.nearest(session_id, model, vector, limit, self.min_similarity)
        except asyncpg.PostgresError as exc:  # the semantic tier never fails a search
            log.warning("semantic memory search failed (%s): lexical only for this search", exc)
            return None

    async def sessions_query(self, query: str, model: str) -> tuple[str, str, int, float] | None:
        """What ListSessions' meaning branch binds (model, the query's vector, its dimensions, the
        floor), or None when the tier is off or the embedder does not answer."""
        vector = await self.embed_query(query, model)
        if vector is None:
            return None
        model = model or self.model
        try:
            await self.settle(model, len(vector))
        except asyncpg.PostgresError as exc:
            log.warning("semantic session search failed (%s): words only for this search", exc)
            return None
        return model, vector_text(vector), len(vector), self.min_similarity

    async def settle(self, model: str, dimensions: int) -> None:
        """Before vectors of `dimensions` are compared or stored in `model`'s space: a change of
        size drops the old vectors, which the indexer then rebuilds."""
        if self._dimensions.get(model) == dimensions:
            return
        if await self.vectors.settle_dimensions(model, dimensions):
            log.info(
                "embedding model %s now answers %d dimensions: rebuilding its memory index in the background",
                model,
                dimensions,
            )
            self.poke()
        self._dimensions[model] = dimensions

    # -- indexing ----------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            self._wake.clear()
            everything, self._everything = self._everything, False
            if self._messages_due is not None and self.embedder.clock() >= self._messages_due:
                self._messages_due = None  # this pass embeds the sessions now quiet
            try:
                wait = await self._index_pending(everything)
            except (asyncpg.PostgresError, OSError, asyncpg.InterfaceError) as exc:  # the database away
                log.warning("memory indexing failed (%s): retrying in %g s", exc, self.embedder.retry_s)
                wait = self.embedder.retry_s
            except Exception:  # noqa: BLE001 — anything else must not end indexing for the process's life
                log.exception("memory indexing failed: retrying in %g s", self.embedder.retry_s)
                wait = self.embedder.retry_s
            if wait is not None:
                self._everything = True  # what failed is tried again, all of it
            if self._messages_due is not None:
                due = max(0.0, self._messages_due - self.embedder.clock())
                wait = due if wait is None else min(wait, due)
            if wait is None:
                await self._wake.wait()
            else:
                with suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)

    async def _index_pending(self, everything: bool = True) -> float | None:
        """Embed every pending chunk, summary and message of every space (only messages unless
        `everything`); returns when to try again (None: when poked)."""
        retry: float | None = None
        kinds: list[
            tuple[
                Callable[[str], Awaitable[tuple[Any, list[str]] | None]],
                Callable[[str, Any, Sequence[Sequence[float]]], Awaitable[None]],
            ]
        ] = [
            (self._pending_chunks, self.vectors.store),
            (self._pending_summaries, self.vectors.store_summaries),
            (self._pending_messages, self._store_messages),
        ]
        for model in await self.vectors.spaces():
            for pending, store in kinds if everything else kinds[-1:]:
                while batch := await pending(model):
                    keys, texts = batch
                    vectors = await self.embedder.embed(model, texts, timeout=INDEX_TIMEOUT_S) if texts else []
                    if vectors is None:
                        wait = self.embedder.retry_in(model)
                        retry = wait if retry is None else min(retry, wait)
                        break
                    if vectors:
                        await self.settle(model, len(vectors[0]))
                    await store(model, keys, vectors)
                if retry is not None:
                    break
        return retry

    async def _pending_chunks(self, model: str) -> tuple[list[Any], list[str]] | None:
        rows = await self.vectors.pending(model, INDEX_BATCH)
        return ([r["id"] for r in rows], [r["content"][:EMBED_CHARS] for r in rows]) if rows else None

    async def _pending_summaries(self, model: str) -> tuple[list[Any], list[str]] | None:
        rows = await self.vectors.pending_summaries(model, INDEX_BATCH)
        return (
            ([(r["session_id"], r["seq"]) for r in rows], [r["content"][:EMBED_CHARS] for r in rows]) if rows else None
        )

    async def _pending_messages(self, model: str) -> tuple[Any, list[str]] | None:
        rows = await self.vectors.pending_messages(model, INDEX_BATCH, self.messages_quiet_s)
        if not rows:
            return None
        keys, texts, marks = message_batch(rows, INDEX_BATCH)
        return (keys, marks), texts  # the marks are stored with the vectors, in one transaction

    async def _store_messages(self, model: str, keys: Any, vectors: Sequence[Sequence[float]]) -> None:
        messages, marks = keys
        await self.vectors.store_messages(model, messages, vectors, marks)


def message_batch(
    rows: Sequence[Any], limit: int
) -> tuple[list[tuple[uuid.UUID, int]], list[str], list[tuple[uuid.UUID, int]]]:
    """From _PENDING_MESSAGES_SQL's rows (session, last, seq, content; seq None for a session with
    nothing to embed past its mark): at most `limit` messages to embed, and how far each session
    is then embedded. A session whose rows all fit is done through `last` (tool rows, hidden rows
    and rows without text are skipped for good); one cut short, through its last message taken."""
    keys: list[tuple[uuid.UUID, int]] = []
    texts: list[str] = []
    marks: list[tuple[uuid.UUID, int]] = []
    by_session: dict[uuid.UUID, list[Any]] = {}
    for row in rows:
        by_session.setdefault(row["session_id"], []).append(row)
    for session_id, session_rows in by_session.items():
        if len(keys) >= limit:
            break
        messages = [r for r in session_rows if r["seq"] is not None]
        room = limit - len(keys)
        taken = messages[:room]
        keys += [(session_id, r["seq"]) for r in taken]
        texts += [r["content"][:MESSAGE_EMBED_CHARS] for r in taken]
        # Fewer rows than the per-session cap: nothing else of it waits. Otherwise (cut by the
        # cap or by the room left) only what was taken is done.
        done = len(taken) == len(messages) and len(messages) < limit
        marks.append((session_id, session_rows[0]["last"] if done else taken[-1]["seq"]))
    return keys, texts, marks

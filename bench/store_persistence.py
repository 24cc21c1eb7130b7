"""Persistence cost per turn as a session grows: the SessionStore (through its gRPC server) against
LangGraph's PostgreSQL checkpointer, saving the same conversation on the same server in one run.

One turn, ours: AppendMessages(user + assistant) then UpdateSession(metadata), each with the
`expected_revision` the previous call returned, as the Agent does. One turn, LangGraph: one
`ainvoke` of a `MessagesState` graph (START → respond → END, compiled with `AsyncPostgresSaver`)
with the user message; the node returns the assistant message. Sessions grow between sizes with
batched AppendMessages (ours) and one `aupdate_state` (LangGraph) carrying the same messages.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import asyncpg
from google.protobuf import struct_pb2

from bench._common import (
    Chatter,
    checkpoint,
    fresh_database,
    human_bytes,
    ms,
    p50,
    percentile,
    running_store,
    table,
)
from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as pb

log = logging.getLogger("bench.store_persistence")

NEEDS_POSTGRES = True
SIZES = (100, 1_000, 10_000)
QUICK_SIZES = (100, 1_000)
TURNS = 50
QUICK_TURNS = 10
WARMUP_TURNS = 3
GROW_BATCH = 200  # messages per AppendMessages while growing a session

OUR_TABLES = ("sessions", "session_messages", "session_messages_archive")
LANGGRAPH_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")


async def _bytes(conn: asyncpg.Connection, tables: tuple[str, ...]) -> int:
    return await conn.fetchval(
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = current_schema() AND c.relname = ANY($1::text[])",
        list(tables),
    )


class Ours:
    """The SessionStore through a real gRPC stub."""

    def __init__(self, stub):
        self.stub = stub
        self.session_id = ""
        self.revision: int | None = None
        self.turns = 0

    async def create(self) -> None:
        response = await self.stub.CreateSession(pb.CreateSessionRequest(profile_id="default", name="bench turn cost"))
        self.session_id = response.session.id
        self.revision = response.session.revision

    async def grow(self, messages: list[tuple[str, str]]) -> None:
        for start in range(0, len(messages), GROW_BATCH):
            batch = [common_pb2.Message(role=role, content=text) for role, text in messages[start : start + GROW_BATCH]]
            response = await self.stub.AppendMessages(
                pb.AppendMessagesRequest(session_id=self.session_id, messages=batch, expected_revision=self.revision)
            )
            self.revision = response.revision

    async def turn(self, user: str, assistant: str) -> None:
        self.turns += 1
        appended = await self.stub.AppendMessages(
            pb.AppendMessagesRequest(
                session_id=self.session_id,
                messages=[
                    common_pb2.Message(role="user", content=user),
                    common_pb2.Message(role="assistant", content=assistant, elapsed_seconds=2.5),
                ],
                expected_revision=self.revision,
            )
        )
        metadata = struct_pb2.Struct()
        metadata.update({"last_turn": self.turns, "last_model": "qwen3:8b", "turn_prompt_tokens": 1200 + self.turns})
        updated = await self.stub.UpdateSession(
            pb.UpdateSessionRequest(session_id=self.session_id, metadata=metadata, expected_revision=appended.revision)
        )
        self.revision = updated.session.revision


class LangGraph:
    """A `MessagesState` chat graph compiled with LangGraph's AsyncPostgresSaver."""

    def __init__(self, saver):
        from langchain_core.messages import AIMessage
        from langgraph.graph import END, START, MessagesState, StateGraph

        self.reply = ""

        def respond(state: MessagesState):
            # Stands in for the model call: the reply is given, only persistence is measured.
            return {"messages": [AIMessage(self.reply)]}

        builder = StateGraph(MessagesState)
        builder.add_node("respond", respond)
        builder.add_edge(START, "respond")
        builder.add_edge("respond", END)
        self.graph = builder.compile(checkpointer=saver)
        self.config = {"configurable": {"thread_id": f"bench-{uuid.uuid4()}"}}

    @staticmethod
    def _message(role: str, text: str):
        from langchain_core.messages import AIMessage, HumanMessage

        return HumanMessage(text) if role == "user" else AIMessage(text)

    async def grow(self, messages: list[tuple[str, str]]) -> None:
        await self.graph.aupdate_state(
            self.config, {"messages": [self._message(r, t) for r, t in messages]}, as_node="respond"
        )

    async def turn(self, user: str, assistant: str) -> None:
        from langchain_core.messages import HumanMessage

        self.reply = assistant
        await self.graph.ainvoke({"messages": [HumanMessage(user)]}, self.config)


async def _measure(system, turns: list[tuple[str, str]], warmup: int, after_turn=None) -> list[float]:
    """Per-turn seconds of the turns after `warmup`; `after_turn(i, seconds)` runs outside the timing."""
    for user, assistant in turns[:warmup]:
        await system.turn(user, assistant)
    times = []
    for i, (user, assistant) in enumerate(turns[warmup:]):
        started = time.perf_counter()
        await system.turn(user, assistant)
        times.append(time.perf_counter() - started)
        if after_turn is not None:
            await after_turn(i, times[-1])
    return times


async def run(args) -> str:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    sizes = QUICK_SIZES if args.quick else SIZES
    turns_per_size = QUICK_TURNS if args.quick else TURNS
    chatter = Chatter(seed=20240611)
    rows, ratios, notes = [], {}, []
    results: dict[int, dict[str, object]] = {}
    async with fresh_database(args.server, "persistence") as dsn:
        async with running_store(dsn) as (_, stub), AsyncPostgresSaver.from_conn_string(dsn) as saver:
            await saver.setup()
            admin = await asyncpg.connect(dsn)
            try:
                ours, lang = Ours(stub), LangGraph(saver)
                await ours.create()
                stored = 0
                for size in sizes:
                    # Grow both to `size` with the same messages, then measure turns on both.
                    grow = []
                    for i in range(stored, size):
                        role = "user" if i % 2 == 0 else "assistant"
                        grow.append((role, chatter.message(role, 300, 800)))
                    if grow:
                        t0 = time.perf_counter()
                        await ours.grow(grow)
                        t1 = time.perf_counter()
                        await lang.grow(grow)
                        log.info(
                            "grew to %d messages: ours %.1fs, LangGraph %.1fs", size, t1 - t0, time.perf_counter() - t1
                        )
                    stored = size
                    turns = [chatter.turn() for _ in range(WARMUP_TURNS + turns_per_size)]
                    sid = uuid.UUID(ours.session_id)
                    hot = {"count": await admin.fetchval("SELECT hot_count FROM sessions WHERE id = $1", sid)}
                    archiving: list[float] = []  # seconds of the measured turns that moved rows to the archive

                    async def watch_archive(_: int, seconds: float, sid=sid, hot=hot, archiving=archiving) -> None:
                        count = await admin.fetchval("SELECT hot_count FROM sessions WHERE id = $1", sid)
                        if count < hot["count"]:
                            archiving.append(seconds)
                        hot["count"] = count

                    await checkpoint(admin)
                    ours_times = await _measure(ours, turns, WARMUP_TURNS, watch_archive)
                    await checkpoint(admin)
                    lang_times = await _measure(lang, turns, WARMUP_TURNS)
                    stored += 2 * len(turns)
                    results[size] = {
                        "ours": ours_times,
                        "lang": lang_times,
                        "archiving": archiving,
                        "ours_bytes": await _bytes(admin, OUR_TABLES),
                        "lang_bytes": await _bytes(admin, LANGGRAPH_TABLES),
                    }
                    log.info(
                        "size %d: ours p50 %.1f ms, LangGraph p50 %.1f ms",
                        size,
                        p50(ours_times) * 1000,
                        p50(lang_times) * 1000,
                    )
                hot = await admin.fetchrow(
                    "SELECT hot_count, display_count FROM sessions WHERE id = $1", uuid.UUID(ours.session_id)
                )
                lang_checkpoints = await admin.fetchval("SELECT count(*) FROM checkpoints")
                lang_blobs = await admin.fetchval("SELECT count(*) FROM checkpoint_blobs WHERE channel = 'messages'")
            finally:
                await admin.close()

    for size in sizes:
        r = results[size]
        rows.append(
            [
                f"{size:,}",
                ms(p50(r["ours"])),
                ms(percentile(r["ours"], 95)),
                ms(p50(r["lang"])),
                ms(percentile(r["lang"], 95)),
                human_bytes(r["ours_bytes"]),
                human_bytes(r["lang_bytes"]),
            ]
        )
    first, last = sizes[0], sizes[-1]
    for key in ("ours", "lang"):
        ratios[key] = p50(results[last][key]) / p50(results[first][key])
    maxima = "; ".join(
        f"{s:,}: ours {ms(max(results[s]['ours']))}, LangGraph {ms(max(results[s]['lang']))}" for s in sizes
    )
    archive_events = "; ".join(
        f"{s:,}: {len(results[s]['archiving'])} of {turns_per_size}"
        + (f" ({', '.join(ms(t) for t in results[s]['archiving'])} ms)" if results[s]["archiving"] else "")
        for s in sizes
    )
    notes = [
        (
            f"Per-turn latency in ms over {turns_per_size} turns at each size (after {WARMUP_TURNS} warm-up turns); "
            f"messages 300–800 chars of generated chat text; the same conversation is saved by both, "
            f"on the same server, in this run."
        ),
        (
            f"**Flatness (p50@{last:,} / p50@{first:,}):** ours **{ratios['ours']:.2f}×** (target: flat, ≈1×), "
            f"LangGraph **{ratios['lang']:.2f}×**."
        ),
        f"Max per turn: {maxima}.",
        (
            "Ours = AppendMessages(user + assistant) + UpdateSession(metadata), two unary calls through the real gRPC "
            "server on loopback (same process), with `expected_revision`. Past the hot window "
            "(PALIMPSEST_HOT_WINDOW_MESSAGES, default 2,000) an append also moves the oldest groups to the archive "
            f"table inside the same transaction; measured turns that did so: {archive_events}."
        ),
        (
            "LangGraph = one `graph.ainvoke({'messages': [HumanMessage]})` per turn on a `MessagesState` graph "
            "(START → respond → END; the node returns the given AIMessage, no model call) compiled with "
            "`AsyncPostgresSaver.from_conn_string(...)` after `setup()`, default durability (`async`, awaited before "
            "ainvoke returns). This is how a LangGraph chat app persists: each invoke loads the thread's latest "
            "checkpoint and writes 3 checkpoints (input, after START, after the node); the `add_messages` channel "
            "changes twice per turn, so 2 new full copies of the whole message list are written per turn "
            f"(at the end: {lang_checkpoints:,} checkpoints, {lang_blobs:,} message-list blobs). "
            "Growth between sizes used one `aupdate_state` with the same messages."
        ),
        (
            "Bytes = pg_total_relation_size (heap + TOAST + indexes, including the trigram GIN index on message content) "
            f"of {', '.join(OUR_TABLES)} vs {', '.join(LANGGRAPH_TABLES)}, measured after the turns at each size, "
            f"without VACUUM. Our session at the end: {hot['display_count']:,} displayed messages, "
            f"{hot['hot_count']:,} in the hot table."
        ),
    ]
    headers = [
        "stored messages",
        "ours p50",
        "ours p95",
        "LangGraph p50",
        "LangGraph p95",
        "ours bytes",
        "LangGraph bytes",
    ]
    return table(headers, rows) + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"


if __name__ == "__main__":  # python -m bench store_persistence is the usual way
    import sys

    from bench.__main__ import main

    sys.exit(asyncio.run(main(["store_persistence", *sys.argv[1:]])))

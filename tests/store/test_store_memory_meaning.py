"""Memory search by meaning: chunks embedded by /api/embed (the simulator, over real HTTP), kept on
pgvector and ranked together with the lexical scores; and everything that takes the semantic tier
away (no pgvector, an embedder down or slow) leaving the lexical tier exactly as it was.

The semantic tests need pgvector, which the embedded PostgreSQL ships; on a server without it
(the machine's PostgreSQL 15, TEST_DATABASE_URL) they are skipped and the lexical-fallback test
runs instead."""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import replace

import asyncpg
import grpc
import pytest

from ollama_sim import OllamaSimulator
from palimpsest.store.repository.memory import meaning_scores, rank_together
from palimpsest.store.semantic import MESSAGE_EMBED_CHARS, message_batch
from palimpsest.v1 import common_pb2, session_store_pb2_grpc
from palimpsest.v1 import session_store_pb2 as pb
from tests.conftest import _start_store
from tests.helpers.waiting import until

EMBED_MODEL = "nomic-embed-text"
TARGET = "The deploy crashed because the database password expired"
# Shares no word with TARGET: only its meaning finds it.
PARAPHRASE = "release failure: postgres credentials lapsed"
DISTRACTORS = [
    "We renamed the button on the settings page to Save",
    "Lunch order: two pizzas and a salad",
    "The car needs new tyres before winter",
    "Quarterly numbers look better than forecast",
]


# -- ranking (pure) ------------------------------------------------------------------------------


def test_without_meaning_scores_the_order_is_the_lexical_tiers():
    lexical = {1: 0.5, 2: 2.0, 3: 0.5, 4: 0.0, 5: 0.1}
    assert rank_together(lexical, {}, 10, 0.0) == [(2, 2.0), (1, 0.5), (3, 0.5), (5, 0.1)]
    assert rank_together(lexical, {}, 2, 0.2) == [(2, 2.0), (1, 0.5)]


def test_meaning_adds_to_words_and_never_passes_a_verbatim_hit():
    lexical = {1: 2.0, 2: 0.5}  # 1 holds the query whole; 2 some of its words
    meaning = meaning_scores({2: 1.0, 3: 0.9, 4: 0.4}, floor=0.5)
    assert meaning == {2: 1.0, 3: pytest.approx(0.8)}  # 4 is below the floor: unrelated
    assert rank_together(lexical, meaning, 10, 0.0) == [(1, 2.0), (2, 1.5), (3, pytest.approx(0.8))]


# -- stores of this module -----------------------------------------------------------------------


@pytest.fixture(scope="module")
async def database_url(database_url):
    """A database of this module's own on the tests' server: a semantic store indexes every chunk
    and summary of its database in the background, and on the shared one (grown by every earlier
    run) the backlog outlasted the tests' wait for their own few vectors."""
    server = database_url.rsplit("/", 1)[0]
    name = f"palimpsest_meaning_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(f"{server}/postgres")
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    yield f"{server}/{name}"
    admin = await asyncpg.connect(f"{server}/postgres")
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture(scope="module")
async def store(base_settings, database_url):
    """A store without the semantic tier, on this module's database."""
    server = await _start_store(base_settings, database_url)
    async with grpc.aio.insecure_channel(server.address) as channel:
        yield session_store_pb2_grpc.SessionStoreStub(channel)
    await server.stop(0)


@pytest.fixture(scope="module")
async def has_pgvector(database_url) -> bool:
    conn = await asyncpg.connect(database_url)
    try:
        return bool(await conn.fetchval("SELECT count(*) FROM pg_available_extensions WHERE name = 'vector'"))
    finally:
        await conn.close()


@pytest.fixture
async def semantic_store(base_settings, database_url, has_pgvector):
    """Start a store on the simulator (the test passes its own, and settings): yields a stub factory."""
    if not has_pgvector:
        pytest.skip(
            "this PostgreSQL has no pgvector: the semantic tier cannot run here (the lexical fallback is "
            "tested instead)"
        )
    running = []

    async def start(sim: OllamaSimulator, **overrides):
        # A generous embed timeout unless a test is about it: on a loaded machine 2 s was passed,
        # and the embedder's 30 s back-off then outlasted the tests' wait for the index.
        settings = replace(
            base_settings,
            ollama_host=sim.url,
            **({"embed_model": EMBED_MODEL, "embed_timeout_s": 20.0, "embed_messages_quiet_s": 0.0} | overrides),
        )
        server = await _start_store(settings, database_url)
        channel = grpc.aio.insecure_channel(server.address)
        running.append((server, channel))
        stub = session_store_pb2_grpc.SessionStoreStub(channel)
        addresses[id(stub)] = server.address
        return stub

    addresses: dict[int, str] = {}
    start.address_of = lambda stub: addresses[id(stub)]  # type: ignore[attr-defined]  # services started beside it
    yield start
    for server, channel in running:
        await channel.close()
        await server.stop(0)


@pytest.fixture
def sim():
    with OllamaSimulator() as simulator:
        yield simulator


async def session_with_chunks(stub, profile: str, contents: list[str]) -> str:
    session_id = (await stub.CreateSession(pb.CreateSessionRequest(profile_id=profile))).session.id
    chunks = [common_pb2.RawChunk(content=c) for c in contents]
    assert (await stub.IndexChunks(pb.IndexChunksRequest(session_id=session_id, chunks=chunks))).indexed == len(chunks)
    return session_id


async def vectors(database_url: str, session_id: str, model: str = EMBED_MODEL, dimensions: int | None = None) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        return await conn.fetchval(
            "SELECT count(*) FROM memory_vectors WHERE session_id = $1 AND model = $2"
            " AND ($3::int IS NULL OR vector_dims(embedding) = $3)",
            uuid.UUID(session_id),
            model,
            dimensions,
        )
    finally:
        await conn.close()


async def summary_vectors(database_url: str, session_id: str) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        return await conn.fetchval("SELECT count(*) FROM summary_vectors WHERE session_id = $1", uuid.UUID(session_id))
    finally:
        await conn.close()


def search(session_id: str, query: str, **fields) -> pb.SearchMemoryRequest:
    return pb.SearchMemoryRequest(session_id=session_id, query=query, limit=5, **fields)


# -- the semantic tier ---------------------------------------------------------------------------


async def test_a_paraphrase_sharing_no_word_finds_its_target(semantic_store, sim, store, profile, database_url):
    stub = await semantic_store(sim)
    session_id = await session_with_chunks(stub, profile, [*DISTRACTORS, TARGET])
    # Indexed after the write, in the background: the write itself never waited for the embedder.
    assert await until(async_equals(lambda: vectors(database_url, session_id), 5))

    found = await stub.SearchMemory(search(session_id, PARAPHRASE))
    assert found.semantic
    assert [c.content for c in found.chunks] == [TARGET]  # the distractors are unrelated: below the floor
    assert found.chunks[0].similarity > 0.9 and found.chunks[0].score == pytest.approx(
        (found.chunks[0].similarity - 0.5) / 0.5
    )
    # The lexical tier alone (the shared store has no embedding model) finds nothing: no shared word.
    lexical = await store.SearchMemory(search(session_id, PARAPHRASE))
    assert not lexical.semantic and list(lexical.chunks) == []

    # Words and meaning together: an exact phrase still comes first, with its lexical score.
    exact = await stub.SearchMemory(search(session_id, "Lunch order"))
    assert exact.chunks[0].content == DISTRACTORS[1] and exact.chunks[0].score >= 2.0


async def test_a_compression_is_indexed_after_it_commits(semantic_store, sim, profile, database_url):
    stub = await semantic_store(sim)
    session_id = (await stub.CreateSession(pb.CreateSessionRequest(profile_id=profile))).session.id
    summary = common_pb2.Message(role="user", content="Summary: a deploy went wrong.")
    committed = await stub.CommitCompression(
        pb.CommitCompressionRequest(
            session_id=session_id, summary=summary, chunks=[common_pb2.RawChunk(content=TARGET)]
        )
    )
    assert committed.chunks_indexed == 1
    assert await until(async_equals(lambda: vectors(database_url, session_id), 1))
    found = await stub.SearchMemory(search(session_id, PARAPHRASE))
    assert [c.content for c in found.chunks] == [TARGET]


async def test_an_embedder_down_falls_back_to_the_lexical_tier_and_is_retried(
    semantic_store, sim, store, profile, database_url
):
    stub = await semantic_store(sim, embed_retry_s=30.0)
    sim.set_embed_fault(status=503)
    before = len(sim.bodies("/api/embed"))
    session_id = await session_with_chunks(stub, profile, [*DISTRACTORS, TARGET])  # the save succeeds
    # The indexer tried (other tests' chunks waiting too, maybe) and failed: it backs off.
    assert await until(lambda: len(sim.bodies("/api/embed")) > before)

    for query in ("database password", PARAPHRASE, "pizzas"):
        fallback = await stub.SearchMemory(search(session_id, query))
        lexical = await store.SearchMemory(search(session_id, query))
        assert not fallback.semantic
        assert [(c.id, c.score) for c in fallback.chunks] == [(c.id, c.score) for c in lexical.chunks]
    # Backing off: the embedder answers again, but for 30 s nothing asks it.
    sim.set_embed_fault()
    asked = len(sim.bodies("/api/embed"))
    assert not (await stub.SearchMemory(search(session_id, PARAPHRASE))).semantic
    assert len(sim.bodies("/api/embed")) == asked
    assert await vectors(database_url, session_id) == 0


async def test_after_the_back_off_the_indexer_retries_by_itself(semantic_store, sim, profile, database_url):
    stub = await semantic_store(sim, embed_retry_s=0.5)
    sim.set_embed_fault(status=500)
    session_id = await session_with_chunks(stub, profile, [TARGET])
    assert await until(lambda: tried(sim, TARGET))
    sim.set_embed_fault()
    # No write, no search pokes it: the indexer comes back after the back-off on its own.
    assert await until(async_equals(lambda: vectors(database_url, session_id), 1))
    assert (await stub.SearchMemory(search(session_id, PARAPHRASE))).semantic


async def test_a_slow_embedder_costs_a_search_its_timeout_at_most(semantic_store, sim, store, profile):
    stub = await semantic_store(sim, embed_timeout_s=0.3)
    sim.set_embed_fault(delay=5.0)
    session_id = await session_with_chunks(stub, profile, [*DISTRACTORS, TARGET])
    started = time.monotonic()
    found = await stub.SearchMemory(search(session_id, "database password"))
    took = time.monotonic() - started
    assert not found.semantic and [c.content for c in found.chunks] == [TARGET]
    assert took < 2.0, took  # the timeout (0.3 s) plus the lexical query, not the embedder's 5 s
    # And the next search does not ask the embedder at all: it is backing off.
    asked = sum("database password" in body.get("input", []) for body in sim.bodies("/api/embed"))
    assert not (await stub.SearchMemory(search(session_id, "database password"))).semantic
    assert sum("database password" in body.get("input", []) for body in sim.bodies("/api/embed")) == asked
    sim.set_embed_fault()


async def test_a_new_embedding_space_is_rebuilt_once_in_the_background(semantic_store, sim, profile, database_url):
    # A model of its own: a space's change of size drops the model's vectors in the whole database,
    # and tests running beside this one (another worker, the same database) use EMBED_MODEL.
    model = f"{EMBED_MODEL}-repulled-{uuid.uuid4().hex[:8]}"
    sim.models[model] = replace(sim.models[EMBED_MODEL])
    stub = await semantic_store(sim, embed_model=model)
    session_id = await session_with_chunks(stub, profile, [*DISTRACTORS, TARGET])
    assert await until(async_equals(lambda: vectors(database_url, session_id, model, dimensions=256), 5))
    # The model is re-pulled and now answers 128 dimensions: its vectors are rebuilt in that space.
    sim.models[model] = replace(sim.models[model], embedding_length=128)
    first = await stub.SearchMemory(search(session_id, PARAPHRASE))
    assert list(first.chunks) == [] or first.chunks[0].content == TARGET
    assert await until(async_equals(lambda: vectors(database_url, session_id, model, dimensions=128), 5))
    assert await vectors(database_url, session_id, model, dimensions=256) == 0
    assert [c.content for c in (await stub.SearchMemory(search(session_id, PARAPHRASE))).chunks] == [TARGET]

    # Another model in the settings: the old model's vectors go at start, the new ones are built.
    other = await semantic_store(sim, embed_model="qwen3.6")
    assert await until(async_equals(lambda: vectors(database_url, session_id, model="qwen3.6"), 5))
    assert await vectors(database_url, session_id) == 0
    assert [c.content for c in (await other.SearchMemory(search(session_id, PARAPHRASE))).chunks] == [TARGET]


async def test_a_profiles_embedding_model_is_indexed_when_searched(semantic_store, sim, profile, database_url):
    stub = await semantic_store(sim)
    session_id = await session_with_chunks(stub, profile, [*DISTRACTORS, TARGET])
    first = await stub.SearchMemory(search(session_id, PARAPHRASE, embed_model="tiny"))
    assert first.semantic  # embedded in "tiny", whose index is being built from now on
    assert await until(async_equals(lambda: vectors(database_url, session_id, model="tiny"), 5))
    found = await stub.SearchMemory(search(session_id, PARAPHRASE, embed_model="tiny"))
    assert [c.content for c in found.chunks] == [TARGET]


async def test_auto_recall_finds_by_meaning(semantic_store, sim, base_settings, profiles_file, database_url):
    """The Agent's recall before a turn goes through the same SearchMemory ranking: a question in
    other words brings the compressed-away passage back into the prompt."""
    from palimpsest.agent.app import start_agent
    from palimpsest.compressor.app import start_compressor
    from palimpsest.v1 import agent_pb2 as agent_pb
    from palimpsest.v1 import agent_pb2_grpc

    stub = await semantic_store(sim)
    store_address = semantic_store.address_of(stub)
    compressor = await start_compressor(replace(base_settings, ollama_host=sim.url, store_addr=store_address), port=0)
    agent = await start_agent(
        replace(
            base_settings,
            ollama_host=sim.url,
            store_addr=store_address,
            compressor_addr=compressor.address,
            profiles_path=profiles_file,
        ),
        port=0,
    )
    try:
        session_id = (await stub.CreateSession(pb.CreateSessionRequest(profile_id="small"))).session.id
        await stub.AppendMessages(
            pb.AppendMessagesRequest(
                session_id=session_id,
                messages=[
                    common_pb2.Message(
                        role="user",
                        content="[Summary] We looked into last week's incident.",
                        is_summary=True,
                        explicit_flags=True,
                        is_context=True,
                        is_display=False,
                    )
                ],
            )
        )
        await stub.IndexChunks(
            pb.IndexChunksRequest(
                session_id=session_id,
                chunks=[
                    common_pb2.RawChunk(content=f"user: {TARGET}; we rotated it at 14:02"),
                    *[common_pb2.RawChunk(content=d) for d in DISTRACTORS],
                ],
            )
        )
        assert await until(async_equals(lambda: vectors(database_url, session_id), 5))
        async with grpc.aio.insecure_channel(agent.address) as channel:
            events = [
                e
                async for e in agent_pb2_grpc.AgentStub(channel).RunStream(
                    agent_pb.RunStreamRequest(
                        text="Why did our release fail? Postgres credentials lapsed?", session_id=session_id
                    )
                )
            ]
        assert any(e.HasField("stream_end") for e in events)
        prompt = " ".join(m["content"] for m in sim.bodies()[-1]["messages"])
        assert "Recalled from earlier" in prompt and "rotated it at 14:02" in prompt
        assert not any(d in prompt for d in DISTRACTORS)
    finally:
        await agent.stop(0)
        await compressor.stop(0)


async def test_sessions_are_found_by_the_meaning_of_their_summaries(semantic_store, sim, store, profile, database_url):
    stub = await semantic_store(sim)
    ids = {}
    for name, summary in (("incident", f"Summary: {TARGET}."), ("team lunch", f"Summary: {DISTRACTORS[1]}.")):
        session_id = (await stub.CreateSession(pb.CreateSessionRequest(profile_id=profile, name=name))).session.id
        await stub.CommitCompression(
            pb.CommitCompressionRequest(session_id=session_id, summary=common_pb2.Message(role="user", content=summary))
        )
        ids[name] = session_id
    # Embedded after the compression committed, in the background.
    assert await until(lambda: summary_vectors(database_url, ids["incident"]))
    assert await until(lambda: summary_vectors(database_url, ids["team lunch"]))

    found = await stub.ListSessions(pb.ListSessionsRequest(profile_id=profile, query=PARAPHRASE))
    assert found.semantic and [s.id for s in found.sessions] == [ids["incident"]] and found.total == 1
    words = await store.ListSessions(pb.ListSessionsRequest(profile_id=profile, query=PARAPHRASE))
    assert not words.semantic and list(words.sessions) == []  # no word of the query is in either session
    # Words still find what they found: the name.
    named = await stub.ListSessions(pb.ListSessionsRequest(profile_id=profile, query="team lunch"))
    assert [s.id for s in named.sessions] == [ids["team lunch"]]


async def message_vectors(database_url: str, session_id: str) -> list[int]:
    conn = await asyncpg.connect(database_url)
    try:
        return [
            r["seq"]
            for r in await conn.fetch(
                "SELECT seq FROM message_vectors WHERE session_id = $1 AND model = $2 ORDER BY seq",
                uuid.UUID(session_id),
                EMBED_MODEL,
            )
        ]
    finally:
        await conn.close()


async def test_sessions_never_compressed_are_found_by_the_meaning_of_their_messages(
    semantic_store, sim, store, profile, database_url
):
    stub = await semantic_store(sim)
    ids = {}
    for name, words in (("incident", TARGET), ("lunch", DISTRACTORS[1]), ("car", DISTRACTORS[2])):
        session_id = (await stub.CreateSession(pb.CreateSessionRequest(profile_id=profile, name=name))).session.id
        await stub.AppendMessages(
            pb.AppendMessagesRequest(
                session_id=session_id,
                messages=[
                    common_pb2.Message(role="user", content=words),
                    common_pb2.Message(
                        role="assistant",
                        content="",
                        tool_calls=[common_pb2.ToolCall(id="c1", name="run_command", arguments_json="{}")],
                    ),
                    common_pb2.Message(role="tool", name="run_command", tool_call_id="c1", content="exit 0"),
                    common_pb2.Message(role="assistant", content="Noted."),
                ],
            )
        )
        ids[name] = session_id
    # Embedded in the background: the user's and the assistant's text, not the tool row or the
    # call without text.
    assert await until(async_equals(lambda: message_vectors(database_url, ids["car"]), [1, 4]))
    assert await until(async_equals(lambda: message_vectors(database_url, ids["incident"]), [1, 4]))

    found = await stub.ListSessions(
        pb.ListSessionsRequest(profile_id=profile, query=PARAPHRASE, sort_by=pb.SORT_BY_RELEVANCE)
    )
    assert found.semantic and [s.id for s in found.sessions] == [ids["incident"]]
    # One word of two is no lexical match; with the other's meaning ("automobile": a car) it is.
    tyres = await stub.ListSessions(
        pb.ListSessionsRequest(profile_id=profile, query="automobile tyres", sort_by=pb.SORT_BY_RELEVANCE)
    )
    assert [s.id for s in tyres.sessions] == [ids["car"]]
    assert (await store.ListSessions(pb.ListSessionsRequest(profile_id=profile, query="automobile tyres"))).total == 0

    # A trim takes the trimmed messages out of search by meaning too.
    await stub.TrimSession(pb.TrimSessionRequest(session_id=ids["incident"], keep=1))
    assert await message_vectors(database_url, ids["incident"]) == [4]
    gone = await stub.ListSessions(pb.ListSessionsRequest(profile_id=profile, query=PARAPHRASE))
    assert ids["incident"] not in [s.id for s in gone.sessions]


async def test_an_append_wakes_the_indexer_for_messages_only():
    """Appends come several a turn: their poke must not ask the chunks' question, which reads
    every chunk; a compression's poke (or a failed pass) asks everything."""
    from palimpsest.store.semantic import Embedder, MemoryIndex

    asked: list[str] = []

    class Vectors:
        async def spaces(self):
            return ["m"]

        async def pending(self, model, limit):
            asked.append("chunks")
            return []

        async def pending_summaries(self, model, limit):
            asked.append("summaries")
            return []

        async def pending_messages(self, model, limit, quiet_s=0.0):
            asked.append("messages")
            return []

        store = store_summaries = store_messages = None  # nothing pending: never called

    index = MemoryIndex(
        Vectors(),
        Embedder(None, retry_s=1.0),
        model="m",
        query_timeout_s=1.0,  # type: ignore[arg-type]
        min_similarity=0.5,
    )
    assert await index._index_pending(everything=False) is None and asked == ["messages"]
    asked.clear()
    assert await index._index_pending() is None and asked == ["chunks", "summaries", "messages"]
    index.enabled = True
    index._everything = False
    index.poke(messages_only=True)
    assert not index._everything
    index.poke()
    assert index._everything

    # With a quiet period, an append schedules the messages' pass for when its session is quiet;
    # later appends do not push it back (a busy store still gets its passes).
    now = [100.0]
    quiet = MemoryIndex(
        Vectors(),
        Embedder(None, retry_s=1.0, clock=lambda: now[0]),  # type: ignore[arg-type]
        model="m",
        query_timeout_s=1.0,
        min_similarity=0.5,
        messages_quiet_s=10.0,
    )
    quiet.enabled, quiet._everything = True, False
    quiet.poke(messages_only=True)
    assert quiet._messages_due == 111.0 and not quiet._everything
    now[0] = 105.0
    quiet.poke(messages_only=True)
    assert quiet._messages_due == 111.0


async def test_messages_wait_until_their_session_is_quiet(store, profile, database_url, has_pgvector):
    """Not embedded during a turn (the embedder would share Ollama with the model answering): a
    session's messages are pending only once it has been quiet for the setting's seconds."""
    from palimpsest.store.repository.vectors import MemoryVectors

    if not has_pgvector:
        pytest.skip("no pgvector: no message vectors")
    session_id = (await store.CreateSession(pb.CreateSessionRequest(profile_id=profile))).session.id
    await store.AppendMessages(
        pb.AppendMessagesRequest(session_id=session_id, messages=[common_pb2.Message(role="user", content=TARGET)])
    )
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
    vectors = MemoryVectors(pool)
    model = f"quiet-{uuid.uuid4().hex[:8]}"  # a space of this test alone
    await vectors.keep_space(model, from_settings=False)

    async def pending(quiet_s: float) -> bool:
        return uuid.UUID(session_id) in {
            r["session_id"] for r in await vectors.pending_messages(model, 10_000, quiet_s)
        }

    try:
        assert await pending(0.0) and not await pending(3600.0)  # just written: in its turn
        await pool.execute(
            "UPDATE sessions SET last_active = now() - interval '2 hours' WHERE id = $1", uuid.UUID(session_id)
        )
        assert await pending(3600.0)
    finally:
        await pool.execute("DELETE FROM memory_vector_spaces WHERE model = $1", model)
        await pool.close()


def test_a_message_batch_marks_how_far_each_session_is_embedded():
    a, b, c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    rows = [
        {"session_id": a, "last": 9, "seq": None, "content": None},  # only tool rows past its mark
        {"session_id": b, "last": 7, "seq": 2, "content": "x" * 5000},
        {"session_id": b, "last": 7, "seq": 5, "content": "five"},
        {"session_id": c, "last": 30, "seq": 11, "content": "eleven"},
        {"session_id": c, "last": 30, "seq": 12, "content": "twelve"},
    ]
    keys, texts, marks = message_batch(rows, 3)
    assert keys == [(b, 2), (b, 5), (c, 11)] and texts[1:] == ["five", "eleven"]
    assert len(texts[0]) == MESSAGE_EMBED_CHARS
    # a: nothing to embed, done through its last row; b: all taken; c: cut short after seq 11.
    assert marks == [(a, 9), (b, 7), (c, 11)]


async def test_a_bad_embedding_model_name_is_invalid_argument(store, profile):
    session_id = (await store.CreateSession(pb.CreateSessionRequest(profile_id=profile))).session.id
    for bad in ("two words", "x" * 201, "tab\tmodel"):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await store.SearchMemory(search(session_id, "anything", embed_model=bad))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "embed_model" in caught.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await store.ListSessions(pb.ListSessionsRequest(query="anything", embed_model=bad))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "embed_model" in caught.value.details()


# -- without pgvector ----------------------------------------------------------------------------


async def test_without_pgvector_the_store_says_so_once_and_searches_lexically(
    base_settings, database_url, has_pgvector, sim, store, profile, caplog
):
    if has_pgvector:
        pytest.skip("this PostgreSQL has pgvector (run with TEST_DATABASE_URL on a server without it)")
    caplog.set_level(logging.INFO, logger="palimpsest.store.semantic")
    server = await _start_store(replace(base_settings, ollama_host=sim.url, embed_model=EMBED_MODEL), database_url)
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = session_store_pb2_grpc.SessionStoreStub(channel)
            session_id = await session_with_chunks(stub, profile, [*DISTRACTORS, TARGET])
            for query in ("database password", PARAPHRASE):
                found = await stub.SearchMemory(search(session_id, query))
                lexical = await store.SearchMemory(search(session_id, query))
                assert not found.semantic
                assert [(c.id, c.score) for c in found.chunks] == [(c.id, c.score) for c in lexical.chunks]
    finally:
        await server.stop(0)
    said = [r.getMessage() for r in caplog.records if "semantic memory search is off" in r.getMessage()]
    assert len(said) == 1 and "pgvector" in said[0]
    assert sim.bodies("/api/embed") == []  # nothing embedded that no index could hold


def tried(sim: OllamaSimulator, text: str) -> bool:
    """Whether an /api/embed request carried `text` (the indexer also embeds other tests' chunks)."""
    return any(text in body.get("input", []) for body in sim.bodies("/api/embed"))


def async_equals(read, expected):
    async def check() -> bool:
        return await read() == expected

    return check

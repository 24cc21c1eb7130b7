"""A session's display name: its first words at once, the model's short title after the first answer
(off the client's path), and the first words kept whenever the title cannot be had."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest

from ollama_sim import Reply
from palimpsest.agent.titles import TITLE_MAX_CHARS, clean_title, title_first_words
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import agent_pb2_grpc
from palimpsest.v1 import session_store_pb2 as store_pb
from tests.conftest import agent_settings


@pytest.mark.parametrize(
    "raw, title",
    [
        ("Debugging the nginx 502s", "Debugging the nginx 502s"),
        ('"Postgres vacuum tuning."\n', "Postgres vacuum tuning"),
        ("Title: Kubernetes probes explained", "Kubernetes probes explained"),
        ("## **Rust lifetimes**\nsome chatter after", "Rust lifetimes"),
        ("\n\n  « Recette de crêpes »  ", "Recette de crêpes"),
        ("数据库迁移问题。", "数据库迁移问题"),
        ("Deploy 🚀 checklist", "Deploy 🚀 checklist"),
        ("   \n  ", ""),
        ('""', ""),
    ],
)
def test_a_models_answer_is_cleaned_into_a_name(raw, title):
    assert clean_title(raw) == title


def test_a_long_title_is_cut_at_a_word():
    name = clean_title("word " * 40)
    assert len(name) <= TITLE_MAX_CHARS and name.endswith("word") and "  " not in name
    assert len(clean_title("x" * 200)) == TITLE_MAX_CHARS  # one long word: cut where it must


@pytest.fixture(scope="module")
async def titled(base_settings, store_server, compressor_server, ollama_sim, profiles_file):
    """An Agent with titles on (the shared test Agent has them off: they add a model call)."""
    from palimpsest.agent.app import start_agent

    running = await start_agent(
        agent_settings(base_settings, store_server, compressor_server, ollama_sim, profiles_file, session_titles=True),
        port=0,
    )
    async with grpc.aio.insecure_channel(running.address) as channel:
        yield running, agent_pb2_grpc.AgentStub(channel)
    await running.stop(0)


async def turn(agent, text: str, session_id: str = "") -> list[pb.AgentEvent]:
    return [e async for e in agent.RunStream(pb.RunStreamRequest(text=text, session_id=session_id))]


async def settled(running) -> None:
    await asyncio.gather(*running.servicer.deps.post_turn_tasks)


def is_title_call(body) -> bool:
    return body.get("stream") is False and "title" in body["messages"][0]["content"]


async def name_of(store, session_id: str) -> str:
    return (
        await store.GetSession(store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_SUMMARY))
    ).session.name


async def test_a_new_session_is_named_by_the_model_after_its_first_answer(titled, store, ollama_sim):
    running, agent = titled
    question = "my nginx returns 502 behind the load balancer since this morning, what should I look at first?"
    ollama_sim.set_responder(
        lambda body: (
            Reply(text='Title: "Nginx 502 errors."')
            if is_title_call(body)
            else Reply(text="Check the upstream health first.")
        )
    )
    try:
        events = await turn(agent, question)
        session_id = events[0].session_id
        assert events[-1].stream_end.reason == pb.STREAM_END_REASON_COMPLETED
        assert not any(e.HasField("session_renamed") for e in events)  # off the client's path
        watch = agent.WatchSession(pb.WatchSessionRequest(session_id=session_id))
        await settled(running)
        assert await name_of(store, session_id) == "Nginx 502 errors"
        asks = [b for b in ollama_sim.bodies() if is_title_call(b)]
        assert len(asks) == 1
        chat = [b for b in ollama_sim.bodies() if b.get("stream") is not False][-1]
        # The conversation's own num_ctx (another would make Ollama reload the model), a short answer.
        assert asks[0]["options"]["num_ctx"] == chat["options"]["num_ctx"]
        assert 0 < asks[0]["options"]["num_predict"] <= 32
        assert question in asks[0]["messages"][1]["content"] and "upstream health" in asks[0]["messages"][1]["content"]
        # A later turn asks for no title again.
        await turn(agent, "and then?", session_id)
        await settled(running)
        assert len([b for b in ollama_sim.bodies() if is_title_call(b)]) == 1
        watch.cancel()
    finally:
        ollama_sim.set_responder(None)


async def test_a_watcher_hears_of_the_title(titled, store, ollama_sim):
    running, agent = titled
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="default"))).session
    watch = agent.WatchSession(pb.WatchSessionRequest(session_id=session.id))
    await watch.initial_metadata()
    ollama_sim.set_responder(
        lambda body: Reply(text="Weekend hiking plan") if is_title_call(body) else Reply(text="Take water.")
    )
    try:
        await turn(agent, "plan a hike for saturday", session.id)
        names = []
        while len(names) < 2:
            event = await asyncio.wait_for(watch.read(), timeout=30)
            if event.HasField("session_renamed"):
                names.append(event.session_renamed.name)
        assert names == ["plan a hike for saturday", "Weekend hiking plan"]
    finally:
        ollama_sim.set_responder(None)
        watch.cancel()


async def test_without_a_title_the_first_words_stay(titled, store, ollama_sim):
    running, agent = titled
    words = "explain the difference between a mutex and a semaphore with an example in C please"
    for title_reply in (Reply(http_status=500, error="out of memory"), Reply(text="  \n")):
        ollama_sim.set_responder(lambda body, r=title_reply: r if is_title_call(body) else Reply(text="Sure."))
        try:
            events = await turn(agent, words)
            await settled(running)
        finally:
            ollama_sim.set_responder(None)
        assert events[-1].stream_end.reason == pb.STREAM_END_REASON_COMPLETED
        assert await name_of(store, events[0].session_id) == title_first_words(words)


async def test_a_rename_while_the_title_is_made_wins(titled, store, ollama_sim):
    running, agent = titled
    asked, release = threading.Event(), threading.Event()

    def responder(body):
        if is_title_call(body):
            asked.set()
            release.wait(30)  # the simulator's handler thread holds the title until the rename is in
            return Reply(text="A title nobody wants")
        return Reply(text="Done.")

    ollama_sim.set_responder(responder)
    try:
        events = await turn(agent, "rename race")
        session_id = events[0].session_id
        assert await asyncio.to_thread(asked.wait, 30)
        await store.UpdateSession(store_pb.UpdateSessionRequest(session_id=session_id, name="Mine"))
        release.set()
        await settled(running)
    finally:
        release.set()
        ollama_sim.set_responder(None)
    assert await name_of(store, session_id) == "Mine"


async def test_a_session_that_already_has_a_name_is_not_titled(titled, store, ollama_sim):
    running, agent = titled
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="default", name="Chosen"))).session
    before = len([b for b in ollama_sim.bodies() if is_title_call(b)])
    await turn(agent, "hello there", session.id)
    await settled(running)
    assert await name_of(store, session.id) == "Chosen"
    assert len([b for b in ollama_sim.bodies() if is_title_call(b)]) == before

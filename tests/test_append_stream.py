"""The Agent's append stream (a turn's appends on one SessionStore.AppendStream call) against a real
store through a TCP relay: a connection lost between two appends, an append whose answer is lost,
and the turn's end."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from palimpsest.v1 import common_pb2, session_store_pb2 as pb
from palimpsest.v1.session_store_pb2_grpc import SessionStoreStub
from services.agent.conversation import StoredConversation
from services.shared.channels import open_channel
from tests.relay import Relay
from tests.test_store_sessions import full
from tests.waiting import until

Message = common_pb2.Message


@asynccontextmanager
async def conversation_through_relay(base_settings, store_server, store, profile):
    """A new session, and the Agent's conversation with it over a service channel through a relay."""
    session = (await store.CreateSession(pb.CreateSessionRequest(profile_id=profile))).session
    host, port = store_server.address.rsplit(":", 1)
    relay = Relay((host, int(port)))
    await relay.start()
    channel = open_channel(f"127.0.0.1:{relay.port}", base_settings, service="SessionStore")
    try:
        conv = StoredConversation(SessionStoreStub(channel), session.id)
        await conv.load()
        yield relay, conv, session.id
    finally:
        relay.thaw()
        await channel.close()


async def stored(store, session_id: str) -> list[str]:
    return [m.content for m in (await full(store, session_id)).messages]


async def stored_has(store, session_id: str, content: str) -> bool:
    return content in await stored(store, session_id)


async def test_a_stream_lost_between_two_appends_is_opened_again_and_the_next_append_lands(
        base_settings, store_server, store, profile):
    async with conversation_through_relay(base_settings, store_server, store, profile) as (relay, conv, session_id):
        await conv.append([Message(role="user", content="before the cut")])
        assert conv.appends.open
        await relay.cut()  # a store replica restarting while the model answers
        await relay.start()
        assert await until(lambda: not conv.appends.open)  # the call has learnt it is over
        # No retries asked for: the write on the ended call never left, so it goes on a new one.
        await conv.append([Message(role="assistant", content="after the cut")])
        assert await stored(store, session_id) == ["before the cut", "after the cut"]
        assert conv.appends.open


async def test_an_append_whose_answer_is_lost_is_retried_on_a_new_stream_and_stored_once(
        base_settings, store_server, store, profile):
    async with conversation_through_relay(base_settings, store_server, store, profile) as (relay, conv, session_id):
        await conv.append([Message(role="user", content="a question")])
        relay.hold_answers()  # the store acts on what it gets; its answers do not come back
        answer = asyncio.create_task(conv.append([Message(role="assistant", content="the answer")],
                                                 retry_for=30, attempt_timeout=0.5))
        assert await until(lambda: stored_has(store, session_id, "the answer"))
        assert not answer.done()
        relay.thaw()
        seqs = await answer
        assert await stored(store, session_id) == ["a question", "the answer"]  # once, under its key
        assert seqs == [2] and conv.next_seq == 3


async def test_the_turns_end_ends_the_stream_and_a_later_append_is_a_call_of_its_own(
        base_settings, store_server, store, profile):
    async with conversation_through_relay(base_settings, store_server, store, profile) as (relay, conv, session_id):
        await conv.append([Message(role="user", content="in the turn")])
        await conv.done_appending()
        assert not conv.appends.open
        await conv.append([Message(role="assistant", content="after the turn")])  # (the post-turn pass)
        assert not conv.appends.open
        assert await stored(store, session_id) == ["in the turn", "after the turn"]

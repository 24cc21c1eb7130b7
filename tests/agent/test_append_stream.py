"""The Agent's append stream (a turn's appends on one SessionStore.AppendStream call) against a real
store through a TCP relay: a connection lost between two appends, an append whose answer is lost,
and the turn's end."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from dataclasses import replace
from random import Random

import grpc
import pytest

from palimpsest.agent.conversation import StoredConversation
from palimpsest.shared.auth import serve_caller
from palimpsest.shared.channels import open_channel
from palimpsest.shared.errors import PalimpsestError, PermissionDenied, Unavailable
from palimpsest.shared.stopping import Stopping
from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as pb
from palimpsest.v1.session_store_pb2_grpc import SessionStoreStub
from tests.conftest import JWT_SECRET, bearer
from tests.helpers.calls import full
from tests.helpers.relay import Relay
from tests.helpers.waiting import until

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
    base_settings, store_server, store, profile
):
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
    base_settings, store_server, store, profile
):
    async with conversation_through_relay(base_settings, store_server, store, profile) as (relay, conv, session_id):
        await conv.append([Message(role="user", content="a question")])
        relay.hold_answers()  # the store acts on what it gets; its answers do not come back
        answer = asyncio.create_task(
            conv.append([Message(role="assistant", content="the answer")], retry_for=30, attempt_timeout=0.5)
        )
        assert await until(lambda: stored_has(store, session_id, "the answer"))
        assert not answer.done()
        relay.thaw()
        seqs = await answer
        assert await stored(store, session_id) == ["a question", "the answer"]  # once, under its key
        assert seqs == [2] and conv.next_seq == 3


async def test_an_append_that_failed_but_landed_does_not_make_the_next_one_stale(
    base_settings, store_server, store, profile
):
    """An append that timed out may still have been stored (its answer lost): the conversation's
    revision is then behind the store's, and the next append is refused as stale. It reloads and
    tries once more rather than failing the write (seen as a flake of the hang test below)."""
    async with conversation_through_relay(base_settings, store_server, store, profile) as (relay, conv, session_id):
        conv.timeout = 1.0
        relay.hold_answers()  # the store stores it; the answer does not come back
        with pytest.raises(Unavailable):
            await conv.append([Message(role="user", content="stored unseen")])
        assert await until(lambda: stored_has(store, session_id, "stored unseen"))
        relay.thaw()
        await conv.append([Message(role="user", content="the next one")])
        assert await stored(store, session_id) == ["stored unseen", "the next one"]
        assert conv.reloads == 1 and [m.content for m in conv.context] == ["stored unseen", "the next one"]


async def test_the_turns_end_ends_the_stream_and_a_later_append_is_a_call_of_its_own(
    base_settings, store_server, store, profile
):
    async with conversation_through_relay(base_settings, store_server, store, profile) as (relay, conv, session_id):
        await conv.append([Message(role="user", content="in the turn")])
        await conv.done_appending()
        assert not conv.appends.open
        await conv.append([Message(role="assistant", content="after the turn")])  # (the post-turn pass)
        assert not conv.appends.open
        assert await stored(store, session_id) == ["in the turn", "after the turn"]


async def test_the_turns_end_does_not_wait_on_a_store_that_hangs(base_settings, store_server, store, profile):
    async with conversation_through_relay(base_settings, store_server, store, profile) as (relay, conv, session_id):
        await conv.append([Message(role="user", content="a question")])
        relay.freeze()  # the store's link dies after the turn's last answered append
        async with asyncio.timeout(10):  # (it waited on keepalives, about 60 s, holding the session)
            await conv.done_appending()
        assert not conv.appends.open
        relay.thaw()
        assert await stored(store, session_id) == ["a question"]


async def test_an_append_on_a_store_that_hangs_fails_at_its_timeout(base_settings, store_server, store, profile):
    async with conversation_through_relay(base_settings, store_server, store, profile) as (relay, conv, session_id):
        conv.timeout = 1.0  # (the Agent gives its PALIMPSEST_RPC_TIMEOUT_SECONDS)
        relay.freeze()
        with pytest.raises(Unavailable, match="did not answer an append within 1 s"):
            async with asyncio.timeout(20):
                await conv.append([Message(role="user", content="into the void")])
        relay.thaw()
        await conv.append([Message(role="user", content="once it is back")])
        contents = await stored(store, session_id)
        assert contents[-1] == "once it is back" and len(contents) <= 2


async def test_an_append_for_another_caller_never_rides_on_the_stream_opened_for_the_first(
    base_settings, store_server_auth, store_auth, profile
):
    alice, bob = bearer("stream-alice"), bearer("stream-bob")
    session = (await store_auth.CreateSession(pb.CreateSessionRequest(profile_id=profile), metadata=alice)).session
    settings = replace(base_settings, auth_enabled=True, jwt_secret=JWT_SECRET)
    async with open_channel(store_server_auth.address, settings, service="SessionStore") as channel:
        conv = StoredConversation(SessionStoreStub(channel), session.id)
        serve_caller(alice)
        await conv.load()
        await conv.append([Message(role="user", content="alice's")])
        assert conv.appends.open
        serve_caller(bob)  # (the same task serving another caller: its appends carry bob's token)
        with pytest.raises(PermissionDenied):
            await conv.append([Message(role="user", content="bob's")])
    contents = [
        m.content
        for m in (
            await store_auth.GetSession(
                pb.GetSessionRequest(session_id=session.id, view=pb.SESSION_VIEW_FULL), metadata=alice
            )
        ).session.messages
    ]
    assert contents == ["alice's"]


async def test_a_stopping_store_ends_an_idle_append_stream_and_the_next_append_goes_elsewhere(
    base_settings, database_url, store, profile
):
    """A turn's stream open on a replica that stops: the stop does not wait out its grace for it,
    and the turn's next append lands on the replica that is left (the relay is the address both
    stand behind, as a Kubernetes Service is)."""
    from palimpsest.store.app import start_store

    stopping = await start_store(base_settings, port=0, dsn=database_url)
    staying = await start_store(base_settings, port=0, dsn=database_url)
    session = (await store.CreateSession(pb.CreateSessionRequest(profile_id=profile))).session
    relay = Relay(("127.0.0.1", stopping.port))
    await relay.start()
    try:
        async with open_channel(f"127.0.0.1:{relay.port}", base_settings, service="SessionStore") as channel:
            conv = StoredConversation(SessionStoreStub(channel), session.id)
            await conv.load()
            await conv.append([Message(role="user", content="before the stop")])
            relay.target = ("127.0.0.1", staying.port)  # new connections go to the replica that stays
            async with asyncio.timeout(10):  # a grace of 60 s: only the stream's end can make it short
                await stopping.stop(60)
            assert await until(lambda: not conv.appends.open)
            await conv.append([Message(role="assistant", content="after the stop")])
        assert await stored(store, session.id) == ["before the stop", "after the stop"]
    finally:
        for running in (stopping, staying):
            if not running.stopping:
                await running.stop(0)


async def test_answers_written_as_their_idle_streams_end_are_all_stored_once(
    base_settings, store_server, store, profile
):
    """The replica a turn's stream is on stops just as the answer is written (its drain ends the
    streams waiting between appends): gRPC can fail that write under any status, INTERNAL among
    them, and the answer must still be sent again and stored, once (200 turns, the timing varied)."""
    session = (await store.CreateSession(pb.CreateSessionRequest(profile_id=profile))).session
    servicer = store_server.servicer
    failures: list[str] = []
    random = Random(7)
    async with open_channel(store_server.address, base_settings, service="SessionStore") as channel:
        try:
            for i in range(200):
                conv = StoredConversation(SessionStoreStub(channel), session.id, timeout=5.0)  # each turn its own
                await conv.load()
                await conv.append([Message(role="user", content=f"question {i}")])  # opens the stream
                ending, servicer.stopping = servicer.stopping, Stopping()  # (new streams: as on a replica that stays)
                ending.set()
                for _ in range(random.randrange(6)):  # (where the write falls against the stream's end)
                    await asyncio.sleep(0)
                try:
                    await conv.append([Message(role="assistant", content=f"answer {i}")], retry_for=5.0)
                except PalimpsestError as exc:
                    failures.append(f"{i}: {exc.code.name}: {exc}")
                await conv.done_appending()
        finally:
            servicer.stopping = Stopping()
    assert not failures, failures[:5]
    contents = await stored(store, session.id)
    assert contents == [text for i in range(200) for text in (f"question {i}", f"answer {i}")]


async def test_a_stopping_store_ends_a_stream_waiting_for_its_next_append_unavailable(store_server, store, profile):
    session = (await store.CreateSession(pb.CreateSessionRequest(profile_id=profile))).session
    servicer = store_server.servicer
    call = store.AppendStream()
    try:
        await call.write(pb.AppendMessagesRequest(session_id=session.id, messages=[Message(role="user", content="x")]))
        await call.read()
        ending, servicer.stopping = servicer.stopping, Stopping()
        ending.set()  # (what the store's drain does)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call.read()
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "stopping" in err.value.details()
    finally:
        servicer.stopping = Stopping()
    assert await stored(store, session.id) == ["x"]

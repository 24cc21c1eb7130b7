"""Messages between Agent replicas through the store (PublishSessionMessages, ListenSessionMessages):
what one store replica publishes reaches the listeners of every replica on the same PostgreSQL, in
order, whatever its size against NOTIFY's 8,000 bytes; a listen connection that drops ends its
listeners' streams and is opened again."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest

from palimpsest.store.session_bus import MAX_PAYLOAD_BYTES, Reassembly, notify_payloads
from palimpsest.v1 import session_store_pb2 as pb
from palimpsest.v1 import session_store_pb2_grpc
from tests.conftest import _start_store, bearer
from tests.helpers.bus_faults import drop_listen_connection
from tests.helpers.calls import expect_status
from tests.helpers.waiting import until


# -- parts ---------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [0, 1, 5_699, 5_700, 5_701, 200_000])
def test_a_message_of_any_size_travels_in_parts_under_notifys_limit_and_comes_back_whole(size):
    message = bytes(range(256)) * (size // 256) + bytes(size % 256)
    parts = notify_payloads(message, "m1")
    assert all(len(p.encode()) < 8000 for p in parts)
    assert len(set(parts)) == len(parts)  # PostgreSQL folds identical payloads of one transaction
    reassembly = Reassembly()
    assert [reassembly.add(p) for p in parts] == [None] * (len(parts) - 1) + [message]


def test_interleaved_and_damaged_parts_are_sorted_out_by_message():
    reassembly = Reassembly()
    a, b = notify_payloads(b"a" * 12_000, "a"), notify_payloads(b"b" * 12_000, "b")
    assert reassembly.add("not a part") is None
    assert reassembly.add("x:5:2:AAAA") is None  # a part number past the count
    done = [reassembly.add(p) for pair in zip(a, b) for p in pair]
    assert [d for d in done if d is not None] == [b"a" * 12_000, b"b" * 12_000]


# -- through the store -------------------------------------------------------------------------
def message(session_id: str, text: bytes, origin: str = "replica-a") -> pb.SessionMessage:
    return pb.SessionMessage(session_id=session_id, origin=origin, payload=text)


async def replies(call):
    """A listen's responses after its first (read with ``read``, as ``listening`` began it)."""
    while (reply := await call.read()) is not grpc.aio.EOF:
        yield reply


async def received(call, session_id: str, count: int) -> list[bytes]:
    """The next ``count`` payloads for ``session_id`` (other tests' sessions share the channel)."""
    found: list[bytes] = []
    async for reply in replies(call):
        found += [m.payload for m in reply.messages if m.session_id == session_id]
        if len(found) >= count:
            return found
    raise AssertionError(f"the listen ended after {len(found)} of {count}")


async def listening(store) -> grpc.aio.UnaryStreamCall:
    call = store.ListenSessionMessages(pb.ListenSessionMessagesRequest())
    first = await call.read()
    assert not first.messages  # the listen is in place
    return call


@pytest.fixture
async def second_store(base_settings, database_url):
    running = await _start_store(base_settings, database_url)
    async with grpc.aio.insecure_channel(running.address) as channel:
        yield running, session_store_pb2_grpc.SessionStoreStub(channel)
    await running.stop(0)


async def test_what_one_store_replica_publishes_every_replicas_listeners_get_in_order(store, second_store):
    _, other = second_store
    session_id = str(uuid.uuid4())
    here, there = await listening(store), await listening(other)
    big = bytes(range(256)) * 800  # 204,800 bytes: 36 NOTIFYs
    sent = [b"first", big, b"third"]
    await other.PublishSessionMessages(
        pb.PublishSessionMessagesRequest(messages=[message(session_id, p) for p in sent[:2]])
    )
    await store.PublishSessionMessages(pb.PublishSessionMessagesRequest(messages=[message(session_id, sent[2])]))
    assert await received(here, session_id, 3) == sent
    assert await received(there, session_id, 3) == sent
    here.cancel(), there.cancel()


async def test_a_dropped_listen_connection_ends_the_streams_and_is_opened_again(store_server, store, database_url):
    bus = store_server.servicer.bus
    call = await listening(store)
    dropped = await drop_listen_connection(bus, database_url)
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        async for _ in replies(call):
            pass
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE and "listen again" in ended.value.details()
    assert await until(lambda: bus.connection_pid not in (None, dropped))
    session_id = str(uuid.uuid4())
    again = await listening(store)
    await store.PublishSessionMessages(pb.PublishSessionMessagesRequest(messages=[message(session_id, b"after")]))
    assert await received(again, session_id, 1) == [b"after"]
    again.cancel()


@pytest.mark.parametrize(
    "messages, code, field",
    [
        ([], grpc.StatusCode.INVALID_ARGUMENT, "messages"),
        ([message("", b"x")], grpc.StatusCode.INVALID_ARGUMENT, "messages[0].session_id"),
        ([message(str(uuid.uuid4()), b"x", origin="")], grpc.StatusCode.INVALID_ARGUMENT, "messages[0].origin"),
        ([message(str(uuid.uuid4()), b"x", origin="o" * 129)], grpc.StatusCode.INVALID_ARGUMENT, "messages[0].origin"),
        (
            [message(str(uuid.uuid4()), b"x"), message(str(uuid.uuid4()), bytes(MAX_PAYLOAD_BYTES + 1))],
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "messages[1].payload",
        ),
    ],
)
async def test_a_bad_publish_is_refused_naming_its_field_and_nothing_is_sent(store, messages, code, field):
    watched = {m.session_id for m in messages}
    call = await listening(store)
    await expect_status(store.PublishSessionMessages(pb.PublishSessionMessagesRequest(messages=messages)), code, field)
    marker = str(uuid.uuid4())
    await store.PublishSessionMessages(pb.PublishSessionMessagesRequest(messages=[message(marker, b"marker")]))
    async for reply in replies(call):  # everything published before the marker has arrived by then
        assert not [m for m in reply.messages if m.session_id in watched and m.session_id]
        if any(m.session_id == marker for m in reply.messages):
            break
    call.cancel()


async def test_only_the_services_use_the_bus(store_auth):
    user = bearer("bus-user")
    await expect_status(
        store_auth.PublishSessionMessages(
            pb.PublishSessionMessagesRequest(messages=[message(str(uuid.uuid4()), b"x")]), metadata=user
        ),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    call = store_auth.ListenSessionMessages(pb.ListenSessionMessagesRequest(), metadata=user)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call.read()
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    service = bearer("palimpsest", role="service")
    await store_auth.PublishSessionMessages(
        pb.PublishSessionMessagesRequest(messages=[message(str(uuid.uuid4()), b"x")]), metadata=service
    )


async def test_a_store_stopping_ends_its_listeners_at_once(base_settings, database_url):
    running = await _start_store(base_settings, database_url)
    async with grpc.aio.insecure_channel(running.address) as channel:
        call = await listening(session_store_pb2_grpc.SessionStoreStub(channel))
        stopping = asyncio.create_task(running.stop(30))  # a grace the listen would otherwise use up
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            async for _ in replies(call):
                pass
        assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
        await asyncio.wait_for(stopping, 10)

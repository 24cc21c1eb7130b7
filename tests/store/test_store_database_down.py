"""PostgreSQL going away under a running SessionStore: calls fail UNAVAILABLE naming the database,
health says NOT_SERVING, and both recover when it comes back. The fault is real: the store reaches
PostgreSQL through a TCP relay on loopback that the test cuts and restores."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from urllib.parse import urlsplit, urlunsplit

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from palimpsest.v1 import session_store_pb2 as pb
from palimpsest.v1 import session_store_pb2_grpc
from tests.helpers.relay import Relay
from tests.helpers.waiting import until


async def _health(stub) -> int:
    return (await stub.Check(health_pb2.HealthCheckRequest(service=""))).status


@pytest.fixture
async def relayed_store(base_settings, database_url):
    from palimpsest.store.app import start_store

    parts = urlsplit(database_url)
    relay = Relay((parts.hostname or "127.0.0.1", parts.port or 5432))
    await relay.start()
    netloc = parts.netloc.rsplit("@", 1)
    dsn = urlunsplit(parts._replace(netloc=(netloc[0] + "@" if len(netloc) == 2 else "") + f"127.0.0.1:{relay.port}"))
    running = await start_store(replace(base_settings, db_command_timeout_s=3.0), port=0, dsn=dsn)
    try:
        yield running, relay
    finally:
        with contextlib.suppress(Exception):
            await relay.start()  # let the pool close cleanly
        await running.stop(0)


async def test_a_dead_database_is_unavailable_and_unhealthy_until_it_returns(relayed_store, profile):
    running, relay = relayed_store
    async with grpc.aio.insecure_channel(running.address) as channel:
        store = session_store_pb2_grpc.SessionStoreStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        await store.CreateSession(pb.CreateSessionRequest(profile_id=profile))
        assert await _health(health) == health_pb2.HealthCheckResponse.SERVING

        await relay.cut()
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await store.ListSessions(pb.ListSessionsRequest(profile_id=profile))
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE, error.value.details()
        assert f"PostgreSQL at 127.0.0.1:{relay.port}" in error.value.details()
        assert await until(lambda: _is(health, health_pb2.HealthCheckResponse.NOT_SERVING))

        await relay.start()
        assert await until(lambda: _is(health, health_pb2.HealthCheckResponse.SERVING))
        listed = await store.ListSessions(pb.ListSessionsRequest(profile_id=profile))
        assert listed.total == 1


async def _is(health, status: int) -> bool:
    return await _health(health) == status

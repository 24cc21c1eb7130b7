"""PALIMPSEST_MAX_CONNECTION_AGE_SECONDS: servers send clients away after a while so that a `dns:///`
target is resolved again (replicas added by an autoscaler get calls), without cutting any call."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from grpc_health.v1 import health_pb2, health_pb2_grpc

from palimpsest.shared.channels import open_channel
from palimpsest.shared.server import server_options, start_server
from palimpsest.shared.settings import Settings
from tests.helpers.relay import Relay

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class CountingRelay(Relay):
    """The relay, counting the TCP connections the client opens."""

    def __init__(self, target):
        super().__init__(target)
        self.connections = 0

    async def _serve(self, reader, writer) -> None:
        self.connections += 1
        await super()._serve(reader, writer)


def test_off_by_default_and_from_the_environment(monkeypatch):
    assert not any(name == "grpc.max_connection_age_ms" for name, _ in server_options(Settings()))
    monkeypatch.setenv("PALIMPSEST_MAX_CONNECTION_AGE_SECONDS", "300")
    settings = Settings.from_env()
    assert ("grpc.max_connection_age_ms", 300_000) in server_options(settings)


async def test_clients_reconnect_after_the_age_and_calls_in_flight_are_not_cut():
    settings = replace(Settings(), max_connection_age_s=0.3)
    running = await start_server(lambda server: None, [], settings=settings, port=0)
    relay = CountingRelay(("127.0.0.1", running.port))
    await relay.start()
    channel = open_channel(f"dns:///127.0.0.1:{relay.port}", settings)
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=""))
        assert (await asyncio.wait_for(watch.read(), 5)).status == SERVING
        # Calls every 0.1 s for 1.5 s: every one answered although the server sent the connection away.
        for _ in range(15):
            reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert reply.status == SERVING
            await asyncio.sleep(0.1)
        assert relay.connections >= 2, "the client never reconnected"
        # The stream opened on the first connection, long past its age, still gets its updates.
        await running.set_serving(False)
        assert (await asyncio.wait_for(watch.read(), 5)).status == NOT_SERVING
        watch.cancel()
    finally:
        await channel.close()
        await relay.cut()
        await running.stop(0)

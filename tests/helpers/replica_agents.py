"""Two Agent replicas on one store, as the replica tests run them."""

from __future__ import annotations

from contextlib import asynccontextmanager

import grpc

from palimpsest.v1 import agent_pb2_grpc
from tests.conftest import agent_settings


@asynccontextmanager
async def two_agents(
    base_settings, store_server, compressor_server, ollama_sim, profiles_file, claims: bool, **overrides
):
    from palimpsest.agent.app import start_agent

    settings = agent_settings(
        base_settings,
        store_server,
        compressor_server,
        ollama_sim,
        profiles_file,
        turn_claims=claims,
        turn_claim_ttl_s=5,
        **overrides,
    )
    running = [await start_agent(settings, port=0) for _ in range(2)]
    channels = [grpc.aio.insecure_channel(r.address) for r in running]
    try:
        yield [agent_pb2_grpc.AgentStub(c) for c in channels]
    finally:
        for channel in channels:
            await channel.close()
        for r in running:
            await r.stop(0)

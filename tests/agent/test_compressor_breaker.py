"""The Agent's circuit breaker on the Compressor: a Compressor that stops answering costs one
deadline, then turns go on without it at once (and it sees no call) while one health check at a
time asks whether it is back; once it answers, turns use it again. A real gRPC server that never
answers, and the real Compressor behind a TCP relay that freezes."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ollama_sim import Reply
from palimpsest.agent.app import compressor_serving
from palimpsest.agent.compressor_breaker import NOT_CALLED, GuardedCompressor
from palimpsest.shared.channels import open_channel
from palimpsest.shared.errors import NotAnswering, Unavailable
from palimpsest.v1 import agent_pb2 as apb
from palimpsest.v1 import agent_pb2_grpc, common_pb2, compressor_pb2_grpc
from palimpsest.v1 import compressor_pb2 as cpb
from tests.helpers.relay import Relay
from tests.helpers.waiting import until

REQUEST = cpb.CheckContextSizeRequest(model="m", window=8192, messages=[common_pb2.Message(role="user", content="x")])


class HungCompressor(compressor_pb2_grpc.CompressorServicer, health_pb2_grpc.HealthServicer):
    """A Compressor that takes calls and answers none until ``answering`` is set; its health says
    NOT_SERVING until then. Counts what reaches it."""

    def __init__(self) -> None:
        self.answering = asyncio.Event()
        self.calls: list[str] = []
        self.arrived = asyncio.Condition()
        self.probes = 0
        self.probing = 0
        self.most_probing = 0

    async def _arrive(self, name: str) -> None:
        async with self.arrived:
            self.calls.append(name)
            self.arrived.notify_all()

    async def until_calls(self, count: int) -> None:
        async with self.arrived:
            await asyncio.wait_for(self.arrived.wait_for(lambda: len(self.calls) >= count), 30)

    async def CheckContextSize(self, request, context):
        await self._arrive("CheckContextSize")
        await self.answering.wait()
        return cpb.CheckContextSizeResponse(fits=True, decision=cpb.SIZE_DECISION_FITS)

    async def Compress(self, request, context):
        await self._arrive("Compress")
        await self.answering.wait()
        yield cpb.CompressionEvent(started=cpb.CompressionStarted())

    async def Check(self, request, context):
        self.probes += 1
        self.probing += 1
        self.most_probing = max(self.most_probing, self.probing)
        try:
            serving = self.answering.is_set() and request.service == "palimpsest.v1.Compressor"
            return health_pb2.HealthCheckResponse(
                status=health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
            )
        finally:
            self.probing -= 1


@pytest.fixture
async def hung(base_settings):
    servicer = HungCompressor()
    server = grpc.aio.server()
    compressor_pb2_grpc.add_CompressorServicer_to_server(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    settings = replace(base_settings, rpc_timeout_s=1.0)
    channel = open_channel(address, settings, service="Compressor")
    guarded = GuardedCompressor(
        compressor_pb2_grpc.CompressorStub(channel),
        address,
        retry_s=0.2,
        probe=lambda: compressor_serving(channel, settings.rpc_timeout_s),
    )
    try:
        yield servicer, guarded
    finally:
        servicer.answering.set()
        await guarded.aclose()
        await channel.close()
        await server.stop(0)


async def test_a_compressor_that_does_not_answer_costs_one_deadline_then_is_not_called(hung):
    servicer, compressor = hung
    first = asyncio.ensure_future(compressor.CheckContextSize(REQUEST))  # the default deadline: 1 s
    await servicer.until_calls(1)
    waiting = asyncio.ensure_future(compressor.CheckContextSize(REQUEST, timeout=600))  # its own, far later
    await servicer.until_calls(2)
    with pytest.raises(NotAnswering):
        await first
    # The call waiting on the same silence is given up with the first one, not at its own deadline.
    with pytest.raises(Unavailable, match="given up when another one went unanswered"):
        await asyncio.wait_for(waiting, 30)
    for _ in range(3):  # the next calls fail at once, and the Compressor sees none of them
        with pytest.raises(Unavailable, match=NOT_CALLED):
            await compressor.CheckContextSize(REQUEST)
        with pytest.raises(Unavailable, match=NOT_CALLED):
            async for _ in compressor.Compress(cpb.CompressRequest(session_id="s")):
                pass
    assert servicer.calls == ["CheckContextSize", "CheckContextSize"]
    # Meanwhile it is asked whether it is back, one health check at a time, and it is not yet.
    assert await until(lambda: servicer.probes >= 3)
    assert compressor.is_open and servicer.most_probing == 1
    servicer.answering.set()
    assert await until(lambda: not compressor.is_open)
    assert (await compressor.CheckContextSize(REQUEST)).fits
    assert servicer.calls[-1] == "CheckContextSize" and len(servicer.calls) == 3


async def test_a_status_the_compressor_sends_is_an_answer_and_opens_nothing(base_settings):
    async def refuse(request, context):  # it answers, with a status: its own dependency is away
        await context.abort(grpc.StatusCode.UNAVAILABLE, "SessionStore at 127.0.0.1:1 is not answering: down")

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "palimpsest.v1.Compressor",
                {
                    "CheckContextSize": grpc.unary_unary_rpc_method_handler(
                        refuse, request_deserializer=cpb.CheckContextSizeRequest.FromString
                    )
                },
            ),
        )
    )
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    channel = open_channel(address, replace(base_settings, rpc_timeout_s=1.0), service="Compressor")
    compressor = GuardedCompressor(
        compressor_pb2_grpc.CompressorStub(channel),
        address,
        retry_s=0.2,
        probe=lambda: compressor_serving(channel, 1.0),
    )
    try:
        for _ in range(2):
            with pytest.raises(Unavailable, match="said the Compressor") as said:
                await compressor.CheckContextSize(REQUEST)
            assert not isinstance(said.value, NotAnswering) and not compressor.is_open
    finally:
        await compressor.aclose()
        await channel.close()
        await server.stop(0)


async def test_turns_go_on_without_a_frozen_compressor_after_one_deadline_and_use_it_once_it_thaws(
    base_settings, store_server, compressor_server, compressor, ollama_sim, profiles_file
):
    from palimpsest.agent.app import start_agent
    from tests.conftest import agent_settings

    # The Compressor's first size check for a model builds its tokenizer: done here, so the 2 s
    # deadline below is the frozen relay's, not a cold start's.
    await compressor.CheckContextSize(
        cpb.CheckContextSizeRequest(model="qwen3.6", window=8192, messages=REQUEST.messages)
    )
    host, port = compressor_server.address.rsplit(":", 1)
    relay = Relay((host, int(port)))
    await relay.start()
    settings = replace(
        agent_settings(base_settings, store_server, compressor_server, ollama_sim, profiles_file),
        compressor_addr=f"127.0.0.1:{relay.port}",
        rpc_timeout_s=2.0,
        compressor_retry_s=0.5,
    )
    running = await start_agent(settings, port=0)
    ollama_sim.clear()
    ollama_sim.set_responder(lambda body: Reply(text="an answer"))

    async def errors_of_a_turn(agent, text: str) -> list[apb.ErrorEvent]:
        events = [e async for e in agent.RunStream(apb.RunStreamRequest(text=text), timeout=60)]
        assert events[-1].stream_end.reason == apb.STREAM_END_REASON_COMPLETED
        return [e.error for e in events if e.HasField("error")]

    try:
        async with grpc.aio.insecure_channel(running.address) as channel:
            agent = agent_pb2_grpc.AgentStub(channel)
            assert await errors_of_a_turn(agent, "before") == []
            relay.freeze()
            first = await errors_of_a_turn(agent, "the first turn waits its deadline")
            assert len(first) == 1 and first[0].code == "UNAVAILABLE" and NOT_CALLED not in first[0].message
            for i in range(3):  # the next go on at once, without calling it
                later = await errors_of_a_turn(agent, f"turn {i} while it is frozen")
                assert len(later) == 1 and NOT_CALLED in later[0].message, later
            relay.thaw()

            async def uses_it_again() -> bool:
                return await errors_of_a_turn(agent, "after") == []

            assert await until(uses_it_again, 30)
    finally:
        relay.thaw()
        ollama_sim.set_responder(None)
        await running.stop(0)

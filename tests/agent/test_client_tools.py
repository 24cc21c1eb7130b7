"""Tools a client offers for a turn: the model calls one, the stream asks the client (a
`tool_call_requested` event), and the turn waits for the client's SubmitToolResult — from another
connection, after a dropped stream, on another Agent replica, under auth — or for its deadline, or a
Stop. Real Agents, the SessionStore on PostgreSQL, the Ollama simulator, Python and Node clients."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import replace

import grpc
import pytest

from ollama_sim import Reply
from palimpsest.agent.client_tools import ClientTool, client_tools_from_proto
from palimpsest.agent.pending_calls import PendingCalls
from palimpsest.shared.auth import make_token
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import agent_pb2_grpc
from palimpsest.v1 import session_store_pb2 as store_pb
from tests.conftest import JWT_SECRET, agent_settings, bearer
from tests.helpers.calls import END, expect_status, full
from tests.helpers.replica_agents import two_agents

# Each test starts from the simulator's deterministic echo.
pytestmark = pytest.mark.usefixtures("fresh_sim")

WEATHER = pb.ClientTool(
    name="get_weather",
    description="Today's weather in a city.",
    parameters_json=json.dumps({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
    read_only=True,
)
DEPLOY = pb.ClientTool(name="deploy", description="Deploy the app.", parameters_json='{"type": "object"}')


class Turn:
    """A RunStream read in the background, its events collected; `requested` once it asks the client."""

    def __init__(self, agent, metadata=(), **request):
        self.events: list[pb.AgentEvent] = []
        self.asked = asyncio.Event()
        self.call = agent.RunStream(pb.RunStreamRequest(**request), metadata=metadata)
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> list[pb.AgentEvent]:
        async for event in self.call:
            self.events.append(event)
            if event.HasField("tool_call_requested"):
                self.asked.set()
        return self.events

    async def requested(self) -> pb.AgentEvent:
        await asyncio.wait_for(self.asked.wait(), 30)
        return next(e for e in self.events if e.HasField("tool_call_requested"))

    async def ended(self) -> list[pb.AgentEvent]:
        return await asyncio.wait_for(self.task, 30)


def answer_to(event: pb.AgentEvent, content: str, is_error: bool = False) -> pb.SubmitToolResultRequest:
    return pb.SubmitToolResultRequest(
        session_id=event.session_id,
        turn_id=event.turn_id,
        call_id=event.tool_call_requested.call_id,
        content=content,
        is_error=is_error,
    )


def tool_messages(ollama_sim) -> list[str]:
    return [m["content"] for m in ollama_sim.bodies()[-1]["messages"] if m["role"] == "tool"]


async def test_the_model_calls_a_clients_tool_and_reads_its_answer(agent, agent_server, store, ollama_sim):
    ollama_sim.script(Reply(tool_calls=[("get_weather", {"city": "Lyon"})]), Reply(text="Sunny in Lyon."))
    turn = Turn(agent, text="weather in Lyon?", client_tools=[WEATHER])
    asked = await turn.requested()
    assert asked.tool_call_requested.name == "get_weather"
    assert json.loads(asked.tool_call_requested.arguments_json) == {"city": "Lyon"}
    assert asked.tool_call_requested.timeout_seconds == 300
    offered = {t["function"]["name"]: t["function"] for t in ollama_sim.bodies()[0]["tools"]}
    assert offered["get_weather"]["parameters"]["required"] == ["city"]
    async with grpc.aio.insecure_channel(agent_server.address) as other:  # another connection answers
        await agent_pb2_grpc.AgentStub(other).SubmitToolResult(answer_to(asked, "sunny, 24 °C"))
    events = await turn.ended()
    assert events[-1].stream_end.reason == END.STREAM_END_REASON_COMPLETED
    assert tool_messages(ollama_sim) == ["sunny, 24 °C"]
    session = await full(store, asked.session_id)
    assert [m.content for m in session.messages if m.role == "tool"] == ["sunny, 24 °C"]
    assert session.untrusted_ingested  # a client's answer is outside content


async def test_a_second_answer_or_one_never_asked_for_is_refused(agent, ollama_sim):
    ollama_sim.script(Reply(tool_calls=[("get_weather", {"city": "Oslo"})]), Reply(text="ok"))
    turn = Turn(agent, text="weather?", client_tools=[WEATHER])
    asked = await turn.requested()
    await agent.SubmitToolResult(answer_to(asked, "snow"))
    await expect_status(
        agent.SubmitToolResult(answer_to(asked, "rain")), grpc.StatusCode.FAILED_PRECONDITION, "answered already"
    )
    await turn.ended()
    stray = pb.SubmitToolResultRequest(
        session_id=asked.session_id, turn_id=asked.turn_id, call_id="call_nope", content="x"
    )
    await expect_status(agent.SubmitToolResult(stray), grpc.StatusCode.NOT_FOUND, "call_nope")
    await expect_status(
        agent.SubmitToolResult(pb.SubmitToolResultRequest(session_id=asked.session_id)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "turn_id",
    )
    assert tool_messages(ollama_sim) == ["snow"]


async def test_a_client_that_never_answers_gives_the_model_an_error_at_the_deadline(agent, ollama_sim):
    ollama_sim.script(Reply(tool_calls=[("get_weather", {"city": "Rome"})]), Reply(text="no weather today"))
    turn = Turn(agent, text="weather?", client_tools=[WEATHER], client_tool_timeout_seconds=1)
    events = await turn.ended()
    assert events[-1].stream_end.reason == END.STREAM_END_REASON_COMPLETED
    (result,) = tool_messages(ollama_sim)
    assert "get_weather was not answered: the client gave no result within 1 s" in result
    asked = next(e for e in events if e.HasField("tool_call_requested"))
    await expect_status(agent.SubmitToolResult(answer_to(asked, "late")), grpc.StatusCode.FAILED_PRECONDITION)


async def test_stop_ends_the_wait_and_the_turn(agent, ollama_sim):
    ollama_sim.script(Reply(tool_calls=[("get_weather", {"city": "Kyiv"})]), Reply(text="unused"))
    turn = Turn(agent, text="weather?", client_tools=[WEATHER])
    asked = await turn.requested()
    assert (await agent.Stop(pb.StopRequest(session_id=asked.session_id))).stopped
    events = await turn.ended()
    assert events[-1].stream_end.reason == END.STREAM_END_REASON_STOPPED
    await expect_status(agent.SubmitToolResult(answer_to(asked, "late")), grpc.StatusCode.FAILED_PRECONDITION)


async def test_after_a_dropped_stream_the_resume_shows_the_request_and_a_new_connection_answers(
    agent, agent_server, ollama_sim
):
    ollama_sim.script(Reply(tool_calls=[("get_weather", {"city": "Quito"})]), Reply(text="Warm in Quito."))
    turn = Turn(agent, text="weather?", client_tools=[WEATHER])
    asked = await turn.requested()
    turn.call.cancel()  # the client's connection drops; the turn waits on
    async with grpc.aio.insecure_channel(agent_server.address) as fresh:
        again = agent_pb2_grpc.AgentStub(fresh)
        resumed = again.ResumeStream(pb.ResumeStreamRequest(session_id=asked.session_id, turn_id=asked.turn_id))
        seen = []
        async for event in resumed:
            seen.append(event)
            if event.HasField("tool_call_requested"):
                await again.SubmitToolResult(answer_to(event, "warm"))
        assert [e.seq for e in seen] == list(range(1, len(seen) + 1))
        assert seen[-1].stream_end.reason == END.STREAM_END_REASON_COMPLETED
        assert seen[-1].stream_end.text == "Warm in Quito."


@pytest.mark.parametrize(
    "tool, field",
    [
        (pb.ClientTool(name="bad name"), "client_tools[0].name"),
        (pb.ClientTool(name="read_file"), "client_tools[0].name"),
        (pb.ClientTool(name="mcp__x__y"), "client_tools[0].name"),
        (pb.ClientTool(name="ok", parameters_json="{not json"), "client_tools[0].parameters_json"),
        (pb.ClientTool(name="ok", parameters_json='{"type": "array"}'), "client_tools[0].parameters_json"),
        (
            pb.ClientTool(name="ok", parameters_json='{"type": "object", "properties": {"a": {"type": "nope"}}}'),
            "client_tools[0].parameters_json",
        ),
        (pb.ClientTool(name="ok", description="x" * 5000), "client_tools[0].description"),
    ],
)
async def test_a_bad_declaration_is_refused_naming_the_field_and_nothing_is_made(
    auth_agent, store_auth, ollama_sim, tool, field
):
    me = bearer(f"decl-{uuid.uuid4().hex[:8]}")
    call = auth_agent.RunStream(pb.RunStreamRequest(text="hi", client_tools=[tool]), metadata=me)
    await expect_status(_drain(call), grpc.StatusCode.INVALID_ARGUMENT, field)
    assert not ollama_sim.bodies()
    assert (await store_auth.ListSessions(store_pb.ListSessionsRequest(page_size=1), metadata=me)).total == 0


async def test_a_name_declared_twice_or_a_wait_past_the_maximum_is_refused(agent, ollama_sim):
    twice = agent.RunStream(pb.RunStreamRequest(text="hi", client_tools=[WEATHER, WEATHER]))
    await expect_status(_drain(twice), grpc.StatusCode.INVALID_ARGUMENT, "client_tools[1].name", "twice")
    long = agent.RunStream(pb.RunStreamRequest(text="hi", client_tools=[WEATHER], client_tool_timeout_seconds=99_999))
    await expect_status(_drain(long), grpc.StatusCode.INVALID_ARGUMENT, "client_tool_timeout_seconds")
    assert not ollama_sim.bodies()


async def _drain(call) -> None:
    async for _ in call:
        pass


async def test_a_tool_that_acts_is_refused_in_a_tainted_conversation_one_that_reads_is_not(agent, store, ollama_sim):
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="small"))).session
    await store.UpdateSession(store_pb.UpdateSessionRequest(session_id=session.id, mark_untrusted_ingested=True))
    ollama_sim.script(Reply(tool_calls=[("deploy", {}), ("get_weather", {"city": "Bern"})]), Reply(text="ok"))
    turn = Turn(agent, session_id=session.id, text="deploy, then the weather", client_tools=[DEPLOY, WEATHER])
    asked = await turn.requested()
    assert asked.tool_call_requested.name == "get_weather"  # deploy was never asked of the client
    await agent.SubmitToolResult(answer_to(asked, "cloudy"))
    events = await turn.ended()
    refused, answered = tool_messages(ollama_sim)
    assert refused.startswith("deploy was not run: this conversation has taken in content from outside")
    assert answered == "cloudy" and events[-1].stream_end.reason == END.STREAM_END_REASON_COMPLETED


# -- under auth, and across replicas -----------------------------------------------------------------
@pytest.fixture(scope="module")
async def auth_agent(base_settings, store_server_auth, compressor_server, ollama_sim, profiles_file):
    from palimpsest.agent.app import start_agent

    settings = replace(
        agent_settings(base_settings, store_server_auth, compressor_server, ollama_sim, profiles_file),
        auth_enabled=True,
    )
    running = await start_agent(settings, port=0)
    async with grpc.aio.insecure_channel(running.address) as channel:
        yield agent_pb2_grpc.AgentStub(channel)
    await running.stop(0)


async def test_only_who_may_read_the_session_answers_and_a_services_answer_is_trusted(
    auth_agent, store_auth, ollama_sim
):
    owner, stranger = bearer(f"owner-{uuid.uuid4().hex[:6]}"), bearer(f"other-{uuid.uuid4().hex[:6]}")
    ollama_sim.script(Reply(tool_calls=[("get_weather", {"city": "Lima"})]), Reply(text="ok"))
    turn = Turn(auth_agent, owner, text="weather?", client_tools=[WEATHER])
    asked = await turn.requested()
    await expect_status(
        auth_agent.SubmitToolResult(answer_to(asked, "forged"), metadata=stranger), grpc.StatusCode.PERMISSION_DENIED
    )
    await expect_status(auth_agent.SubmitToolResult(answer_to(asked, "anon")), grpc.StatusCode.UNAUTHENTICATED)
    service = (("authorization", f"Bearer {make_token('a-service', JWT_SECRET, 'service')}"),)
    await auth_agent.SubmitToolResult(answer_to(asked, "mild"), metadata=service)
    await turn.ended()
    assert tool_messages(ollama_sim) == ["mild"]
    got = await store_auth.GetSession(store_pb.GetSessionRequest(session_id=asked.session_id), metadata=owner)
    assert not got.session.untrusted_ingested  # the services' own answer is not outside content


@pytest.mark.parametrize("bus", [True, False], ids=["bus", "no bus"])
async def test_the_other_replica_takes_the_answer_through_the_session_bus(
    base_settings, store_server, compressor_server, ollama_sim, profiles_file, bus
):
    async with two_agents(
        base_settings, store_server, compressor_server, ollama_sim, profiles_file, True, replica_events=bus
    ) as agents:
        ollama_sim.script(Reply(tool_calls=[("get_weather", {"city": "Baku"})]), Reply(text="ok"))
        turn = Turn(agents[0], text="weather?", client_tools=[WEATHER], client_tool_timeout_seconds=20)
        asked = await turn.requested()
        if bus:
            await agents[1].SubmitToolResult(answer_to(asked, "windy"))
        else:
            await expect_status(agents[1].SubmitToolResult(answer_to(asked, "windy")), grpc.StatusCode.NOT_FOUND)
            await agents[0].SubmitToolResult(answer_to(asked, "windy"))
        events = await turn.ended()
    assert events[-1].stream_end.reason == END.STREAM_END_REASON_COMPLETED
    assert tool_messages(ollama_sim) == ["windy"]


# -- the pieces, pure -------------------------------------------------------------------------------
def test_a_declaration_becomes_a_tool_with_its_schema_and_reach():
    tools = client_tools_from_proto([WEATHER, DEPLOY], taken={"read_file"})
    assert [t.name for t in tools] == ["get_weather", "deploy"]
    assert tools[0].parameters["required"] == ["city"] and tools[1].parameters == {"type": "object"}
    assert [t.reach.value for t in tools] == ["engine", "outside"]
    assert isinstance(tools[0], ClientTool)


async def test_pending_calls_tell_a_second_answer_from_a_stray_one():
    from palimpsest.agent.pending_calls import Answer

    calls = PendingCalls()
    key = ("s", "t", "c")
    waiting = calls.open(key)
    assert calls.answer(key, Answer("x", False, False)) == "taken" and waiting.result().content == "x"
    assert calls.answer(key, Answer("y", False, False)) == "answered"
    calls.close(key)
    assert calls.answer(key, Answer("y", False, False)) == "answered"
    assert calls.answer(("s", "t", "other"), Answer("y", False, False)) == "unknown"

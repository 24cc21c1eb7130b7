"""A 300-turn conversation in an 8,192-token window, through the real services and the simulator:
tool calls with large outputs (JSON, logs, code) and images. The window must hold every time."""

from __future__ import annotations

import asyncio
import io
import json
import re
import uuid
from dataclasses import replace

import grpc
import pytest
from PIL import Image

from ollama_sim import Reply
from palimpsest.agent.tools.base import ToolContext, ToolResult
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import agent_pb2_grpc, common_pb2
from palimpsest.v1 import session_store_pb2 as store_pb

# A model of this run alone: calibration is per model and shared by every session (and test).
MODEL = f"long-{uuid.uuid4().hex[:8]}"
TURNS = int(__import__("os").environ.get("LONG_TURNS", "300"))
WINDOW = 8192


class BigOutputTool:
    """Stands in for file and shell tools: returns a large JSON, log or code blob."""

    name = "fetch_report"
    reach = "engine"  # it reads, and acts on nothing outside: a tainted conversation may still call it
    description = "Fetch a report of the given kind (json, log or code) for a topic."
    parameters = {
        "type": "object",
        "properties": {"kind": {"type": "string"}, "topic": {"type": "string"}},
        "required": ["kind", "topic"],
    }

    async def run(self, args: dict, ctx: ToolContext) -> ToolResult:
        topic, kind = args["topic"], args["kind"]
        if kind == "json":
            body = json.dumps(
                {"topic": topic, "rows": [{"id": i, "value": f"{topic}-{i}", "ok": i % 3 == 0} for i in range(400)]}
            )
        elif kind == "log":
            body = "\n".join(
                f"2026-11-29T10:{i % 60:02d}:00 INFO worker[{i}] processed {topic} batch {i}" for i in range(500)
            )
        else:
            body = "\n".join(
                f"def handler_{i}(event):\n    return process('{topic}', event, retries={i})\n" for i in range(300)
            )
        return ToolResult(content=body)


def responder(body) -> Reply:
    """The model: tool calls on some turns, answers otherwise, summaries when asked."""
    messages = body.get("messages") or []
    if not body.get("stream", True):
        keys = sorted(set(re.findall(r"marker-\d+", json.dumps(messages))))[:30]
        return Reply(text="- Earlier work covered reports and images.\nKEYS: " + ", ".join(keys or ["reports"]))
    spoken = [m for m in messages if m.get("role") != "system"]
    last = spoken[-1] if spoken else {}
    user = next((m for m in reversed(messages) if m.get("role") == "user"), {})
    turn = int((re.search(r"turn (\d+)", user.get("content", "")) or [0, "0"])[1])
    if last.get("role") == "user" and turn % 3 == 0:
        kind = ("json", "log", "code")[turn % 9 // 3]
        return Reply(tool_calls=[("fetch_report", {"kind": kind, "topic": f"marker-{turn}"})])
    return Reply(text=f"Answer for turn {turn}: noted marker-{turn}. " + "details " * 40)


def png(side: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (side, side), (side % 255, 40, 90)).save(out, "PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def long_profiles(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("long") / "profiles.json"
    path.write_text(
        json.dumps(
            {
                "profiles": [
                    {
                        "id": "long",
                        "model": MODEL,
                        "context_window": WINDOW,
                        "max_iterations": 6,
                        "custom_tools": ["tests.agent.test_agent_long:BigOutputTool"],
                        "agent_tools": ["todo", "memory_search", "fetch_report"],
                    }
                ]
            }
        )
    )
    return str(path)


async def test_three_hundred_turns_stay_inside_the_window(
    base_settings, store_server, compressor_server, ollama_sim, long_profiles, store
):
    from palimpsest.agent.app import start_agent

    ollama_sim.clear()
    ollama_sim.set_responder(responder)
    ollama_sim.models[MODEL] = ollama_sim.models["qwen3.6"]
    settings = replace(
        base_settings,
        ollama_host=ollama_sim.url,
        store_addr=store_server.address,
        compressor_addr=compressor_server.address,
        profiles_path=long_profiles,
    )
    running = await start_agent(settings, port=0)
    compressed_events = 0
    session_id = ""
    try:
        async with grpc.aio.insecure_channel(running.address) as channel:
            agent = agent_pb2_grpc.AgentStub(channel)
            for turn in range(TURNS):
                images = [png(512 if turn % 20 == 0 else 64)] if turn % 10 == 5 else []
                request = pb.RunStreamRequest(
                    session_id=session_id, text=f"turn {turn}: please handle marker-{turn}", images=images
                )
                events = [e async for e in agent.RunStream(request)]
                session_id = events[0].session_id
                ends = [e.stream_end for e in events if e.HasField("stream_end")]
                assert ends[0].reason == pb.STREAM_END_REASON_COMPLETED, (turn, ends, events[-3:])
                compressed_events += sum(1 for e in events if e.HasField("context_compressed"))
                if __import__("os").environ.get("LONG_DEBUG"):
                    print(
                        turn,
                        [(e.usage.context_tokens) for e in events if e.HasField("usage")],
                        [e.WhichOneof("event") for e in events][:12],
                        ollama_sim.chats[-1].prompt_tokens if ollama_sim.chats else None,
                        [e.WhichOneof("event") for e in events if "compress" in e.WhichOneof("event")],
                    )
                await _settle(running)
                context = (
                    await store.GetSession(
                        store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_CONTEXT)
                    )
                ).session.context
                assert sum(1 for m in context if m.is_summary) <= 1, turn
        assert ollama_sim.truncations == 0
        assert compressed_events > 0
        # One num_ctx for the model, chat and summary calls alike: another one reloads it on Ollama.
        bodies = [b for b in ollama_sim.bodies() if b["model"] == MODEL]
        chats = {b["options"]["num_ctx"] for b in bodies if b.get("stream") is not False}
        summaries = [b["options"]["num_ctx"] for b in bodies if b.get("stream") is False]
        assert chats == {WINDOW} and summaries
        assert set(summaries) == {WINDOW}, f"{len(set(summaries))} num_ctx values in {len(summaries)} summaries"
        session = (
            await store.GetSession(store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_FULL))
        ).session
        users = [m.content for m in session.messages if m.role == "user"]
        assert users == [f"turn {t}: please handle marker-{t}" for t in range(TURNS)]
        live = " ".join(m.content for m in session.context)
        markers = {
            re.search(r"marker-\d+", m.content).group(0)
            for m in session.messages
            if not m.is_compression and re.search(r"marker-\d+", m.content)
        }
        dropped = sorted(m for m in markers if re.search(rf"{m}\b", live) is None)
        assert len(dropped) > TURNS // 2, "compression must have dropped most of 300 turns"
        for marker in dropped:
            found = await store.SearchMemory(
                store_pb.SearchMemoryRequest(session_id=session_id, query=marker, limit=10)
            )
            assert any(re.search(rf"{marker}\b", c.content) for c in found.chunks), marker
    finally:
        ollama_sim.set_responder(None)
        await running.stop(0)


async def _settle(running) -> None:
    """Wait for post-turn compression to finish, as the next user message would."""
    await asyncio.gather(*running.servicer.deps.post_turn_tasks)


async def test_a_tool_result_that_fills_the_window_compresses_mid_turn_through_run_stream(
    base_settings, store_server, compressor_server, ollama_sim, long_profiles, store
):
    """The first call fits; the report a tool returns does not: before the second call the Agent
    has the Compressor compress the earlier turns (MIDTURN), inside the same turn's stream."""
    from palimpsest.agent.app import start_agent

    def model(body) -> Reply:
        messages = body.get("messages") or []
        if body.get("stream") is False:
            return Reply(text="- Earlier: capacity planning for the cluster.\nKEYS: capacity")
        if messages[-1].get("role") == "user":
            return Reply(tool_calls=[("fetch_report", {"kind": "json", "topic": "midturn"})])
        return Reply(text="The report says 134 rows are ok.")

    ollama_sim.clear()
    ollama_sim.set_responder(model)
    # A model of this test alone: its estimates start uncalibrated whatever ran before.
    model_name = f"midturn-{uuid.uuid4().hex[:8]}"
    ollama_sim.models[model_name] = ollama_sim.models["qwen3.6"]
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="long", model=model_name))).session
    history = []
    # The first call's estimate is under the trigger; with the report it is over. Answers under the
    # 500 characters condensed at this window, so the prune before the loop's next call frees nothing.
    for i in range(25):
        history += [
            common_pb2.Message(role="user", content=f"question {i} about capacity " + "and load " * 30),
            common_pb2.Message(role="assistant", content=f"answer {i}: " + "we add nodes as load grows " * 18),
        ]
    await store.AppendMessages(store_pb.AppendMessagesRequest(session_id=session.id, messages=history))
    settings = replace(
        base_settings,
        ollama_host=ollama_sim.url,
        store_addr=store_server.address,
        compressor_addr=compressor_server.address,
        profiles_path=long_profiles,
    )
    running = await start_agent(settings, port=0)
    try:
        async with grpc.aio.insecure_channel(running.address) as channel:
            events = [
                e
                async for e in agent_pb2_grpc.AgentStub(channel).RunStream(
                    pb.RunStreamRequest(session_id=session.id, text="fetch the midturn report")
                )
            ]
    finally:
        ollama_sim.set_responder(None)
        await running.stop(0)
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[-1] == "stream_end" and events[-1].stream_end.reason == pb.STREAM_END_REASON_COMPLETED
    # Compressed after the tool ran and before the answer, in this turn's own stream.
    assert kinds.index("tool_finished") < kinds.index("compression_started") < kinds.index("context_compressed")
    assert kinds.index("context_compressed") < kinds.index("stream_end")
    stored = (
        await store.GetSession(store_pb.GetSessionRequest(session_id=session.id, view=store_pb.SESSION_VIEW_FULL))
    ).session
    markers = [m for m in stored.messages if m.is_compression]
    # (the report is pruned to its preview once the turn ends: a TURN_END prune, no summary)
    assert [m.metadata["reason"] for m in markers if m.metadata["reason"] != "turnend"] == ["midturn"]
    answer_call = [b for b in ollama_sim.bodies() if b.get("stream") is not False][-1]
    assert any("capacity planning" in m["content"] for m in answer_call["messages"])  # the summary
    assert any(m["role"] == "tool" and "midturn-1" in m["content"] for m in answer_call["messages"])  # the report
    assert not any("question 0 about" in m["content"] for m in answer_call["messages"])  # compressed away

"""A turn's tool results are pruned when it ends, and a tool loop's older results before its next
call (COMPRESSION_REASON_TURN_END), through the real services and the simulator: the turns after
carry previews, no summary is asked for, and the setting turns it off."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import replace

import grpc
import pytest

from ollama_sim import Reply
from palimpsest.agent.tools.base import ToolContext, ToolResult
from palimpsest.shared.prose_weight import PRUNED_NOTE
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import agent_pb2_grpc
from palimpsest.v1 import session_store_pb2 as store_pb

MODEL = f"turnend-{uuid.uuid4().hex[:8]}"


class LogTool:
    name = "read_log"
    reach = "engine"
    description = "Read a server log."
    parameters = {"type": "object", "properties": {"part": {"type": "integer"}}, "required": ["part"]}

    async def run(self, args: dict, ctx: ToolContext) -> ToolResult:
        part = int(args["part"])
        return ToolResult(
            content="\n".join(f"10:{i % 60:02d} ERROR worker-{part} reset id={i:06x}" for i in range(150))
        )


def model(body) -> Reply:
    """Two calls in a loop on the first turn, then answers; summaries are never expected."""
    messages = body.get("messages") or []
    if not body.get("stream", True):
        return Reply(text="- summary\nKEYS: none")
    done = sum(1 for m in messages if m.get("role") == "tool")
    first_turn = sum(1 for m in messages if m.get("role") == "user") == 1
    if first_turn and done < 2:
        return Reply(tool_calls=[("read_log", {"part": done})])
    return Reply(text="The resets follow the deploys.")


@pytest.fixture(scope="module")
def profiles(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("turnend") / "profiles.json"
    profile = {
        "id": "turnend",
        "model": MODEL,
        "context_window": 8_192,
        "max_iterations": 6,
        "custom_tools": ["tests.agent.test_turn_end_pruning:LogTool"],
        "agent_tools": ["read_log"],
    }
    path.write_text(json.dumps({"profiles": [profile]}))
    return str(path)


async def two_turns(base_settings, store_server, compressor_server, ollama_sim, profiles, store, **changes):
    """(the chat requests, the context after two turns, the compression markers' reasons)."""
    from palimpsest.agent.app import start_agent

    ollama_sim.clear()
    ollama_sim.set_responder(model)
    ollama_sim.models[MODEL] = ollama_sim.models["qwen3.6"]
    settings = replace(
        base_settings,
        ollama_host=ollama_sim.url,
        store_addr=store_server.address,
        compressor_addr=compressor_server.address,
        profiles_path=profiles,
        **changes,
    )
    running = await start_agent(settings, port=0)
    session_id = ""
    try:
        async with grpc.aio.insecure_channel(running.address) as channel:
            agent = agent_pb2_grpc.AgentStub(channel)
            for text in ("read the logs", "and now?"):
                request = pb.RunStreamRequest(session_id=session_id, text=text, profile_id="turnend")
                session_id = [e async for e in agent.RunStream(request)][0].session_id
                await asyncio.gather(*running.servicer.deps.post_turn_tasks)
    finally:
        await running.stop()
    view = store_pb.SESSION_VIEW_FULL
    session = (await store.GetSession(store_pb.GetSessionRequest(session_id=session_id, view=view))).session
    chats = [b for b in ollama_sim.bodies() if b["model"] == MODEL and b.get("stream") is not False]
    reasons = [m.metadata["reason"] for m in session.messages if m.is_compression]
    return chats, list(session.context), reasons


def tool_contents(chat: dict) -> list[str]:
    return [m["content"] for m in chat["messages"] if m.get("role") == "tool"]


async def test_results_are_pruned_in_the_loop_and_when_the_turn_ends(
    base_settings, store_server, compressor_server, ollama_sim, profiles, store
):
    chats, context, reasons = await two_turns(
        base_settings, store_server, compressor_server, ollama_sim, profiles, store
    )
    assert len(chats) == 4 and not any(b.get("stream") is False for b in ollama_sim.bodies() if b["model"] == MODEL)
    first, second = tool_contents(chats[2])  # the loop's third call: its older result is a preview
    assert PRUNED_NOTE in first and PRUNED_NOTE not in second
    assert all(PRUNED_NOTE in c for c in tool_contents(chats[3]))  # the next turn: both are
    assert all(PRUNED_NOTE in m.content for m in context if m.role == "tool")
    assert reasons == ["turnend", "turnend"]


async def test_the_setting_turns_it_off(base_settings, store_server, compressor_server, ollama_sim, profiles, store):
    chats, context, reasons = await two_turns(
        base_settings, store_server, compressor_server, ollama_sim, profiles, store, compression_prune_after_turn=False
    )
    assert not any(PRUNED_NOTE in c for chat in chats for c in tool_contents(chat))
    assert reasons == []


def test_the_agent_asks_only_when_something_is_worth_pruning():
    from palimpsest.agent.stages.upkeep import worth_pruning_after
    from palimpsest.shared.prose_weight import PruneSizes
    from palimpsest.v1.common_pb2 import Message

    long = "the migration copies invoices in batches. " * 40  # 1,720 characters
    turn = [Message(role="user", content="go on"), Message(role="assistant", content="ok")]
    assert worth_pruning_after([*turn, Message(role="tool", content=long)], 400, PruneSizes())  # the turn's long result
    assert not worth_pruning_after(
        [*turn, Message(role="tool", content="x")], 400, PruneSizes()
    )  # a short one stays: no call
    assert not worth_pruning_after([*turn, Message(role="tool", content=long)], 4_000, PruneSizes())  # frees too little
    old = [Message(role="user", content=long), Message(role="assistant", content=long)]
    assert worth_pruning_after([*old, *turn], 400, PruneSizes())  # a turn older than the newest: long prose
    assert not worth_pruning_after([*turn, *old], 400, PruneSizes())  # the newest turn's own words stay whole
    assert not worth_pruning_after([*old, *turn], 4_000, PruneSizes())  # too little to free in a large window
    # A result and old prose that free enough only together: neither part runs, so no call.
    half = Message(role="assistant", content=long[:1_000])
    mixed = [Message(role="user", content="hi"), half, *turn, Message(role="tool", content=long[:1_500])]
    # 1,500 less a preview and its note (379), and 1,000 less head, tail and note (511): each under 1,200.
    assert not worth_pruning_after(mixed, 1_200, PruneSizes())
    assert worth_pruning_after(mixed, 1_120, PruneSizes())
    condensed = Message(role="assistant", content=long)
    condensed.metadata["pruned_from_seq"] = 2
    assert not worth_pruning_after([Message(role="user", content="hi"), condensed, *turn], 400, PruneSizes())


def test_the_agent_asks_to_shed_only_the_excerpts_its_newest_request_recalled():
    from palimpsest.agent.context_builder import note_messages, recall_message
    from palimpsest.agent.stages.upkeep import recalled_for_request
    from palimpsest.v1.common_pb2 import Message, RawChunk

    recall = recall_message([RawChunk(content="the vault rotation plan " * 20)], "vault", 600)
    earlier = [recall, Message(role="user", content="rotate the vault"), Message(role="assistant", content="done")]
    assert not recalled_for_request([*earlier, Message(role="user", content="and now?")])  # an ended turn's
    loop = [Message(role="assistant", content=""), Message(role="tool", content="ok")]
    assert recalled_for_request(
        [recall, *note_messages(["[Iteration 2 of 6]"]), Message(role="user", content="go"), *loop]
    )
    assert not recalled_for_request([Message(role="user", content="go"), *loop])

"""A tool loop whose next prompt reaches the trigger by less than the excerpts recalled for its
request sheds them (a turn-end prune, no LLM call) rather than summarizing the whole history;
over by more, the compression runs as before. Through the real services and the simulator, on
the exact path, with the loop's last result sized from a probe run to land where each case needs."""

from __future__ import annotations

import asyncio
import json
import uuid

import grpc
import pytest

from ollama_sim import Reply
from palimpsest.agent.tools.base import ToolContext, ToolResult
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import common_pb2, compressor_pb2_grpc
from palimpsest.v1 import compressor_pb2 as cpb
from palimpsest.v1 import session_store_pb2 as store_pb
from tests.helpers.mcp_agents import agent_with

MODEL = f"shed-{uuid.uuid4().hex[:8]}"
WINDOW = 4_096
TRIGGER = 3_072  # the window less its output reserve (a quarter): under 90% of it
REQUEST = "turn 10: is the vault rotation on shard 7741 done?"
# Dense CJK around the words the request matches: the recalled excerpt costs a few hundred tokens.
MEMORY = (
    "金庫の鍵を回転させる手順を確認しました。" * 12 + " vault rotation shard 7741 " + "各ワーカーに割り当てます。" * 12
)


def rows(n: int) -> str:
    return "\n".join(f"row {i:04d}: rotated" for i in range(n))


class RowsTool:
    name = "fetch_rows"
    reach = "engine"
    description = "Fetch rows."
    parameters = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}

    async def run(self, args: dict, ctx: ToolContext) -> ToolResult:
        return ToolResult(content=rows(int(args["n"])))


def scripted(last_rows: int):
    """Two calls, the second for ``last_rows`` rows, then the answer; summaries answered short."""

    def reply(body) -> Reply:
        messages = body.get("messages") or []
        if not body.get("stream", True):
            return Reply(text="- the vault work so far\nKEYS: vault")
        request = max(i for i, m in enumerate(messages) if m.get("role") == "user")
        done = sum(1 for m in messages[request:] if m.get("role") == "tool")
        if done < 2:
            return Reply(tool_calls=[("fetch_rows", {"n": 1 if done == 0 else last_rows})])
        return Reply(text="The rotation is done.")

    return reply


PROFILE = {
    "id": "shed",
    "model": MODEL,
    "context_window": WINDOW,
    "max_iterations": 6,
    "memory_recall_enabled": True,
    "custom_tools": ["tests.agent.test_recall_shed:RowsTool"],
    "agent_tools": ["fetch_rows"],
}


async def session_to_recall(store) -> str:
    """A session with a summary, ten earlier turns and, in memory, what the request will recall."""
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="shed", model=MODEL))).session
    summary = common_pb2.Message(
        role="user",
        content="[Summary] We planned the vault rotation.",
        is_summary=True,
        explicit_flags=True,
        is_context=True,
        is_display=False,
    )
    turns = []
    for i in range(10):
        words = f"step {i} of the rotation moves the keys of shard {i} and checks them twice. " * 5
        turns += [
            common_pb2.Message(role="user", content=f"turn {i}: {words}"),
            common_pb2.Message(role="assistant", content=words),
        ]
    await store.AppendMessages(store_pb.AppendMessagesRequest(session_id=session.id, messages=[summary, *turns]))
    await store.IndexChunks(
        store_pb.IndexChunksRequest(session_id=session.id, chunks=[common_pb2.RawChunk(content=MEMORY)])
    )
    return session.id


async def one_turn(env, last_rows: int):
    """(the turn's chat requests, its events, whether a summary was asked for, the context after),
    in a fresh session, the loop's last result ``last_rows`` rows long."""
    base_settings, store_server, compressor_server, ollama_sim, tmp, store = env
    ollama_sim.clear()
    ollama_sim.set_responder(scripted(last_rows))
    session_id = await session_to_recall(store)
    async with agent_with(base_settings, store_server, compressor_server, ollama_sim, tmp, [PROFILE]) as (
        agent,
        running,
    ):
        request = pb.RunStreamRequest(session_id=session_id, text=REQUEST, profile_id="shed")
        events = [e async for e in agent.RunStream(request)]
        await asyncio.gather(*running.servicer.deps.post_turn_tasks)
    bodies = [b for b in ollama_sim.bodies() if b["model"] == MODEL]
    chats = [b for b in bodies if b.get("stream") is not False]
    view = store_pb.SESSION_VIEW_CONTEXT
    context = (await store.GetSession(store_pb.GetSessionRequest(session_id=session_id, view=view))).session.context
    return chats, events, len(chats) < len(bodies), list(context)


def recalled(chat: dict) -> bool:
    return any(m.get("role") == "system" and "vault rotation shard 7741" in m["content"] for m in chat["messages"])


async def costs(compressor_server, *messages: common_pb2.Message) -> list[int]:
    """What each message alone makes a prompt cost (the exact count)."""
    async with grpc.aio.insecure_channel(compressor_server.address) as channel:
        stub = compressor_pb2_grpc.CompressorStub(channel)
        return [
            (await stub.EstimateTokens(cpb.EstimateTokensRequest(model=MODEL, messages=[m], window=WINDOW))).tokens
            for m in messages
        ]


def from_ollama(message: dict) -> common_pb2.Message:
    calls = [
        common_pb2.ToolCall(name=c["function"]["name"], arguments_json=json.dumps(c["function"]["arguments"]))
        for c in message.get("tool_calls") or []
    ]
    return common_pb2.Message(
        role=message["role"], content=message.get("content", ""), name=message.get("tool_name", ""), tool_calls=calls
    )


async def counted(compressor_server, chat: dict) -> int:
    """The size check's count of a chat request as it was sent (what decides on compression)."""
    async with grpc.aio.insecure_channel(compressor_server.address) as channel:
        check = await compressor_pb2_grpc.CompressorStub(channel).CheckContextSize(
            cpb.CheckContextSizeRequest(
                model=MODEL,
                messages=[from_ollama(m) for m in chat["messages"]],
                window=WINDOW,
                tool_schemas=[json.dumps(t) for t in chat.get("tools") or []],
            )
        )
    return check.tokens


async def recall_cost(compressor_server, chat: dict) -> int:
    """What the recalled excerpt in ``chat`` adds to a prompt."""
    excerpt = next(m["content"] for m in chat["messages"] if "vault rotation shard 7741" in m["content"])
    with_it, without = await costs(
        compressor_server,
        common_pb2.Message(role="system", content=excerpt),
        common_pb2.Message(role="system", content="x"),
    )
    return with_it - without


async def rows_for(compressor_server, tokens: int) -> int:
    """The fewest rows whose result costs at least ``tokens`` more than one row's."""

    def result(n: int) -> common_pb2.Message:
        return common_pb2.Message(role="tool", name="fetch_rows", content=rows(n))

    [one] = await costs(compressor_server, result(1))
    low, high = 1, 400
    while low < high:
        middle = (low + high) // 2
        [cost] = await costs(compressor_server, result(middle))
        low, high = (middle + 1, high) if cost - one < tokens else (low, middle)
    return low


@pytest.fixture
def env(base_settings, store_server, compressor_server, ollama_sim, tmp_path, store):
    ollama_sim.models[MODEL] = ollama_sim.models["qwen3.6"]
    return base_settings, store_server, compressor_server, ollama_sim, tmp_path, store


async def probe(env) -> tuple[int, int]:
    """(the size check's count of the loop's third call with a one-row last result, what the
    recalled excerpt adds to it): where the last result puts the third call is what each case sizes."""
    compressor_server = env[2]
    chats, _, summarized, _ = await one_turn(env, 1)
    assert len(chats) == 3 and not summarized and all(recalled(c) for c in chats)
    third, recall_tokens = await counted(compressor_server, chats[2]), await recall_cost(compressor_server, chats[0])
    # Under the trigger, and a result within the window's per-message budget (682) can take it over.
    assert third < TRIGGER < third + recall_tokens // 2 + 600, (third, recall_tokens)
    return third, recall_tokens


async def test_a_loop_just_over_the_trigger_sheds_its_recall_and_summarizes_nothing(env):
    third, recall_tokens = await probe(env)
    # The last result takes the third call a third of the recall over the trigger.
    chats, events, summarized, context = await one_turn(
        env, await rows_for(env[2], TRIGGER - third + recall_tokens // 3)
    )
    assert not summarized and len(chats) == 3
    assert recalled(chats[0]) and recalled(chats[1]) and not recalled(chats[2])
    assert await counted(env[2], chats[2]) < TRIGGER
    methods = [e.context_compressed.method for e in events if e.HasField("context_compressed")]
    assert methods == [cpb.COMPRESSION_METHOD_PRUNE]
    assert not any(m.is_recall for m in context)  # out of the context (its chunk is still in memory)


async def test_a_loop_over_by_more_than_its_recall_is_compressed_as_before(env):
    third, recall_tokens = await probe(env)
    chats, events, summarized, _ = await one_turn(env, await rows_for(env[2], TRIGGER - third + recall_tokens + 60))
    assert summarized  # shedding the excerpts alone would not have kept it under: the history is summarized
    methods = [e.context_compressed.method for e in events if e.HasField("context_compressed")]
    assert methods == [cpb.COMPRESSION_METHOD_SUMMARY]  # and nothing was shed before it
    assert recalled(chats[1])

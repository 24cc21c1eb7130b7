"""Pruning and the summary share a compression's work: critical results keep their verbatim
budget, older iterations of a long turn and long call arguments are pruned, and pruning that
cannot reach the target alone still runs before the summary, which then evicts less."""

from __future__ import annotations

import json

from palimpsest.compressor.pruning import plan_pruning, protected, shortened_arguments
from palimpsest.shared.prose_weight import PRUNED_NOTE
from palimpsest.v1 import common_pb2
from palimpsest.v1 import compressor_pb2 as pb
from palimpsest.v1 import session_store_pb2 as store_pb
from tests.helpers.compressor_calls import compress, session_with, summary_bodies, tool_turns

Message = common_pb2.Message


def numbered(messages: list[Message]) -> list[Message]:
    for seq, m in enumerate(messages, start=1):
        m.seq = seq
    return messages


def result(chars: int, *, critical: bool = False, name: str = "read_config") -> Message:
    body = "".join(f"line {i:05d} key_{i} = {i * 7919}\n" for i in range(chars // 28 + 1))[:chars]
    return Message(role="tool", name=name, content=body, is_compression_critical=critical)


def test_a_result_its_tool_marks_critical_keeps_the_verbatim_budget():
    messages = numbered(
        [
            Message(role="user", content="read the configs"),
            Message(role="assistant", tool_calls=[common_pb2.ToolCall(id="a", name="read_config")]),
            result(3_000, critical=True),
            result(5_000, critical=True),
            result(5_000),
            Message(role="assistant", content="done"),
            Message(role="user", content="next"),
        ]
    )
    pruning = plan_pruning(messages, protected(messages), critical_tools=())
    # 3,000 characters are within the 4,000 kept verbatim: not pruned at all.
    assert [m.seq for m in pruning.pruned] == [4, 5]
    critical, ordinary = pruning.previews
    original = messages[3].content
    assert critical.content.startswith(original[:2_000]) and original[-2_000:] in critical.content
    assert critical.is_compression_critical
    assert len(ordinary.content) < 600  # an ordinary result keeps its short preview


def test_older_iterations_of_a_long_turn_are_pruned_and_the_newest_call_is_not():
    loop: list[Message] = [Message(role="user", content="fix the build")]
    for i in range(5):
        loop += [
            Message(role="assistant", tool_calls=[common_pb2.ToolCall(id=f"c{i}", name="run_tests")]),
            result(3_000, name="run_tests"),
        ]
    messages = numbered(loop)
    pruning = plan_pruning(messages, protected(messages), critical_tools=())
    assert [m.seq for m in pruning.pruned] == [3, 5, 7, 9]  # every result but the newest call's


def test_long_arguments_of_an_old_call_are_pruned_to_valid_json():
    content = "x" * 5_000
    call = common_pb2.ToolCall(
        id="w", name="write_file", arguments_json=json.dumps({"path": "/a.py", "content": content})
    )
    messages = numbered(
        [
            Message(role="user", content="write it"),
            Message(role="assistant", tool_calls=[call]),
            Message(role="tool", name="write_file", content="ok"),
            Message(role="assistant", content="written"),
            Message(role="user", content="thanks"),
        ]
    )
    pruning = plan_pruning(messages, protected(messages), critical_tools=())
    [assistant] = pruning.previews
    arguments = json.loads(assistant.tool_calls[0].arguments_json)
    assert arguments["path"] == "/a.py" and len(arguments["content"]) < 300
    assert assistant.replaces.first == 2 and assistant.tool_calls[0].id == "w"
    assert shortened_arguments("{not json" + "y" * 3_000).endswith("[pruned]")


async def test_pruning_runs_before_a_summary_it_cannot_replace(compressor, store, profile, ollama_sim):
    """Pruning alone cannot reach the target here (the turns' words are most of the context, each
    answer under the length old prose is condensed from), but it still runs: the summary after it
    leaves the kept turns' results as previews, and keeps more of the conversation verbatim than a
    summary alone would."""
    messages = []
    for turn in tool_turns(48):
        messages.append(turn)
        if turn.role == "assistant" and turn.content:
            turn.content += " " + "the resets line up with the deploys of that hour. " * 19
    session_id = await session_with(store, profile, messages)
    asked = len(ollama_sim.bodies())
    events = await compress(compressor, session_id, reason=pb.COMPRESSION_REASON_PRETURN, window=32_768)
    done = events[-1].compressed
    assert done.method == pb.COMPRESSION_METHOD_SUMMARY
    assert len(summary_bodies(ollama_sim, asked)) == 1
    context = (
        await store.GetSession(store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_CONTEXT))
    ).session.context
    results = [m for m in context if m.role == "tool"]
    assert any(PRUNED_NOTE in m.content for m in results), "kept results older than the newest call are previews"
    assert len(results[-1].content) > 2_000  # the newest call's result stays whole
    alone = await session_with(store, profile, messages)
    events = await compress(
        compressor,
        alone,
        reason=pb.COMPRESSION_REASON_PRETURN,
        window=32_768,
        settings=pb.CompressionSettings(prune_tool_results=False),
    )
    assert done.messages_after > events[-1].compressed.messages_after  # pruning let more stay verbatim

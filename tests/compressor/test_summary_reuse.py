"""Summaries that cost the model little: the new history folded into the live summary, a length
asked for in proportion to what is condensed, and the conversation's own prompt reused as the
summary request's prefix (Ollama evaluates only the instruction at its end)."""

from __future__ import annotations

import json

import grpc
import pytest

from ollama_sim import Reply
from palimpsest.shared.context_view import to_ollama_messages
from palimpsest.v1 import common_pb2
from palimpsest.v1 import compressor_pb2 as pb
from palimpsest.v1 import session_store_pb2 as store_pb
from tests.helpers.compressor_calls import compress, session_with, summary_bodies, turns

Message = common_pb2.Message
# These turns' answers are long enough to be condensed by the pruning stage: the summary's own
# form is what is tested here.
SUMMARY_ONLY = pb.CompressionSettings(prune_tool_results=False)
HEAD = [Message(role="system", content="You are the bench assistant. Answer briefly.")]
SCHEMAS = [
    json.dumps(
        {
            "type": "function",
            "function": {
                "name": "fetch_report",
                "description": "Fetch a report.",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    )
]


async def context_of(store, session_id: str) -> list[Message]:
    return list(
        (
            await store.GetSession(
                store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_CONTEXT)
            )
        ).session.context
    )


async def test_a_summary_begins_as_the_conversations_last_prompt_did(compressor, store, profile, ollama_sim):
    session_id = await session_with(store, profile, turns(14, 1_200))  # a prompt that fit the window
    stored = await context_of(store, session_id)
    asked = len(ollama_sim.bodies())
    events = await compress(
        compressor,
        session_id,
        reason=pb.COMPRESSION_REASON_PRETURN,
        settings=SUMMARY_ONLY,
        window=8192,
        prompt_head=HEAD,
        tool_schemas=SCHEMAS,
    )
    done = events[-1].compressed
    assert done.method == pb.COMPRESSION_METHOD_SUMMARY
    [body] = summary_bodies(ollama_sim, asked)
    sent = body["messages"]
    # The head, then the stored context as the chat call sends it, up to the last message summarized.
    chat_prompt = to_ollama_messages([*HEAD, *stored])
    assert sent[:-1] == chat_prompt[: len(sent) - 1]
    assert len(sent) - 2 == done.replaced.last  # every summarized row, in order, and nothing after
    assert body["tools"] == [json.loads(s) for s in SCHEMAS]
    assert body["options"]["num_ctx"] == 8192 and body.get("think") in (False, None)
    instruction = sent[-1]
    assert instruction["role"] == "user" and instruction["content"].startswith("[This request comes from the system")
    assert "at most" in instruction["content"] and "KEYS:" in instruction["content"]


async def test_a_summarizer_that_calls_a_tool_is_asked_again_on_its_own(compressor, store, profile, ollama_sim):
    """The prefix form carries the tool block: a model may answer it with a call. The standalone form
    follows at once, in the same compression."""

    def replies(body) -> Reply:
        if body.get("tools"):
            return Reply(tool_calls=[("fetch_report", {})])
        return Reply(text="- Deploys were discussed.\nKEYS: deploy")

    ollama_sim.set_responder(replies)
    session_id = await session_with(store, profile, turns(14, 1_200))
    asked = len(ollama_sim.bodies())
    try:
        events = await compress(
            compressor,
            session_id,
            reason=pb.COMPRESSION_REASON_PRETURN,
            settings=SUMMARY_ONLY,
            window=8192,
            prompt_head=HEAD,
            tool_schemas=SCHEMAS,
        )
    finally:
        ollama_sim.set_responder(None)
    assert events[-1].compressed.method == pb.COMPRESSION_METHOD_SUMMARY
    prefix, standalone = summary_bodies(ollama_sim, asked)
    assert prefix.get("tools") and not standalone.get("tools")
    assert standalone["messages"][0]["content"].startswith("You condense an earlier part")
    assert "Deploys were discussed" in events[-1].compressed.summary


async def test_new_history_is_folded_into_the_live_summary(compressor, store, profile, ollama_sim):
    ollama_sim.set_responder(lambda body: Reply(text="- Deploys were discussed.\nKEYS: deploy"))
    session_id = await session_with(store, profile, turns(40, 1_600))
    await compress(compressor, session_id, reason=pb.COMPRESSION_REASON_PRETURN, settings=SUMMARY_ONLY, window=32_768)
    first = [m for m in await context_of(store, session_id) if m.is_summary][0]
    await store.AppendMessages(store_pb.AppendMessagesRequest(session_id=session_id, messages=turns(16, 1_600)))
    asked = len(ollama_sim.bodies())
    events = await compress(
        compressor, session_id, reason=pb.COMPRESSION_REASON_PRETURN, settings=SUMMARY_ONLY, window=32_768
    )
    [body] = summary_bodies(ollama_sim, asked)
    # Only the evicted history is sent, not the live summary to be rewritten.
    assert "Earlier summary" not in body["messages"][-1]["content"]
    [live] = [m for m in await context_of(store, session_id) if m.is_summary]
    old_text = first.content.split("\n", 1)[1]
    assert live.content.split("\n", 1)[1].startswith(old_text.rstrip())
    assert live.replaces.first == first.replaces.first
    assert events[-1].compressed.replaced.first == first.replaces.first
    ollama_sim.set_responder(None)


async def test_a_live_summary_that_would_pass_its_budget_is_rewritten_whole(compressor, store, profile, ollama_sim):
    """The meta-summary rule still bounds it: past a sixteenth of the window the earlier summary is
    merged with the new history in one summary, not appended to."""
    long_summary = "- The deployment of each service was discussed and its config key noted.\n" * 120
    ollama_sim.set_responder(lambda body: Reply(text=long_summary + "KEYS: deploy"))
    session_id = await session_with(store, profile, turns(40, 1_600))
    try:
        await compress(
            compressor, session_id, reason=pb.COMPRESSION_REASON_PRETURN, settings=SUMMARY_ONLY, window=32_768
        )
        await store.AppendMessages(store_pb.AppendMessagesRequest(session_id=session_id, messages=turns(40, 1_600)))
        asked = len(ollama_sim.bodies())
        await compress(
            compressor, session_id, reason=pb.COMPRESSION_REASON_PRETURN, settings=SUMMARY_ONLY, window=32_768
        )
    finally:
        ollama_sim.set_responder(None)
    [body] = summary_bodies(ollama_sim, asked)
    assert "Earlier summary" in body["messages"][-1]["content"]
    assert len([m for m in await context_of(store, session_id) if m.is_summary]) == 1


async def test_the_length_asked_for_follows_what_is_condensed(compressor, store, profile, ollama_sim):
    """num_predict is proportional to the history summarized, not the 6,000-token cap every time."""
    predicts = []
    for size in (600, 3_000):
        session_id = await session_with(store, profile, turns(24, size))
        asked = len(ollama_sim.bodies())
        await compress(
            compressor, session_id, reason=pb.COMPRESSION_REASON_PRETURN, settings=SUMMARY_ONLY, window=32_768
        )
        [body] = summary_bodies(ollama_sim, asked)
        predicts.append(body["options"]["num_predict"])
    small, large = predicts
    assert small < large <= 2 * 32_768 // 16  # twice what is asked, at most twice the summary's budget
    assert large < 6_000


@pytest.mark.parametrize(
    "field, head, schemas",
    [
        ("prompt_head[0].role", [Message(role="user", content="hi")], []),
        ("tool_schemas[0]", HEAD, ["{not json"]),
        ("tool_schemas[0]", HEAD, ["[1, 2]"]),
    ],
)
async def test_a_bad_prompt_head_is_refused_naming_the_field(compressor, store, profile, field, head, schemas):
    session_id = await session_with(store, profile, turns(4))
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await compress(compressor, session_id, prompt_head=head, tool_schemas=schemas)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in error.value.details()

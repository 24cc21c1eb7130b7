"""Ollama's two engines as a turn meets them: every request says `truncate: false`, so llama-server
(0.30.0 on) refuses a prompt over the window with HTTP 400 and the turn compresses, or halves its
largest tool result, and sends it once more; refused again it ends CONTEXT_TOO_LARGE, explained.
The old runners ignore the field and cut the prompt's head, which the turn still notices. A profile
asking for more window than the model was trained on runs in the trained context, and is told.

Real services, the simulator over HTTP in llama-server mode (the old one by switching its version)."""

from __future__ import annotations

import json
import logging
import re
import uuid
from dataclasses import replace
from typing import Any

import pytest

from ollama_sim import ModelSpec, OllamaSimulator, Reply, default_models
from ollama_sim.engines import LLAMA_SERVER_REFUSAL
from ollama_sim.models import COMPLETION, TOOLS
from palimpsest.agent.tools.base import ToolContext, ToolResult
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import compressor_pb2 as cpb
from palimpsest.v1 import session_store_pb2 as store_pb
from tests.helpers.calls import END, end_of, kinds, run, text_of

# Three tokens a character to the simulator's tokenizer, while a count without the model's
# vocabulary prices about half a token: an overflow our count cannot see coming.
GLYPH = "ꙮ"
GLYPHS_MODEL = f"glyphs-{uuid.uuid4().hex[:8]}"  # no vocabulary: counted by the calibrated fallback
# The same for the old engine: a model's calibration learns from every report, and the refusal test's
# reports teach it what glyphs cost.
OLD_GLYPHS_MODEL = f"old-glyphs-{uuid.uuid4().hex[:8]}"
MID_GLYPHS_MODEL = f"mid-glyphs-{uuid.uuid4().hex[:8]}"  # for the runners that honour `truncate` (0.12.6–0.29)
CLAMPED_MODEL = f"clamped-{uuid.uuid4().hex[:8]}"
WINDOW = 8192
LLAMA_SERVER_VERSION = "0.30.2"


class GlyphTool:
    """A tool whose result is dense in tokens (a file in an unusual script, say)."""

    name = "read_glyphs"
    reach = "engine"
    description = "Read the given number of glyphs."
    parameters = {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]}

    async def run(self, args: dict, ctx: ToolContext) -> ToolResult:
        return ToolResult(content=GLYPH * int(args["count"]))


def responder(body: dict[str, Any]) -> Reply:
    """Summaries when asked; a tool call when the newest request asks for glyphs; else an answer."""
    if body.get("stream") is False:
        return Reply(text="- The user asked for glyphs and got them.\nKEYS: glyphs")
    messages = body.get("messages") or []
    asked = max((i for i, m in enumerate(messages) if m["role"] == "user" and "please" in m["content"]), default=-1)
    wanted = re.search(r"read (\d+) glyphs (\d+) times", messages[asked]["content"]) if asked >= 0 else None
    answered = any(m["role"] == "tool" for m in messages[asked + 1 :])
    if wanted and not answered:
        return Reply(tool_calls=[("read_glyphs", {"count": int(wanted[1])})] * int(wanted[2]))
    return Reply(text="Done. " + "words " * 30)


@pytest.fixture(scope="module")
def ollama_sim():
    """This module's Ollama: llama-server, with a model we have no vocabulary for and one trained
    on less than its profile asks."""
    models = {
        **default_models(),
        GLYPHS_MODEL: ModelSpec(context_length=32_768, capabilities=(COMPLETION, TOOLS), architecture="llama"),
        OLD_GLYPHS_MODEL: ModelSpec(context_length=32_768, capabilities=(COMPLETION, TOOLS), architecture="llama"),
        MID_GLYPHS_MODEL: ModelSpec(context_length=32_768, capabilities=(COMPLETION, TOOLS), architecture="llama"),
        CLAMPED_MODEL: replace(default_models()["qwen3.6"], context_length=16_384),
    }
    with OllamaSimulator(models, version=LLAMA_SERVER_VERSION) as sim:
        yield sim


@pytest.fixture(scope="module")
def profiles_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("refusal") / "profiles.json"
    glyphs = {
        "context_window": WINDOW,
        "max_iterations": 4,
        "think_enabled": False,
        "memory_recall_enabled": False,
        "custom_tools": ["tests.agent.test_context_refusal:GlyphTool"],
        "agent_tools": ["read_glyphs"],
    }
    path.write_text(
        json.dumps(
            {
                "default": "glyphs",
                "profiles": [
                    {"id": "glyphs", "model": GLYPHS_MODEL, **glyphs},
                    {"id": "old-glyphs", "model": OLD_GLYPHS_MODEL, **glyphs},
                    {"id": "mid-glyphs", "model": MID_GLYPHS_MODEL, **glyphs},
                    {"id": "greedy", "model": CLAMPED_MODEL, "context_window": 65_536, "think_enabled": False},
                ],
            }
        )
    )
    return str(path)


@pytest.fixture(autouse=True)
def fresh_sim(ollama_sim: OllamaSimulator):
    ollama_sim.clear()
    ollama_sim.set_responder(responder)
    ollama_sim.version = LLAMA_SERVER_VERSION
    yield
    ollama_sim.version = LLAMA_SERVER_VERSION


def errors(events: list[pb.AgentEvent]) -> list[str]:
    return [e.error.message for e in events if e.HasField("error")]


async def session_with_a_turn(agent, profile_id: str = "glyphs") -> str:
    """A session whose calibration has seen ordinary text only."""
    events = await run(agent, "please say hello", profile_id=profile_id)
    assert end_of(events).reason == END.STREAM_END_REASON_COMPLETED
    return events[0].session_id


def chat_bodies(sim: OllamaSimulator) -> list[dict[str, Any]]:
    return [b for b in sim.bodies() if b.get("stream") is not False]


async def test_every_chat_and_summary_request_says_truncate_false(agent, ollama_sim):
    await session_with_a_turn(agent)
    assert ollama_sim.bodies() and all(b["truncate"] is False for b in ollama_sim.bodies())


@pytest.mark.parametrize(
    ("version", "profile_id", "refusal"),
    [
        (LLAMA_SERVER_VERSION, "glyphs", "the request exceeds the available context size"),
        ("0.29.1", "mid-glyphs", "the input length exceeds the context length"),  # the runners since 0.12.6
    ],
)
async def test_an_overflow_ollama_refuses_is_shrunk_and_sent_again(
    agent, ollama_sim, caplog, version, profile_id, refusal
):
    ollama_sim.version = version
    session_id = await session_with_a_turn(agent, profile_id)
    ollama_sim.clear()
    events = await run(agent, "please read 1000 glyphs 3 times", session_id=session_id, profile_id=profile_id)
    assert end_of(events).reason == END.STREAM_END_REASON_COMPLETED, (text_of(events), errors(events))
    assert errors(events) == []
    # The tools' results made the next prompt far larger than counted: refused once, then sent with
    # the largest result cut to half, and read whole (nothing dropped, nothing shifted).
    assert ollama_sim.refusals == 1 and any(refusal in r.getMessage() for r in caplog.records)
    assert ollama_sim.truncations == 0 and ollama_sim.chats[-1].prompt_eval_count <= WINDOW
    retried = chat_bodies(ollama_sim)[-1]["messages"]
    results = sorted(len(m["content"]) for m in retried if m["role"] == "tool")
    assert results[1:] == [1000, 1000] and results[0] < 600


async def test_the_old_runners_ignore_truncate_and_their_cut_is_still_noticed(agent, ollama_sim):
    """Ollama before 0.12.6 ignores `truncate`: the same prompt is cut, not refused, and the
    half-window report is neither the meter's count nor a baseline (the fallback that stays)."""
    session_id = await session_with_a_turn(agent, "old-glyphs")
    ollama_sim.clear()
    ollama_sim.version = "0.12.0"
    events = await run(agent, "please read 1000 glyphs 3 times", session_id=session_id, profile_id="old-glyphs")
    assert end_of(events).reason == END.STREAM_END_REASON_COMPLETED
    assert ollama_sim.refusals == 0 and ollama_sim.truncations >= 1
    usage = [e.usage for e in events if e.HasField("usage")][-1]
    assert usage.prompt_tokens == WINDOW // 2 + 2 and usage.count_method != "reported"


async def test_a_refusal_compresses_the_conversation_and_sends_it_again(agent, ollama_sim, store):
    session_id = ""
    for turn in range(8):
        events = await run(
            agent, f"please note point {turn}: " + "detail " * 150, session_id=session_id, profile_id="glyphs"
        )
        session_id = events[0].session_id
    before = (
        await store.GetSession(store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_CONTEXT))
    ).session.context
    ollama_sim.clear()
    ollama_sim.script(Reply(http_status=400, error=LLAMA_SERVER_REFUSAL))
    events = await run(agent, "please sum it up", session_id=session_id, profile_id="glyphs")
    assert end_of(events).reason == END.STREAM_END_REASON_COMPLETED, (text_of(events), errors(events))
    assert errors(events) == [] and "context_compressed" in kinds(events)
    after = (
        await store.GetSession(store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_CONTEXT))
    ).session.context
    assert len(after) < len(before) and any(m.is_summary for m in after)
    chats = chat_bodies(ollama_sim)
    assert len(chats) == 2 and len(chats[1]["messages"]) < len(chats[0]["messages"])


async def test_a_second_refusal_ends_the_turn_too_large_and_says_why(agent, ollama_sim, store):
    session_id = (await run(agent, "please read 40 glyphs 1 times", profile_id="glyphs"))[0].session_id
    ollama_sim.clear()
    ollama_sim.script(*[Reply(http_status=400, error=LLAMA_SERVER_REFUSAL)] * 2)
    events = await run(agent, "please go on", session_id=session_id, profile_id="glyphs")
    end = end_of(events)
    assert end.reason == END.STREAM_END_REASON_CONTEXT_TOO_LARGE
    assert errors(events) == [], "an explained end, not Ollama's raw error"
    assert "Ollama refused the prompt" in end.text and f"{WINDOW:,} tokens" in end.text
    assert "after cutting its largest tool result to half" in end.text and "exceeds" not in end.text
    assert len(chat_bodies(ollama_sim)) == 2  # one retry, no more
    stored = (
        await store.GetSession(store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_CONTEXT))
    ).session.context
    assert stored[-1].role == "assistant" and stored[-1].content == end.text


async def test_a_refusal_with_nothing_to_shrink_ends_at_once(agent, ollama_sim):
    ollama_sim.script(Reply(http_status=400, error=LLAMA_SERVER_REFUSAL))
    events = await run(agent, "please say hello", profile_id="glyphs")
    end = end_of(events)
    assert end.reason == END.STREAM_END_REASON_CONTEXT_TOO_LARGE and errors(events) == []
    assert "nothing left to compress or cut" in end.text
    assert len(chat_bodies(ollama_sim)) == 1


async def test_a_window_larger_than_the_model_was_trained_on_is_clamped_and_told(agent, ollama_sim, caplog):
    with caplog.at_level(logging.WARNING, logger="palimpsest.agent"):
        events = await run(agent, "hello", profile_id="greedy")
    assert end_of(events).reason == END.STREAM_END_REASON_COMPLETED
    info = events[0].model_info
    assert (info.context_window, info.requested_context_window) == (16_384, 65_536)
    assert {b["options"]["num_ctx"] for b in ollama_sim.bodies()} == {16_384}
    usage = [e.usage for e in events if e.HasField("usage")][-1]
    assert usage.max_context_tokens == 16_384
    assert any("65536" in r.getMessage() and "16384" in r.getMessage() for r in caplog.records)


async def test_a_window_the_model_has_is_not_flagged(agent):
    events = await run(agent, "hello", profile_id="glyphs")
    assert events[0].model_info.context_window == WINDOW and events[0].model_info.requested_context_window == 0


async def test_a_refused_summary_prompt_is_sent_once_more_within_half_the_window(agent, ollama_sim):
    session_id = ""
    for turn in range(8):
        events = await run(
            agent, f"please note point {turn}: " + "detail " * 150, session_id=session_id, profile_id="glyphs"
        )
        session_id = events[0].session_id
    ollama_sim.clear()
    # Each attempt at the summary is refused once: without the retry inside an attempt, both attempts
    # fail and the compaction falls back to dropping turns unsummarized.
    ollama_sim.script(*[Reply(http_status=400, error=LLAMA_SERVER_REFUSAL)] * 2)
    events = [e async for e in agent.Compact(pb.CompactRequest(session_id=session_id))]
    [compressed] = [e.context_compressed for e in events if e.HasField("context_compressed")]
    # A summary still (not the hard-truncate fallback), its input cut to fit half the window (this one
    # already did), sent in the same num_ctx: another would reload the model.
    assert compressed.method == cpb.COMPRESSION_METHOD_SUMMARY
    summaries = [b for b in ollama_sim.bodies() if b.get("stream") is False]
    assert len(summaries) == 3 and {b["options"]["num_ctx"] for b in summaries} == {WINDOW}
    first, second, _ = (sum(len(m["content"]) for m in b["messages"]) for b in summaries)
    assert second <= first and ollama_sim.chats[-1].prompt_tokens <= WINDOW // 2

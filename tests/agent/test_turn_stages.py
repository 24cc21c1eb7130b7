"""The stages of a turn as plain functions over plain data: no server, no database, no model."""

from __future__ import annotations

import ast
import pathlib

from palimpsest.agent.profiles import Profile
from palimpsest.agent.stages.model_call import request_body
from palimpsest.agent.stages.prepare import TOO_LARGE_ANSWER
from palimpsest.agent.stages.report import model_report
from palimpsest.agent.stages.runs_on import runs_on
from palimpsest.agent.stages.sizing import call_notes, unchecked
from palimpsest.agent.stages.storing import answer_message, tool_calls_of
from palimpsest.shared.ollama import ChatResult, ModelFacts
from palimpsest.v1 import common_pb2
from palimpsest.v1 import compressor_pb2 as cpb

Message = common_pb2.Message
AGENT = pathlib.Path(__file__).resolve().parents[2] / "palimpsest" / "agent"


def test_the_first_call_carries_no_notes_and_later_calls_are_reminded_of_budget_goal_and_stall():
    profile = Profile(goal_anchoring_interval=2, anti_stall_threshold=3)
    assert call_notes(profile, 0, 10, 0, "find the needle") == []
    later = call_notes(profile, 2, 10, 3, "find the needle")
    assert len(later) == 3
    assert "Iteration 3 of 10" in later[0] and "find the needle" in later[1] and "3 iterations" in later[2]


def test_the_last_call_is_told_to_wrap_up_even_when_it_is_the_first():
    [note] = call_notes(Profile(), 0, 1, 0, "goal")
    assert "Wrap up now" in note


def test_tool_calls_without_ids_are_numbered_and_their_arguments_kept_as_json():
    reply = ChatResult(
        tool_calls=[
            {"function": {"name": "todo", "arguments": {"action": "list"}}},
            {"id": "own", "function": {"name": "read", "arguments": '{"path": "a"}'}},
        ]
    )
    calls = tool_calls_of(reply)
    assert [(c.id, c.name, c.arguments_json) for c in calls] == [
        ("call_0", "todo", '{"action": "list"}'),
        ("own", "read", '{"path": "a"}'),
    ]
    stored = answer_message(reply, tool_calls=calls)
    assert stored.role == "assistant" and len(stored.tool_calls) == 2


def test_a_model_without_vision_or_thinking_gets_no_images_and_no_think_switch():
    built = [Message(role="user", content="look", images=[b"\x89PNG"])]
    blind = ModelFacts("m", 4096, frozenset())
    body = request_body(built, model="m", facts=blind, window=2048, tools=None, think_enabled=True)
    assert "images" not in body["messages"][0] and "think" not in body
    seeing = ModelFacts("m", 4096, frozenset({"vision", "thinking"}))
    body = request_body(built, model="m", facts=seeing, window=2048, tools=None, think_enabled=True)
    assert body["messages"][0]["images"] and body["think"] is True


def test_a_sub_agents_report_is_not_judged_here_and_proves_no_cut():
    check = cpb.CheckContextSizeResponse(tokens=120)
    report, cut = model_report(
        ChatResult(prompt_eval_count=100),
        check,
        [],
        0,
        model="m",
        window=2048,
        stored=False,
        session_id="",
    )
    assert report.context_token_count == 120 and not report.HasField("baseline") and not cut


def test_without_the_compressor_a_prompt_is_sized_by_the_heuristic_and_sent():
    built = [Message(role="tool", name="read", content="x" * 40_000)]
    check = unchecked(built, 2048, 0)
    assert check.decision == cpb.SIZE_DECISION_FITS and check.method == cpb.ESTIMATE_METHOD_FALLBACK
    # An oversized tool result cut to its budget.
    assert check.cuts and len(check.cuts[0].content) < 40_000


def test_the_window_a_turn_runs_in_is_at_most_what_the_model_was_trained_on():
    on = runs_on(
        Profile(context_window=65536),
        ModelFacts("m", 8192, frozenset()),
        num_ctx=4096,
        mcp=None,
        is_subagent=False,
        exclude=(),
        depth=0,
        client_tools=(),
        clamped=False,
    )
    assert (on.requested_window, on.window) == (65536, 8192)
    assert on.tool_schemas() is None  # a model without tool calling is told of none


def test_the_too_large_answer_names_the_count_and_the_budget():
    assert "123" in TOO_LARGE_ANSWER.format(tokens=123, limit=456)


def test_the_turn_does_not_import_the_module_that_builds_sub_agents():
    """The spawner is injected (TurnContext.spawn): the turn and its stages never import it."""
    for path in [
        AGENT / "turn.py",
        AGENT / "turn_base.py",
        AGENT / "turn_tools.py",
        AGENT / "turn_compression.py",
        AGENT / "turn_context.py",
        *sorted((AGENT / "stages").glob("*.py")),
    ]:
        imported = {node.module for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ImportFrom)}
        assert "palimpsest.agent.subagent" not in imported, path

"""What a client-side tool's round trip adds to a turn. The services run as processes of their own (as
deployed) against the Ollama simulator; a client streams turns whose model calls one tool, answering
a `tool_call_requested` at once (its own time: nothing) with SubmitToolResult on the same channel.
Measured as the client sees it, from the event asking for the call to the `tool_finished` of that
call — the event's way out, the answer's way in, the turn taking it — against the same span for a
built-in tool that does nothing (`todo list`), in alternating turns.
"""

from __future__ import annotations

import json
import time

from bench import _common
from bench.agent import service_processes
from ollama_sim import Reply
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import session_store_pb2 as store_pb

NEEDS_POSTGRES = True
TURNS, QUICK_TURNS = 200, 20
PROFILE = {
    "id": "tools",
    "model": "qwen3.6",
    "context_window": 8192,
    "think_enabled": False,
    "memory_recall_enabled": False,
    "tools": {"agent": ["todo"]},
}
ECHO = pb.ClientTool(
    name="echo",
    description="Echo the text.",
    read_only=True,
    parameters_json=json.dumps({"type": "object", "properties": {"text": {"type": "string"}}}),
)


async def one_turn(agent, session_id: str, client: bool) -> tuple[float, float]:
    """(the tool's span as the client saw it, the SubmitToolResult call within it) for one turn."""
    request = pb.RunStreamRequest(session_id=session_id, text="go", client_tools=[ECHO] if client else [])
    asked = finished = answered = answering = 0.0
    async for event in agent.RunStream(request):
        now = time.perf_counter()
        if event.HasField("tool_started") and not client:
            asked = now
        elif event.HasField("tool_call_requested"):
            asked = now
            answering = time.perf_counter()
            await agent.SubmitToolResult(
                pb.SubmitToolResultRequest(
                    session_id=event.session_id,
                    turn_id=event.turn_id,
                    call_id=event.tool_call_requested.call_id,
                    content="hello",
                )
            )
            answered = time.perf_counter()
        elif event.HasField("tool_finished"):
            finished = now
    return finished - asked, (answered - answering) if client else 0.0


async def run(args) -> str:
    turns = QUICK_TURNS if args.quick else TURNS
    async with service_processes(args.server, "client_tools", [PROFILE]) as (sim, store, agent):
        sessions = {
            arm: (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="tools"))).session.id
            for arm in ("built-in", "client")
        }

        def respond(body):
            last = body["messages"][-1]
            if last["role"] == "user":
                tool = "echo" if any(t["function"]["name"] == "echo" for t in body.get("tools") or ()) else "todo"
                return Reply(tool_calls=[(tool, {"text": "hi"} if tool == "echo" else {"action": "list"})])
            return Reply(text="done")

        sim.set_responder(respond)
        spans: dict[str, list[float]] = {"built-in": [], "client": []}
        calls: list[float] = []
        for _ in range(turns):
            for arm in ("built-in", "client"):
                span, submit = await one_turn(agent, sessions[arm], arm == "client")
                spans[arm].append(span)
                if arm == "client":
                    calls.append(submit)
        rows = [
            [
                "built-in `todo list` (tool_started → tool_finished)",
                _common.ms(_common.p50(spans["built-in"])),
                _common.ms(_common.percentile(spans["built-in"], 95)),
            ],
            [
                "client tool (tool_call_requested → tool_finished)",
                _common.ms(_common.p50(spans["client"])),
                _common.ms(_common.percentile(spans["client"], 95)),
            ],
            [
                "  of which the client's SubmitToolResult call",
                _common.ms(_common.p50(calls)),
                _common.ms(_common.percentile(calls, 95)),
            ],
        ]
        return f"{turns} turns of each, alternating, one tool call a turn; services as processes.\n\n" + _common.table(
            ["span", "p50", "p95"], rows
        )

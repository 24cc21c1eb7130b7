"""What EstimateTokens on a stored session counts, against the prompt the model really gets next:
the exact count of the stored context alone (what it meant before), the exact count with the
preamble and tool schemas the Agent sends, and the baseline method (the model's own count of the
last prompt plus a calibrated delta), each over sessions of a few turns through the real services."""

from __future__ import annotations

import json
import statistics
import uuid
from dataclasses import replace

from bench import _common
from bench.agent import WINDOW, _responder, system
from ollama_sim.models import default_models
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import common_pb2
from palimpsest.v1 import compressor_pb2 as cpb

NEEDS_POSTGRES = True
Message = common_pb2.Message
NEXT = "turn {turn}: please handle marker-{turn}"


def _head(body: dict) -> list[Message]:
    """The system messages a chat request begins with: the system prompt and the memory message."""
    head = []
    for message in body["messages"]:
        if message["role"] != "system":
            break
        head.append(Message(role="system", content=message["content"]))
    return head


async def _off(
    agent, compressor, sim, model: str, profile: str, turns: int, preamble: bool
) -> tuple[float | None, int]:
    """One session of ``turns`` turns, then (estimate − real) ÷ real for its next prompt (None when a
    compression came before that prompt: it is then not the context that was counted), and the method."""
    session_id = ""
    for turn in range(turns):
        async for event in agent.RunStream(
            pb.RunStreamRequest(session_id=session_id, profile_id=profile, text=NEXT.format(turn=turn))
        ):
            session_id = event.session_id
    sent = [b for b in sim.bodies() if b.get("model") == model and b.get("stream") is not False][-1]
    schemas = [json.dumps(t, ensure_ascii=False) for t in sent.get("tools") or ()]
    estimate = await compressor.EstimateTokens(
        cpb.EstimateTokensRequest(
            session_id=session_id,
            model=model,
            window=WINDOW,
            incoming=[Message(role="user", content=NEXT.format(turn=turns))],
            preamble=_head(sent) if preamble else (),
            tool_schemas=schemas if preamble else (),
        )
    )
    before, compressed = len(sim.chats), False
    async for event in agent.RunStream(
        pb.RunStreamRequest(session_id=session_id, profile_id=profile, text=NEXT.format(turn=turns))
    ):
        compressed = compressed or event.HasField("compression_started")
    real = sim.chats[before].prompt_eval_count
    return (None if compressed else (estimate.tokens - real) / real), estimate.method


async def run(args) -> str:
    exact, calibrated = f"meaning-exact-{uuid.uuid4().hex[:6]}", f"meaning-calibrated-{uuid.uuid4().hex[:6]}"
    tools = {
        "custom_tools": ["bench.agent:DenseOutputTool"],
        "agent_tools": ["todo", "memory_search", "fetch_report"],
        "context_window": WINDOW,
        "max_iterations": 6,
        "memory_recall_enabled": False,
    }
    profiles = [{"id": "exact", "model": exact, **tools}, {"id": "calibrated", "model": calibrated, **tools}]
    sessions = range(2, 6 if args.quick else 14)  # sessions of 2, 3, … turns
    rows = []
    async with system(args.server, "estimate_meaning", profiles) as (sim, _store, agent, running):
        spec = default_models()["qwen3.6"]
        sim.models[exact], sim.models[calibrated] = spec, replace(spec, vocabulary=None)
        sim.set_responder(_responder)
        compressor = running.servicer.deps.compressor
        cases = [
            ("exact: stored context only (before)", exact, "exact", False),
            ("exact: with preamble and tool schemas", exact, "exact", True),
            ("baseline method (no vocabulary)", calibrated, "calibrated", True),
        ]
        for label, model, profile, preamble in cases:
            offs, methods, skipped = [], set(), 0
            for turns in sessions:
                off, method = await _off(agent, compressor, sim, model, profile, turns, preamble)
                if off is None:
                    skipped += 1
                    continue
                offs.append(off)
                methods.add(cpb.EstimateMethod.Name(method).removeprefix("ESTIMATE_METHOD_").lower())
            rows.append(
                [
                    label,
                    "/".join(sorted(methods)),
                    f"{len(offs)} (+{skipped} compressed first)",
                    f"{statistics.median(map(abs, offs)):.1%}",
                    f"{max(map(abs, offs)):.1%}",
                    f"{sum(1 for o in offs if o < 0) / len(offs):.0%}",
                ]
            )
    return (
        "EstimateTokens on a stored session, against the simulator's count of the prompt the next turn's first "
        f"call really sent, over {len(sessions)} sessions of {sessions.start}–{sessions.stop - 1} turns each "
        f"(the long-run conversation of `bench agent`: tool calls with large and dense outputs; {WINDOW}-token "
        "window). A session whose next turn compressed before its first call is left out (that call did not "
        "send the context counted). Off is |estimate − real| ÷ real; *low* the share under the real count. The first row is what "
        "the exact method counted before: the stored context without the system prompt, memory message and "
        "tool schemas the model also gets; the baseline method always had them (inside the model's own count "
        "of the last prompt).\n\n"
        + _common.table(["EstimateTokens", "method", "sessions", "median off", "worst off", "low"], rows)
    )

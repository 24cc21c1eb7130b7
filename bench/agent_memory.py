"""Prefix reuse with memory writes in the run: two sessions of one owner in an 8,192-token window
through the real services and the simulator, each writing the owner's memory every few turns (the
second starts after the first has written some), their turns interleaved. Of each session's model
calls with no compression between them, the share whose prompt begins with the previous call's
whole message list (what Ollama keeps evaluated); how often the memory message changed between two
calls of a session, with a compression between them and without; and the same share had every call
carried the memory as it was at that moment instead of the session's snapshot."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from bench import _common
from bench.agent import WINDOW, prefix_reuse, settled, system
from ollama_sim import Reply
from palimpsest.agent.context_builder import MEMORY_HEADING, memory_message
from palimpsest.shared.settings import Settings
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import session_store_pb2 as store_pb

NEEDS_POSTGRES = True
FILLER = (
    "The deployment notes say the service restarts cleanly, the queue drains within the hour, and the "
    "dashboards show no errors after the change. "
) * 6
_TURN = re.compile(r"^\[(?P<session>[AB])\] turn (?P<turn>\d+):")
_FACT = re.compile(r"^Remembered as entry \d+: (?P<text>.*)$", re.MULTILINE)


@dataclass
class Run:
    """What the simulator saw, in arrival order: each chat call's session and prompt, and the
    memory as it was when the call came (every write committed before its tool result is sent)."""

    calls: dict[str, list[list[dict]]] = field(default_factory=lambda: defaultdict(list))
    live: list[str] = field(default_factory=list)
    live_at_call: dict[str, list[list[str]]] = field(default_factory=lambda: defaultdict(list))

    def respond(self, body: dict) -> Reply:
        messages = body.get("messages") or []
        if body.get("stream") is False:  # a summary (or a title)
            return Reply(text="- the user asked about deployments and topics\nKEYS: deployment, topic")
        last = last_said(messages)
        if last.get("role") == "tool" and last.get("tool_name") == "memory":
            self.live += [m["text"] for m in _FACT.finditer(last.get("content", ""))]
        user = next(m for m in reversed(messages) if m.get("role") == "user" and _TURN.match(m.get("content", "")))
        tag = _TURN.match(user["content"])
        assert tag is not None
        session, turn = tag["session"], int(tag["turn"])
        self.calls[session].append(messages)
        self.live_at_call[session].append(list(self.live))
        if last.get("role") == "user" and turn % 4 == 1:
            return Reply(
                tool_calls=[
                    ("memory", {"action": "add", "text": f"{session}{turn}: the user cares about topic {turn}"})
                ]
            )
        if last.get("role") == "user" and turn % 4 == 3:
            return Reply(tool_calls=[("todo", {"action": "add", "items": [f"look at topic {turn}"]})])
        return Reply(text=f"About topic {turn}: {FILLER}")


def last_said(messages: list[dict]) -> dict:
    """The prompt's last message that is not a note (the iteration budget is given from the second call)."""
    return next(m for m in reversed(messages) if m.get("role") != "system")


def memory_of(messages: list[dict]) -> str:
    second = messages[1] if len(messages) > 1 else {}
    return (
        second.get("content", "")
        if second.get("role") == "system" and str(second.get("content", "")).startswith(MEMORY_HEADING)
        else ""
    )


def with_memory(messages: list[dict], memory: str) -> list[dict]:
    """The prompt as it would have been with ``memory`` as its memory message."""
    rest = messages[2:] if memory_of(messages) else messages[1:]
    return [messages[0], *([{"role": "system", "content": memory}] if memory else []), *rest]


def changes(prompts: list[list[dict]]) -> tuple[int, int]:
    """(memory message changes between two calls with a compression between them, without)."""
    at_compression = between = 0
    for before, after in zip(prompts, prompts[1:]):
        if memory_of(before) == memory_of(after):
            continue
        compressed = prefix_reuse([before, after])[1] == 0  # the pair is not counted: a compression between
        at_compression += compressed
        between += not compressed
    return at_compression, between


async def run(args) -> str:
    turns_a = 24 if args.quick else 60
    b_from = turns_a // 3
    profile = {
        "id": "mem",
        "model": "qwen3.6",
        "context_window": WINDOW,
        "think_enabled": False,
        "memory_recall_enabled": False,
        "max_iterations": 6,
        "tools": {"agent": ["plan", "todo", "scratchpad", "memory_search", "session_search", "memory"]},
    }
    recorded = Run()
    ids: dict[str, str] = {}
    async with system(args.server, "agent_memory", [profile]) as (sim, store, agent, _):
        sim.set_responder(recorded.respond)

        async def turn(session: str, n: int) -> None:
            request = pb.RunStreamRequest(
                session_id=ids.get(session, ""),
                profile_id="mem",
                text=f"[{session}] turn {n}: tell me more about topic {n}",
            )
            async for event in agent.RunStream(request):
                ids.setdefault(session, event.session_id)
            await settled(store, ids[session])  # the post-turn pass done, as the user's next message finds it

        for n in range(turns_a):
            await turn("A", n)
            if n >= b_from:
                await turn("B", n - b_from)
        memory = await store.GetMemory(store_pb.GetMemoryRequest())
    budget = Settings().memory_prompt_tokens
    rows = []
    for session in ("A", "B"):
        prompts = recorded.calls[session]
        reused, pairs = prefix_reuse(prompts)
        live = [with_memory(p, memory_message(m, budget)) for p, m in zip(prompts, recorded.live_at_call[session])]
        live_reused, live_pairs = prefix_reuse(live)
        at_compression, between = changes(prompts)
        compressions = sum(1 for b, a in zip(prompts, prompts[1:]) if prefix_reuse([b, a])[1] == 0)
        writes = sum(1 for p in prompts if last_said(p).get("tool_name") == "memory")
        rows.append(
            [
                session,
                len(prompts),
                writes,
                compressions,
                f"{reused / pairs:.1%} of {pairs}",
                between,
                at_compression,
                f"{live_reused / live_pairs:.1%} of {live_pairs}",
            ]
        )
    return (
        f"Two sessions of one owner, {turns_a} and {turns_a - b_from} turns in an {WINDOW}-token window (the "
        f"second starts after the first's turn {b_from}, their turns interleaved), each writing the owner's "
        f"memory every fourth turn ({len(memory.entries)} entries at the end). *Prefix reused*: of a session's "
        "chat calls that follow another of the same session with no compression between them, the share whose "
        "prompt begins with that call's whole message list. *Memory changes*: consecutive calls of a session "
        "whose memory message differs, without a compression between them and with one. *Read live*: the "
        "prefix reused had each call carried the memory as it was when the call came.\n\n"
        + _common.table(
            [
                "session",
                "chat calls",
                "memory writes",
                "compressions",
                "prefix reused",
                "memory changes between compressions",
                "memory changes at a compression",
                "prefix reused, memory read live",
            ],
            rows,
        )
    )

"""What compaction costs the model on varied content: a long conversation through the real
services and the simulator, with tool outputs as hard to prune as real ones (dense logs, JSON with
random ids, code, CJK documents, a critical config the tool marks as such), user messages and
answers of every length, and tool loops of several calls in one turn; in 8k and 4k windows, on
both counting paths. Reported: LLM summaries per 100 turns, compressions by method, re-fires,
the share of simulated model time spent on summaries at CPU- and GPU-class speeds (with Ollama's
prefix reuse), the summary tokens generated, and that nothing was cut or lost."""

from __future__ import annotations

import json
import logging
import os
import random
import re
import uuid
from dataclasses import dataclass, field, replace

from bench import _common
from bench.agent import _CutAlarms, _dense_log, _settle, nothing_lost, system
from ollama_sim import Reply
from palimpsest.v1 import agent_pb2 as pb

log = logging.getLogger("bench.compaction")
NEEDS_POSTGRES = True
TURNS = 150
QUICK_TURNS = 45
WINDOWS = (8192, 4096)
# Simulated model speeds (prompt tokens/s, generated tokens/s): an 8B model on a laptop CPU, and
# on one consumer GPU.
SPEEDS = {"CPU-class": (200, 15), "GPU-class": (1_500, 50)}
# What the simulated summarizer writes when the request names no length: the measurement.
DEFAULT_SUMMARY_TOKENS = 400

_PROSE = (
    "The rollout keeps the old billing path warm until the error budget recovers; the migration "
    "job copies invoices in batches of 500 and verifies each checksum before it moves on. "
)
_CJK = (
    "计费服务迁移到新集群后，错误预算恢复前保留旧路径。設定ファイルを読み込み、各ワーカーにジョブを"
    "割り当てます。배포가 끝나면 모니터링 대시보드에서 지연 시간을 확인하세요。"
)
_WORDS = (
    "invoice ledger shard replica lease worker queue retry backoff checksum schema cursor batch "
    "tenant region quota token budget window summary pipeline"
).split()


def _text(rng: random.Random, chars: int) -> str:
    """Prose, CJK or a code fragment of about ``chars`` characters."""
    kind = rng.choice(["prose", "prose", "cjk", "code"])
    if kind == "code":
        body = "\n".join(
            f"    {rng.choice(_WORDS)}_{rng.randint(1, 999)} = fetch('{rng.choice(_WORDS)}', "
            f"id=0x{rng.getrandbits(32):08x})"
            for _ in range(chars // 50 + 1)
        )
        return ("def step():\n" + body)[:chars]
    unit = _PROSE if kind == "prose" else _CJK
    return (unit * (chars // len(unit) + 1))[:chars]


def _json_rows(rng: random.Random, tokens: int) -> str:
    """API output: nested records with random ids, floats and names (about 2.5 chars a token)."""
    rows: list[dict] = []
    while len(json.dumps(rows)) < tokens * 2.6:
        rows.append(
            {
                "id": str(uuid.UUID(int=rng.getrandbits(128))),
                "tenant": f"t-{rng.randint(1, 9999)}",
                "status": rng.choice(["ok", "failed", "pending"]),
                "latency_ms": round(rng.random() * 900, 3),
                "tags": rng.sample(_WORDS, 3),
                "region": rng.choice(["eu-west-1", "us-east-2", "ap-south-1"]),
            }
        )
    return json.dumps({"rows": rows}, indent=1)


def _code(rng: random.Random, tokens: int) -> str:
    out: list[str] = []
    while sum(len(line) for line in out) < tokens * 3.2:
        name = f"{rng.choice(_WORDS)}_{rng.choice(_WORDS)}_{rng.randint(1, 99)}"
        out.append(
            f"def {name}(ctx, {rng.choice(_WORDS)}: int = {rng.randint(0, 4096)}) -> dict:\n"
            f'    """{rng.choice(_WORDS).title()} the {rng.choice(_WORDS)} of one '
            f'{rng.choice(_WORDS)}."""\n    key = f"{{ctx.region}}/{rng.getrandbits(40):010x}"\n'
            f"    return ctx.call('{name}', key, retries={rng.randint(1, 9)})\n"
        )
    return "\n".join(out)


def _cjk_doc(rng: random.Random, tokens: int) -> str:
    lines: list[str] = []
    while sum(len(line) for line in lines) < tokens * 1.3:
        lines.append(f"| {rng.randint(1, 9999):04d} | {_CJK[rng.randint(0, 40) :][:30]} | {rng.random():.4f} |")
    return "\n".join(lines)


def tool_output(kind: str, turn: int, call: int) -> str:
    """A tool result of 1,500–3,000 tokens (about), of the given kind, the same for a turn and call."""
    rng = random.Random(turn * 31 + call)
    tokens = 1_500 + (turn * 7919 + call * 104_729) % 1_501
    if kind == "log":
        return _dense_log(turn * 31 + call, tokens)
    if kind == "json":
        return _json_rows(rng, tokens)
    if kind == "code":
        return _code(rng, tokens)
    if kind == "config":  # about 5,000 characters, marked critical by the tool
        return "\n".join(f"{rng.choice(_WORDS)}.{rng.choice(_WORDS)}_{i} = {rng.getrandbits(24)}" for i in range(160))
    return _cjk_doc(rng, tokens)


class VariedTool:
    """A tool whose outputs are as hard to prune as real ones; ``config`` results are critical."""

    name = "fetch_report"
    reach = "engine"
    description = "Fetch a report (log, json, code, cjk or config) for a topic."
    parameters = {
        "type": "object",
        "properties": {"kind": {"type": "string"}, "topic": {"type": "string"}, "call": {"type": "integer"}},
        "required": ["kind", "topic"],
    }

    async def run(self, args: dict, ctx):
        from palimpsest.agent.tools.base import ToolResult

        turn = int(str(args["topic"]).rsplit("-", 1)[-1])
        kind = args["kind"]
        critical = kind == "config" and "critical" not in ablated()
        return ToolResult(content=tool_output(kind, turn, int(args.get("call", 0))), critical=critical)


def ablated() -> set[str]:
    """What COMPACTION_ABLATE switches off to measure its cost: "critical" (the config is an
    ordinary result), "recall" (no excerpts recalled after a summary); e.g. "critical,recall"."""
    return {w.strip() for w in os.environ.get("COMPACTION_ABLATE", "").split(",") if w.strip()}


def user_text(turn: int) -> str:
    """A turn's request: short, medium or long (a pasted log, code or CJK text)."""
    rng = random.Random(10_000 + turn)
    head = f"turn {turn}: please handle marker-{turn}"
    size = rng.choices([rng.randint(0, 80), rng.randint(200, 600), rng.randint(1_200, 2_500)], weights=[14, 5, 1])[0]
    return head if not size else f"{head}\n{_text(rng, size)}"


# The two mixes: the (one tool output every third turn) and the same with an autonomous loop
# of three calls every twelfth turn (about 4,000 tokens in one turn at 8k).
MIXES = {"every 3rd turn": False, "+ loops": True}


def calls_in(turn: int, loops: bool = True) -> int:
    """Tool calls a turn makes: one every third turn, a loop of three every twelfth (with loops)."""
    return 3 if loops and turn % 12 == 0 else 1 if turn % 3 == 0 else 0


def kind_of(turn: int, call: int) -> str:
    if turn % 15 == 6 and call == 0:
        return "config"
    return ("log", "json", "code", "cjk")[(turn // 3 + call) % 4]


@dataclass
class Model:
    """The scripted model; it keeps what it generated, in request order, for the time accounting."""

    loops: bool = True
    generated: list[int] = field(default_factory=list)

    def __call__(self, body) -> Reply:
        reply = self.reply(body)
        from ollama_sim.prompt import count_text_tokens

        self.generated.append(count_text_tokens(reply.text) + 20 * len(reply.tool_calls))
        return reply

    def reply(self, body) -> Reply:
        messages = body.get("messages") or []
        if not body.get("stream", True):
            first = str(messages[0].get("content", "")) if messages else ""
            return Reply(text="Varied work") if first.startswith("Name the conversation") else summary(body)
        index = next(
            (
                i
                for i in range(len(messages) - 1, -1, -1)
                if messages[i].get("role") == "user" and re.match(r"turn \d+:", str(messages[i].get("content", "")))
            ),
            -1,
        )
        turn = int(re.match(r"turn (\d+)", messages[index]["content"]).group(1)) if index >= 0 else 0
        done = sum(1 for m in messages[index + 1 :] if m.get("role") == "tool")
        if done < calls_in(turn, self.loops):
            return Reply(
                tool_calls=[("fetch_report", {"kind": kind_of(turn, done), "topic": f"marker-{turn}", "call": done})]
            )
        rng = random.Random(20_000 + turn)
        size = rng.choices(
            [rng.randint(100, 400), rng.randint(400, 1_000), rng.randint(1_200, 2_000)], weights=[5, 4, 1]
        )[0]
        return Reply(text=f"Answer for turn {turn}: noted marker-{turn}. " + _text(rng, size))


def summary(body) -> Reply:
    """A summary as long as the request asks ("at most N words", as tokens here) or
    DEFAULT_SUMMARY_TOKENS, never past num_predict (Ollama stops there, mid-sentence)."""
    from ollama_sim.prompt import count_text_tokens

    text = json.dumps(body.get("messages") or [])
    asked = re.search(r"at most (\d+) words", str((body.get("messages") or [{}])[-1].get("content", "")))
    tokens = int(asked.group(1)) if asked else DEFAULT_SUMMARY_TOKENS
    tokens = min(tokens, int((body.get("options") or {}).get("num_predict") or tokens))
    keys = sorted(set(re.findall(r"marker-\d+", text)))[:30]
    lines = [f"- Work on {k}: reports read, results noted, nothing left open." for k in keys] or ["- Earlier work."]
    out = "\n".join(lines) + "\nKEYS: " + ", ".join(keys or ["reports"])
    while count_text_tokens(out) < tokens:
        out = "- The reports were read and their figures kept.\n" + out
    while count_text_tokens(out) > tokens and "\n" in out:
        out = out.rsplit("\n", 1)[0]  # num_predict cut it: the KEYS line goes first
    return Reply(text=out)


def is_summary_body(body: dict) -> bool:
    messages = body.get("messages") or []
    return body.get("stream") is False and not str(messages[0].get("content", "")).startswith("Name the conversation")


def model_time(bodies: list[dict], generated: list[int], speeds: tuple[int, int]) -> tuple[float, float]:
    """(simulated model seconds, those on summaries): each request evaluates its prompt less the
    longest run of leading messages (and the same tools) it shares with the request before, which
    Ollama keeps evaluated; then generates what the model answered."""
    prompt_rate, generate_rate = speeds
    total = on_summaries = 0.0
    for body, answer, evaluated in zip(bodies, generated, _common.evaluated_tokens(bodies)):
        seconds = evaluated / prompt_rate + answer / generate_rate
        total += seconds
        on_summaries += seconds if is_summary_body(body) else 0.0
    return total, on_summaries


@dataclass
class Run:
    name: str
    turns: int
    methods: dict[str, int]
    compress_turns: list[int]
    summaries: int
    summary_tokens: int
    time: dict[str, tuple[float, float]]
    cut: int
    too_large: int
    lost: list


async def one_run(server, turns: int, path: str, window: int, mix: str = "+ loops") -> Run:
    from ollama_sim.models import default_models

    model_name = f"varied-{path}-{window}-{uuid.uuid4().hex[:6]}"
    spec = default_models()["qwen3.6"]
    spec = spec if path == "exact" else replace(spec, vocabulary=None)
    profile = {
        "id": "varied",
        "model": model_name,
        "context_window": window,
        "max_iterations": 6,
        "memory_recall_enabled": "recall" not in ablated(),
        "custom_tools": ["bench.compaction:VariedTool"],
        "agent_tools": ["todo", "memory_search", "fetch_report"],
    }
    model = Model(loops=MIXES[mix])
    too_large = 0
    alarms = _CutAlarms()
    logging.getLogger("palimpsest").addHandler(alarms)
    try:
        async with system(server, f"compaction_{path}_{window}", [profile]) as (sim, store, agent, running):
            sim.models[model_name] = spec
            sim.set_responder(model)
            session_id = ""
            for turn in range(turns):
                async for event in agent.RunStream(pb.RunStreamRequest(session_id=session_id, text=user_text(turn))):
                    session_id = event.session_id
                    if (
                        event.HasField("stream_end")
                        and event.stream_end.reason == pb.STREAM_END_REASON_CONTEXT_TOO_LARGE
                    ):
                        too_large += 1
                await _settle(running)
            bodies = [b for b in sim.bodies() if b.get("model") == model_name]
            cut = sum(1 for c in sim.chats if c.model == model_name and c.truncated)
            methods, compress_turns = await _common.compressions(store, session_id)
            lost = await nothing_lost(store, session_id, turns, window, prose=True)
    finally:
        logging.getLogger("palimpsest").removeHandler(alarms)
    summary_bodies = [i for i, b in enumerate(bodies) if is_summary_body(b)]
    if os.environ.get("COMPACTION_TRACE"):  # the prefix form and the standalone one it falls back to
        alone = [i for i in summary_bodies if not bodies[i].get("tools")]
        log.warning("%s, %s, %d: %d of %d summaries standalone", mix, path, window, len(alone), len(summary_bodies))
    return Run(
        f"{mix}, {path}, {window:,}",
        turns,
        methods,
        compress_turns,
        len(summary_bodies),
        sum(model.generated[i] for i in summary_bodies),
        {name: model_time(bodies, model.generated, speeds) for name, speeds in SPEEDS.items()},
        cut,
        too_large,
        lost,
    )


def rows(runs: list[Run]) -> tuple[list[list], list[list]]:
    first, second = [], []
    for r in runs:
        per100 = 100 / r.turns
        count = len(r.compress_turns)  # prunes at a turn's end aside
        again = _common.refires(r.compress_turns)
        first.append(
            [
                r.name,
                r.turns,
                count,
                ", ".join(f"{k} {v}" for k, v in sorted(r.methods.items())),
                f"{r.summaries * per100:.1f}",
                f"{again} of {count} ({again / max(1, count):.1%})",
                f"{r.summary_tokens * per100:,.0f}",
            ]
        )
        cells = [r.name]
        for name in SPEEDS:
            total, on = r.time[name]
            cells.append(f"{on / total:.1%} ({on:,.0f} of {total:,.0f} s)")
        second.append(cells + [r.cut, r.too_large, *r.lost])
    return first, second


def chosen(name: str, only: str) -> bool:
    """Whether a run's name ("+ loops, exact, 4096") is among ``only``'s ";"-separated parts, each
    a set of ","-separated words it must all contain ("" runs everything): to iterate on a few rows."""
    parts = [[w.strip() for w in part.split(",") if w.strip()] for part in only.split(";") if part.strip()]
    return not parts or any(all(w in name for w in words) for words in parts)


async def run(args) -> str:
    turns = QUICK_TURNS if args.quick else TURNS
    # e.g. COMPACTION_ROWS="3rd, exact, 4096; loops, calibrated" (a full table without it)
    only = os.environ.get("COMPACTION_ROWS", "")
    runs = [
        await one_run(args.server, turns, path, window, mix)
        for mix in MIXES
        for window in WINDOWS
        for path in ("exact", "calibrated")
        if chosen(f"{mix}, {path}, {window}", only)
    ]
    first, second = rows(runs)
    return (
        f"Compaction on varied content: {turns} turns through the real services and the simulator, in an "
        "8,192- and a 4,096-token window, on the exact path (the simulator serves the model's vocabulary) and "
        "the calibrated one (it does not). Every third turn calls a tool whose output is 1,500–3,000 tokens "
        "of dense server log, JSON with random ids, code or a CJK table (*every 3rd turn*: the issue's mix); "
        "*+ loops*: every twelfth turn loops through three such calls, besides. Every fifteenth turn reads a 5,000-character config the tool marks critical. Requests "
        "are a line (70%), a paragraph of 200–600 characters (25%) or a pasted 1,200–2,500 (5%); answers "
        "100–400 characters (50%), 400–1,000 (40%) or 1,200–2,000 (10%) of prose, CJK or code. *Re-fires*: compressions within 3 turns of the previous one. *Prune at turn end*: a turn's tool results pruned as it ends or between a loop's iterations, and old long requests and answers condensed (COMPRESSION_REASON_TURN_END, no LLM call): counted apart, never a re-fire. *Summary tokens*: what the "
        "simulated summarizer generated, per 100 turns (it writes what the request asks for, "
        f"{DEFAULT_SUMMARY_TOKENS} tokens when it names no length, never past `num_predict`).\n\n"
        + _common.table(
            [
                "run",
                "turns",
                "compressions",
                "by method",
                "LLM summaries / 100 turns",
                "re-fires within 3 turns",
                "summary tokens / 100 turns",
            ],
            first,
        )
        + "\n\n*Model time on summaries*: each request's prompt less the leading messages (and tools) it "
        "shares with the request before — what Ollama keeps evaluated — at the speed's prompt rate, plus what "
        "was generated at its generation rate; CPU-class 200 / 15 tokens a second, GPU-class 1,500 / 50. "
        "*Found by memory_search*: tool results, requests and answers (over twice the window's preview size: 600 "
        "characters at 16,384 and more, 300 at 8,192, 150 at 4,096) no longer verbatim "
        "in the context whose words from beyond the preview the store's memory search returns.\n\n"
        + _common.table(
            [
                "run",
                *(f"model time on summaries, {n}" for n in SPEEDS),
                "prompts cut by Ollama",
                "ended CONTEXT_TOO_LARGE",
                "compressed-away results found by memory_search",
                "user messages shown once",
                "live summaries at the end",
            ],
            second,
        )
    )

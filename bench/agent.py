"""Agent benchmarks: the services' added latency to the first streamed token as a session grows,
and the figures of a 300-turn conversation in an 8,192-token window."""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import grpc
import httpx

from bench import _common
from ollama_sim import OllamaSimulator, Reply
from ollama_sim.server import VERSION
from palimpsest.shared.ports import free_port
from palimpsest.shared.prose_weight import PRUNED_NOTE
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import agent_pb2_grpc, common_pb2, session_store_pb2_grpc
from palimpsest.v1 import session_store_pb2 as store_pb
from tests.agent.test_agent_long import BigOutputTool

NEEDS_POSTGRES = True
Message = common_pb2.Message
WINDOW = 8192


@asynccontextmanager
async def system(server, label: str, profiles: list[dict], version: str = VERSION):
    """Store, Compressor and Agent on loopback ports, the simulator for Ollama (``version``: the
    Ollama it stands for, which chooses its engine)."""
    from palimpsest.agent.app import start_agent
    from palimpsest.compressor.app import start_compressor
    from palimpsest.shared.settings import Settings

    with OllamaSimulator(version=version) as sim, tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "profiles.json"
        path.write_text(json.dumps({"profiles": profiles}))
        async with _common.fresh_database(server, label) as dsn:
            async with _common.running_store(dsn) as (store_server, store):
                settings = replace(
                    Settings(), ollama_host=sim.url, store_addr=store_server.address, profiles_path=str(path)
                )
                compressor = await start_compressor(settings, port=0)
                agent = await start_agent(replace(settings, compressor_addr=compressor.address), port=0)
                try:
                    async with grpc.aio.insecure_channel(agent.address) as channel:
                        yield sim, store, agent_pb2_grpc.AgentStub(channel), agent
                finally:
                    await agent.stop(0)
                    await compressor.stop(0)


@asynccontextmanager
async def service_processes(server, label: str, profiles: list[dict]):
    """Store, Compressor and Agent each in a process of its own, as they are deployed (in one
    process they share one interpreter lock with each other and with the simulator); the
    simulator stands for Ollama in this process."""
    with OllamaSimulator() as sim, tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "profiles.json"
        path.write_text(json.dumps({"profiles": profiles}))
        async with _common.fresh_database(server, label) as dsn:
            ports = {name: free_port() for name in ("store", "compressor", "agent")}
            env = {
                "DATABASE_URL": dsn,
                "OLLAMA_HOST": sim.url,
                "PALIMPSEST_PROFILES": str(path),
                "PALIMPSEST_DATA_DIR": tmp,
                "PALIMPSEST_FILES_ROOT": str(Path(tmp) / "files"),
                **{f"PALIMPSEST_{name.upper()}_ADDR": f"127.0.0.1:{port}" for name, port in ports.items()},
            }
            async with _common.processes([("palimpsest.store", env)]):
                await _common.wait_ready(f"127.0.0.1:{ports['store']}")
                async with _common.processes([("palimpsest.compressor", env)]):
                    await _common.wait_ready(f"127.0.0.1:{ports['compressor']}")
                    async with _common.processes([("palimpsest.agent", env)]):
                        await _common.wait_ready(f"127.0.0.1:{ports['agent']}")
                        async with (
                            grpc.aio.insecure_channel(f"127.0.0.1:{ports['agent']}") as agent,
                            grpc.aio.insecure_channel(f"127.0.0.1:{ports['store']}") as store,
                        ):
                            yield sim, session_store_pb2_grpc.SessionStoreStub(store), agent_pb2_grpc.AgentStub(agent)


async def settled(store, session_id: str) -> None:
    """The post-turn pass of the last turn has written what it writes: the session's revision
    holds still for 50 ms (a benchmark's wait, between measurements)."""
    revision = -1
    while True:
        now = (
            await store.GetSession(
                store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_SUMMARY)
            )
        ).session.revision
        if now == revision:
            return
        revision = now
        await asyncio.sleep(0.05)


async def seed(store, stored: int, chatter: _common.Chatter) -> str:
    """A long session as compression leaves it: old rows out of the context, a summary, a recent tail.
    Each turn's pair is one append under a key of its own, as turns leave a session: the store keeps
    a day of keys, and every keyed append clears the expired ones (batches without keys hid what
    that cost a session built turn by turn)."""
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="bench", model="qwen3.6"))).session
    live_from = max(0, stored - 16)
    for i in range(stored // 2):
        user, assistant = chatter.turn(150, 400)
        pair = [
            Message(role=role, content=content, explicit_flags=True, is_context=i * 2 + k >= live_from, is_display=True)
            for k, (content, role) in enumerate(((user, "user"), (assistant, "assistant")))
        ]
        await store.AppendMessages(
            store_pb.AppendMessagesRequest(session_id=session.id, messages=pair, idempotency_key=f"seed-{i}")
        )
    if stored > 16:
        summary = Message(
            role="user",
            content="- Summary of the earlier conversation.",
            is_summary=True,
            explicit_flags=True,
            is_context=True,
            is_display=False,
            replaces=common_pb2.SeqRange(first=1, last=live_from),
        )
        await store.AppendMessages(store_pb.AppendMessagesRequest(session_id=session.id, messages=[summary]))
    return session.id


async def first_text_direct(sim_url: str, body: dict) -> float:
    """Seconds to the first content chunk when the same body goes straight to the simulator."""
    async with httpx.AsyncClient(base_url=sim_url, timeout=60) as http:
        started = time.perf_counter()
        async with http.stream("POST", "/api/chat", json=body) as response:
            async for line in response.aiter_lines():
                if line and json.loads(line).get("message", {}).get("content"):
                    return time.perf_counter() - started
    raise RuntimeError("no content")


async def added_latency(server, quick: bool) -> str:
    rows = []
    overhead_at: dict[int, float] = {}
    profile = {
        "id": "bench",
        "model": "qwen3.6",
        "context_window": WINDOW,
        "think_enabled": False,
        "memory_recall_enabled": False,
    }
    async with service_processes(server, "agent_latency", [profile]) as (sim, store, agent):
        sim.set_responder(lambda body: Reply(text="ok " * 5))
        chatter = _common.Chatter(3)
        for stored in (10, 1_000, 10_000):
            session_id = await seed(store, stored, chatter)
            agent_times, direct_times, tail_times = [], [], []
            async for _ in agent.RunStream(pb.RunStreamRequest(session_id=session_id, text="warm up")):
                pass  # the first turn of a session pays for model facts and cold caches
            await settled(store, session_id)
            for i in range(8 if quick else 30):
                started = last_token = time.perf_counter()
                async for event in agent.RunStream(pb.RunStreamRequest(session_id=session_id, text=f"question {i}")):
                    if event.HasField("text_delta"):
                        last_token = time.perf_counter()
                        if not agent_times[i:]:
                            agent_times.append(last_token - started)
                    elif event.HasField("stream_end"):
                        tail_times.append(time.perf_counter() - last_token)
                await settled(store, session_id)
                direct_times.append(await first_text_direct(sim.url, sim.bodies()[-1]))
            agent_p50, direct_p50 = _common.p50(agent_times), _common.p50(direct_times)
            overhead_at[stored] = agent_p50 - direct_p50
            rows.append(
                [
                    f"{stored:,}",
                    _common.ms(direct_p50),
                    _common.ms(agent_p50),
                    _common.ms(_common.percentile(agent_times, 95)),
                    _common.ms(agent_p50 - direct_p50),
                    _common.ms(_common.p50(tail_times)),
                    _common.ms(_common.percentile(tail_times, 95)),
                ]
            )
    ratio = overhead_at[10_000] / overhead_at[10] if overhead_at[10] > 0 else float("inf")
    return (
        "Time to the first text delta: RunStream through the Agent (which stores the message while the "
        "Compressor sizes the prompt and the model starts on it), the three services each in a process of its "
        "own as deployed, against the same request body sent straight "
        "to the simulator. Long sessions are seeded as compression leaves them (a summary and a recent "
        "tail in the context, the rest in the display history only), one turn at a time, each under an "
        "idempotency key of its own as the Agent writes them. Target: ≤ 5 ms added at 10,000, "
        f"and at most 2× the overhead at 10. Measured ratio 10,000 / 10: {ratio:.2f}. *Last token → "
        "stream_end*: from the last text delta to stream_end as the client sees them, the time the answer and "
        "the call's report take to be stored (one message on the turn's open append stream; target ≤ 3 ms "
        "at 10,000).\n\n"
        + _common.table(
            [
                "stored messages",
                "direct p50",
                "RunStream p50",
                "RunStream p95",
                "added p50",
                "last token → stream_end p50",
                "p95",
            ],
            rows,
        )
    )


async def _settle(running) -> float:
    """Wait for post-turn work; returns how long it took."""
    started = time.perf_counter()
    while running.servicer.deps.post_turn_tasks:
        await asyncio.sleep(0.002)
    return time.perf_counter() - started


def _dense_log_tokens(turn: int) -> int:
    """Sizes of the dense log outputs: spread over about 300–3,000 tokens."""
    return 300 + (turn * 7919) % 2701


class DenseOutputTool(BigOutputTool):
    """The long test's report tool, plus dense server logs (timestamps, IPs, hex ids) of varying size."""

    description = "Fetch a report of the given kind (json, log, code or dense) for a topic."

    async def run(self, args: dict, ctx):
        from palimpsest.agent.tools.base import ToolResult

        if args.get("kind") != "dense":
            return await super().run(args, ctx)
        turn = int(args["topic"].rsplit("-", 1)[-1])
        return ToolResult(content=_dense_log(turn, _dense_log_tokens(turn)))


def _dense_log(turn: int, tokens: int) -> str:
    import random

    from bench.compressor import _dense_log as lines
    from ollama_sim.prompt import count_text_tokens

    rng = random.Random(turn)
    text = lines(rng, max(1, tokens // 60))
    while count_text_tokens(text) < tokens:
        text += "\n" + lines(rng, 1)
    return text


def _responder(body) -> Reply:
    """The long test's scripted model; every fourth tool turn asks for a dense log instead."""
    from tests.agent.test_agent_long import responder

    reply = responder(body)
    if reply.tool_calls:
        name, args = reply.tool_calls[0]
        turn = int(args["topic"].rsplit("-", 1)[-1])
        if turn % 12 >= 9:
            return replace(reply, tool_calls=[(name, {**args, "kind": "dense"})])
    return reply


class _CutAlarms(logging.Handler):
    """The "cut prompt:" warnings (a report proving its prompt cut, judged by the Agent or RecordBaseline), by the
    prompt_eval_count each one was raised on."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.reports: list[int] = []  # (raised by the Agent on a report it folds into its append)

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("cut prompt:"):
            self.reports.append(int(record.args[0]))


async def _long_path(
    server,
    quick: bool,
    path: str,
    version: str = VERSION,
    stats: dict | None = None,
    tool: str = "bench.agent:DenseOutputTool",
    spec=None,
) -> list:
    """The long conversation on the simulator's qwen3.6 (``path`` "exact") or on it without its
    vocabulary; ``spec``, when given, is the model to run instead (another family's)."""
    from ollama_sim.models import default_models
    from palimpsest.compressor.token_estimate import output_reserve
    from palimpsest.shared.settings import Settings
    from tests.agent.test_agent_long import png

    turns = 60 if quick else 300
    model = f"bench-{path}-{uuid.uuid4().hex[:6]}"
    if spec is None:
        spec = default_models()["qwen3.6"]
        spec = spec if path == "exact" else replace(spec, vocabulary=None)
    profile = {
        "id": "long",
        "model": model,
        "context_window": WINDOW,
        "max_iterations": 6,
        "custom_tools": [tool],
        "agent_tools": ["todo", "memory_search", "fetch_report"],
    }
    before_first_token = after_end = 0.0
    too_large = lost = 0
    alarms = _CutAlarms()
    logger = logging.getLogger("palimpsest")  # the Agent judges its reports; RecordBaseline the rest
    logger.addHandler(alarms)
    try:
        async with system(server, f"agent_long_{path}", [profile], version) as (sim, store, agent, running):
            sim.models[model] = spec
            sim.set_responder(_responder)
            session_id = ""
            for turn in range(turns):
                images = [png(512 if turn % 20 == 0 else 64)] if turn % 10 == 5 else []
                started_at = None
                async for event in agent.RunStream(
                    pb.RunStreamRequest(
                        session_id=session_id, text=f"turn {turn}: please handle marker-{turn}", images=images
                    )
                ):
                    session_id = event.session_id
                    if event.HasField("compression_started"):
                        started_at = time.perf_counter()
                    elif event.HasField("context_compressed") and started_at is not None:
                        before_first_token += time.perf_counter() - started_at
                    elif event.HasField("stream_end"):
                        too_large += event.stream_end.reason == pb.STREAM_END_REASON_CONTEXT_TOO_LARGE
                        lost += event.stream_end.reason != pb.STREAM_END_REASON_COMPLETED
                after_end += await _settle(running)
            # Compressions the window called for, by turn; a turn's results pruned as it ends (and old
            # long words condensed, no LLM call) are counted apart and are never a re-fire.
            methods, compress_turns = await _common.compressions(store, session_id)
            at_turn_end = methods.get("prune at turn end", 0)
            chats = [c for c in sim.chats if c.model == model]
            bodies = [b for b in sim.bodies() if b.get("model") == model]
            kept = await nothing_lost(store, session_id, turns, WINDOW)
            if stats is not None:
                stats.update(
                    engine=sim.engine,
                    refusals=sim.refusals,
                    lost=lost,
                    too_large=too_large,
                    cut=sum(1 for c in chats if c.truncated),
                    dropped=sum(c.dropped_messages for c in chats),
                )
    finally:
        logger.removeHandler(alarms)
    # A genuine alarm was raised on a report the simulator gave for a prompt it really cut.
    cut_reports = {c.prompt_eval_count for c in chats if c.truncated}
    false_alarms = sum(1 for r in alarms.reports if r not in cut_reports)
    limit = WINDOW - output_reserve(WINDOW, Settings().output_reserve_tokens)
    highest = max(c.prompt_tokens for c in chats if c.stream) / limit
    if stats is not None:
        stats["highest"] = f"{highest:.3f}"
    summary_ctx = {b["options"]["num_ctx"] for b in bodies if b.get("stream") is False}
    chat_ctx = {b["options"]["num_ctx"] for b in bodies if b.get("stream") is not False}
    refires = _common.refires(compress_turns)
    reused, pairs = prefix_reuse([b["messages"] for b in bodies if b.get("stream") is not False])
    summaries = sum(1 for b in bodies if b.get("stream") is False)
    all_time, summary_time = model_time(bodies)
    name = path if path == "exact" else "calibrated (no vocabulary)"
    return [
        name,
        turns,
        len(compress_turns),
        at_turn_end,
        summaries,
        sum(1 for c in chats if c.truncated),
        too_large,
        f"{false_alarms} of {len(alarms.reports)}",
        f"{highest:.3f}",
        f"{len(summary_ctx)} ({', '.join(map(str, sorted(summary_ctx)))})",
        f"{len(chat_ctx)} ({', '.join(map(str, sorted(chat_ctx)))})",
        refires,
        f"{reused / pairs:.1%} of {pairs}" if pairs else "-",
        f"{before_first_token:.2f} s",
        f"{after_end:.2f} s",
    ], [name, f"{summary_time / all_time:.1%} ({summary_time:.0f} of {all_time:.0f} s)", *kept]


# The share of model time spent on summaries, at a simulated model speed (an 8B model on one
# consumer GPU): each request's prompt tokens Ollama must evaluate — all but the prefix it shares
# with the request before, which Ollama keeps evaluated — then its answer.
PREFILL_TOKENS_PER_S = 1_500
GENERATE_TOKENS_PER_S = 50
CHAT_ANSWER_TOKENS = 60
SUMMARY_TOKENS = 400


def model_time(bodies: list[dict]) -> tuple[float, float]:
    """(the run's simulated model seconds, those spent on summaries), from the requests in order."""
    total = on_summaries = 0.0
    for body, evaluated in zip(bodies, _common.evaluated_tokens(bodies)):
        summary = body.get("stream") is False
        seconds = (
            evaluated / PREFILL_TOKENS_PER_S
            + (SUMMARY_TOKENS if summary else CHAT_ANSWER_TOKENS) / GENERATE_TOKENS_PER_S
        )
        total += seconds
        on_summaries += seconds if summary else 0.0
    return total, on_summaries


async def nothing_lost(store, session_id: str, turns: int, window: int, prose: bool = False) -> list[str]:
    """What the run must not have lost: every tool result compressed out of the context (with
    ``prose``, every long request and answer too) found by memory_search's store call with words
    from beyond its preview (its size at ``window``), every user message shown once, at most one
    live summary."""
    from palimpsest.shared.prose_weight import prune_sizes
    from palimpsest.shared.session_reads import whole_context

    preview = prune_sizes(window).preview_chars  # what pruning keeps of a result at this window

    shown, before = [], 0
    while True:
        page = await store.GetHistoryPage(
            store_pb.GetHistoryPageRequest(session_id=session_id, before_seq=before, limit=500)
        )
        shown = list(page.messages) + shown
        if not page.has_more:
            break
        before = page.messages[0].seq
    context = (await whole_context(store.GetSession, session_id)).context
    live = {m.content for m in context}
    roles = ("tool", "user", "assistant") if prose else ("tool",)
    gone = [m for m in shown if m.role in roles and len(m.content) > 2 * preview and m.content not in live]
    found = 0
    for result in gone:
        lines = [line for line in result.content[preview:].splitlines()[1:-1] if line.strip()]
        middle = len(result.content) // 2  # a condensed request or answer keeps its head and tail
        rest = result.content[-80:] if result.role == "tool" else result.content[middle : middle + 80]
        words = (lines[len(lines) // 2] if lines else rest)[:80].strip()
        chunks = (
            await store.SearchMemory(store_pb.SearchMemoryRequest(session_id=session_id, query=words, limit=10))
        ).chunks
        found += any(words in c.content for c in chunks)
    asked = [m.content for m in shown if m.role == "user" and m.content.startswith("turn ")]
    once = sum(1 for t in range(turns) if sum(1 for a in asked if a.startswith(f"turn {t}:")) == 1)
    return [f"{found} of {len(gone)}", f"{once} of {turns}", sum(1 for m in context if m.is_summary)]


SUMMARY_HEAD = "[Summary of the earlier conversation"


def prefix_reuse(prompts: list[list[dict]]) -> tuple[int, int]:
    """(calls that begin with the previous call's whole message list, calls that follow another
    with no compression between them): what Ollama can reuse of its evaluated prompt."""
    reused = pairs = 0
    for before, after in zip(prompts, prompts[1:]):
        compressed = [
            {
                str(m.get("content", ""))
                for m in p
                if str(m.get("content", "")).startswith(SUMMARY_HEAD) or PRUNED_NOTE in str(m.get("content", ""))
            }
            for p in (before, after)
        ]
        if compressed[0] != compressed[1]:
            continue  # a compression in between (a summary, pruned results) rewrites the prompt by design
        pairs += 1
        reused += after[: len(before)] == before
    return reused, pairs


async def long_run(server, quick: bool) -> str:
    runs = [await _long_path(server, quick, "exact"), await _long_path(server, quick, "calibrated")]
    rows, kept = [r for r, _ in runs], [k for _, k in runs]
    turns = rows[0][1]
    return (
        f"A {turns}-turn conversation in an {WINDOW}-token window through the real services and the "
        "simulator (tool calls every third turn: large JSON, log and code outputs, and every fourth of them "
        "a dense server log of 300–3,000 tokens; an image every tenth turn), run on a copy of `qwen3.6` "
        "whose vocabulary the simulator serves (exact counts) and on a copy without it (calibrated per-class prices). "
        "*Compressions*: those the window called for, before a call or after the stream (pruned tool results "
        "or a summary); *prunes at turn end*: a turn's results pruned as it ends or between a loop's calls, "
        "and old long words condensed (COMPRESSION_REASON_TURN_END, no LLM call), counted apart and never a "
        "re-fire; *LLM summaries*: the summary requests the model got. *False cut alarms*: "
        'the "cut prompt:" warnings (a report proving its prompt cut) raised on a report '
        "the simulator did not give for a prompt it cut, of all such warnings. *Highest real prompt ÷ "
        f"limit*: the simulator's full count of the largest chat prompt over the size check's limit "
        f"(window − output reserve = {WINDOW - 2048}). *num_ctx values*: distinct `options.num_ctx` among "
        "the summary requests (non-streamed) and the chat requests. *Re-fires*: compressions within 3 turns "
        "of the previous one. *Prefix reused*: of the chat calls that follow another with no compression "
        "between them, the share that begin with that call's whole message list (what Ollama keeps "
        "evaluated and need not evaluate again).\n\n"
        + _common.table(
            [
                "path",
                "turns",
                "compressions",
                "prunes at turn end",
                "LLM summaries",
                "prompts cut by Ollama",
                "ended CONTEXT_TOO_LARGE",
                "false cut alarms",
                "highest real prompt ÷ limit",
                "num_ctx: summaries",
                "num_ctx: chats",
                "re-fires within 3 turns",
                "prefix reused",
                "compressing before the first token",
                "compressing after stream_end",
            ],
            rows,
        )
        + "\n\nThe same runs, for what compression costs and keeps. *Model time on summaries*: at a simulated "
        f"model speed ({PREFILL_TOKENS_PER_S:,} prompt tokens/s, {GENERATE_TOKENS_PER_S} generated tokens/s; "
        f"{SUMMARY_TOKENS} tokens per summary, {CHAT_ANSWER_TOKENS} per chat answer), each request's prompt "
        "less the prefix it shares with the request before (Ollama keeps that evaluated). *Found by "
        "memory_search*: tool results no longer verbatim in the context (pruned or summarized) whose "
        "line from beyond the preview the store's memory search returns. *User messages shown once*: "
        "each turn's request in the display history exactly once.\n\n"
        + _common.table(
            [
                "path",
                "model time on summaries",
                "compressed-away results found by memory_search",
                "user messages shown once",
                "live summaries at the end",
            ],
            kept,
        )
    )


async def run(args) -> str:
    return "\n\n".join([await added_latency(args.server, args.quick), await long_run(args.server, args.quick)])

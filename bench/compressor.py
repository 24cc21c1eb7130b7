"""Compressor benchmarks: estimate error against the real tokenizer, estimate/plan latency as the
context grows, and Compress throughput with 1, 2 and 4 replicas (separate processes) while the model
takes a second a summary, with the replicas' own CPU time per compression."""

from __future__ import annotations

import asyncio
import io
import json
import random
import statistics
import time

import grpc
from PIL import Image

from bench import _common
from ollama_sim import OllamaSimulator, Reply, count_prompt_tokens
from ollama_sim.vocabulary import tokenizer_metadata
from palimpsest.compressor.calibration import Observation, fit_line, fit_rates, line_tokens, prompt_classes
from palimpsest.compressor.exact_count import ExactObservation, fit_template, message_texts, shape_of
from palimpsest.compressor.model_tokenizers import TokenCounter
from palimpsest.compressor.vocabulary import build_tokenizer
from palimpsest.shared.context_view import to_ollama_messages, view_chars
from palimpsest.shared.image_tokens import image_tokens
from palimpsest.shared.ports import free_port
from palimpsest.v1 import common_pb2, compressor_pb2_grpc
from palimpsest.v1 import compressor_pb2 as pb
from palimpsest.v1 import session_store_pb2 as store_pb
from palimpsest.v1.session_store_pb2_grpc import SessionStoreStub

Message = common_pb2.Message
NEEDS_POSTGRES = True

_PROSE = (
    "The migration plan moves the billing service onto the new cluster in three waves, "
    "keeping the old path warm until the error budget recovers. "
)
_NON_LATIN = (
    "Переносим сервис оплаты на новый кластер в три этапа. 我们将分三步迁移计费服务。"
    "請求はキューに入り、ワーカーが順番に処理します。 "
)
_CJK = (
    "计费服务迁移到新集群后，错误预算恢复前保留旧路径。"
    "設定ファイルを読み込み、各ワーカーにジョブを割り当てます。"
    "배포가 끝나면 모니터링 대시보드에서 지연 시간을 확인하세요。 "
)
_LEVELS = ("INFO", "WARN", "ERROR", "DEBUG")
_LOG_TEXT = (
    "billing.worker: order processed, invoice queued for delivery",
    "http.server: upstream connection reset by peer, retrying request",
    "scheduler: job finished successfully, releasing the lease",
    "auth.middleware: session token expired, redirecting to login",
)


def _dense_log(rng: random.Random, lines: int = 40) -> str:
    """Server logs: timestamps, IPs, hex ids, paths, durations (about 1.85 chars a token)."""
    out = []
    for _ in range(lines):
        out.append(
            f"2026-11-30T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}."
            f"{rng.randint(0, 999):03d}Z {rng.choice(_LEVELS)} {rng.randint(10, 250)}.{rng.randint(0, 255)}."
            f"{rng.randint(0, 255)}.{rng.randint(1, 254)} "
            f"req={rng.getrandbits(64):016x} trace={rng.getrandbits(32):08x} "
            f"{rng.choice(['GET', 'POST', 'PUT'])} /v2/orders/{rng.randint(1, 10**6)} "
            f"{rng.choice([200, 201, 404, 500, 503])} {rng.randint(1, 4000)}ms "
            f"{rng.choice(_LOG_TEXT)}"
        )
    return "\n".join(out)


def _code(rng: random.Random) -> str:
    return "\n".join(f"def step_{i}(ctx, retries={rng.randint(1, 9)}):\n    return ctx.run('{i}')" for i in range(8))


def _json(rng: random.Random) -> str:
    return json.dumps(
        {
            "rows": [
                {
                    "id": rng.randint(1, 10**6),
                    "status": rng.choice(["ok", "failed"]),
                    "path": f"/srv/app/{rng.randint(1, 99)}.py",
                }
                for _ in range(12)
            ]
        }
    )


def _png(side: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (side, side), (side % 255, 30, 60)).save(out, "PNG")
    return out.getvalue()


def conversation(rng: random.Random, size: int, images: bool) -> list[Message]:
    """A mixed agent context: prose, code, JSON tool output, dense server logs, non-Latin and CJK
    text, maybe images."""
    out = [Message(role="system", content="You are a careful assistant. " * 20)]
    while view_chars(out) < size:
        kind = rng.choice(["prose", "code", "json", "log", "non_latin", "cjk"])
        text = {"non_latin": _NON_LATIN, "cjk": _CJK}.get(kind, _PROSE)
        out.append(Message(role="user", content=text * rng.randint(1, 4)))
        if kind in ("code", "json", "log"):
            args = json.dumps({"path": f"/srv/{rng.randint(1, 50)}.py"})
            out.append(
                Message(role="assistant", tool_calls=[common_pb2.ToolCall(id="c", name="read", arguments_json=args)])
            )
            body = {"code": _code, "json": _json}.get(kind, lambda r: _dense_log(r, r.randint(10, 60)))(rng)
            out.append(Message(role="tool", name="read", content=body))
        out.append(Message(role="assistant", content=text * rng.randint(1, 3)))
    if images:
        out[1].images.append(_png(rng.choice([256, 512, 1024])))
    return out


def real_tokens(messages: list[Message]) -> int:
    return count_prompt_tokens(to_ollama_messages(messages))


_counter: TokenCounter | None = None


def exact_counter() -> TokenCounter:
    """The Compressor's exact counter, built from the vocabulary the simulator serves for qwen3.6."""
    global _counter
    if _counter is None:
        _counter = TokenCounter(build_tokenizer(tokenizer_metadata("qwen3.6")), "bench")
    return _counter


EXACT = "exact (tokenizer + fitted template + margin)"
CLASSES = "calibrated per character class (8 observations + margin)"


def _classes(messages: list[Message]) -> tuple[int, ...]:
    return prompt_classes([t for m in messages for t in message_texts(m)])


def _errors(train: list[list[Message]], tests: list[list[Message]], real=None) -> dict[str, list[float]]:
    """Signed errors in % of the real count (negative: the method counted LOW). ``real`` counts a
    prompt's true size (the simulator's Qwen3.6 count unless given)."""
    real = real or real_tokens
    counter = exact_counter()
    line = fit_line([Observation(view_chars(c), real(c)) for c in train])
    rates = fit_rates([(len(c), _classes(c), real(c)) for c in train])
    # The template learns from the same reports as the line; images are priced inside Template.tokens.
    template = fit_template([ExactObservation(shape_of(c, [], counter, 1024), real(c)) for c in train])
    methods = {
        CLASSES: lambda sample, chars, raw: rates.whole(len(sample), _classes(sample)),
        "calibrated line (8 observations)": lambda sample, chars, raw: line_tokens(chars, line, whole=True),
        "chars / 1.8": lambda sample, chars, raw: chars / 1.8,
        "chars / 3": lambda sample, chars, raw: chars / 3,
        "bytes / 4": lambda sample, chars, raw: raw / 4,
    }
    errors: dict[str, list[float]] = {name: [] for name in [EXACT, *methods]}
    for sample in tests:
        truth = real(sample)
        chars = view_chars(sample)
        raw = sum(len(m.content.encode()) + sum(len(c.arguments_json.encode()) for c in m.tool_calls) for m in sample)
        pictures = sum(image_tokens(i) for m in sample for i in m.images)
        errors[EXACT].append((template.tokens(shape_of(sample, [], counter, 1024)) - truth) / truth * 100)
        for name, method in methods.items():
            # Every method prices images the same way (by area), so the columns compare text pricing.
            errors[name].append((method(sample, chars, raw) + pictures - truth) / truth * 100)
    return errors


def foreign_tokens():
    """The true size under a vocabulary the Compressor has never seen: a 16k byte-level BPE
    trained on English prose and code only (CJK and Cyrillic cost it ~5× what they cost Qwen),
    with ChatML's per-message cost. Stands for a model whose vocabulary cannot be loaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(3)
    corpus = [_PROSE * 3, _code(rng), _json(rng)] * 200 + [
        " ".join(rng.choices(_PROSE.split(), k=30)) for _ in range(2000)
    ]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=16_000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
        ),
    )

    def real(messages: list[Message]) -> int:
        texts = [t for m in messages for t in message_texts(m) if t]
        return sum(len(e.ids) for e in tokenizer.encode_batch(texts)) + 5 * len(messages) + 3

    return real


def _growing(rng: random.Random) -> tuple[list[list[Message]], list[list[Message]]]:
    """One conversation's successive prompts: the line learns from 8 calls, then prices the next 5."""
    full = conversation(rng, 60_000, images=False)
    prefixes = [full[:n] for n in range(4, len(full) + 1, max(1, len(full) // 14))][:13]
    for prefix in prefixes[8:]:
        if rng.random() < 0.4:
            prefix[-1].images.append(_png(rng.choice([256, 512, 1024])))
    return prefixes[:8], prefixes[8:]


def _error_rows(names, *columns: dict[str, list[float]]) -> list[list[str]]:
    rows = []
    for name in names:
        cells = [name]
        for errors in columns:
            values = errors[name]
            size = [abs(v) for v in values]
            low = sum(1 for v in values if v < 0) / len(values) * 100
            cells += [
                f"{statistics.median(size):.2f}%",
                f"{_common.percentile(size, 95):.2f}%",
                f"{max(size):.2f}%",
                f"{low:.0f}%",
            ]
        rows.append(cells)
    return rows


async def estimate_error() -> str:
    rng = random.Random(7)
    across_train = [conversation(rng, rng.randint(2_000, 30_000), images=False) for _ in range(8)]
    across_tests = [conversation(rng, rng.randint(2_000, 30_000), images=i % 5 == 0) for i in range(40)]
    across = await asyncio.to_thread(_errors, across_train, across_tests)
    within: dict[str, list[float]] = {}
    growing = [_growing(rng) for _ in range(8)]
    for train, tests in growing:
        for name, values in (await asyncio.to_thread(_errors, train, tests)).items():
            within.setdefault(name, []).extend(values)
    foreign = await asyncio.to_thread(foreign_tokens)
    foreign_across = await asyncio.to_thread(_errors, across_train, across_tests, foreign)
    foreign_within: dict[str, list[float]] = {}
    for train, tests in growing:
        for name, values in (await asyncio.to_thread(_errors, train, tests, foreign)).items():
            foreign_within.setdefault(name, []).extend(values)
    header = [
        "method",
        "within: median",
        "within: p95",
        "within: worst",
        "within: low",
        "across: median",
        "across: p95",
        "across: worst",
        "across: low",
    ]
    calibrated = [CLASSES, "calibrated line (8 observations)", "chars / 1.8", "chars / 3"]
    return (
        "Token count error against the simulator's real tokenizer (Qwen3.6 vocabulary) on a mixed corpus: "
        "prose, code, JSON tool output, dense server logs (timestamps, IPs, hex ids; ~1.8 chars a token), "
        "Cyrillic and CJK text, images. *Within a conversation*: each method learns from a conversation's 8 "
        "previous prompts and prices its next 5 (8 conversations, 40 prompts; the Agent records every call, "
        "so this is how it is used). *Across conversations*: learned on 8 contexts, priced on 40 others "
        "(2k–30k chars, every 5th with an image). The exact row counts content with the model's own "
        "tokenizer and adds a chat-template cost fitted (`fit_template`) on the same 8 reports the line "
        "learns from, plus the worst under-count of those reports as a margin. The per-class row prices "
        "whitespace, digits, Latin, CJK, other letters and symbols apart, fitted on the same 8 reports, plus "
        "their worst under-count. Images are priced by area in every row. Error is |count − real| ÷ real; "
        "*low* is the share of counts under the real one (a low count is what lets Ollama cut a prompt). "
        "Targets: exact median ≤ 0.5% and worst ≤ 2%; calibrated median ≤ 3%.\n\n"
        + _common.table(header, _error_rows(across, within, across))
        + "\n\nThe calibrated methods against a vocabulary the Compressor has never seen (a 16k byte-level "
        "BPE trained on English prose and code only: a CJK character costs it ~3.4 tokens, ~0.6 for Qwen), "
        "on the same prompts:\n\n" + _common.table(header, _error_rows(calibrated, foreign_within, foreign_across))
    )


async def seeded_session(store: SessionStoreStub, messages: int, chatter: _common.Chatter) -> str:
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="bench", model="qwen3.6"))).session
    batch = []
    for i in range(messages // 2):
        user, assistant = chatter.turn(200, 500)
        batch += [Message(role="user", content=user), Message(role="assistant", content=assistant)]
        if len(batch) >= 200:
            await store.AppendMessages(store_pb.AppendMessagesRequest(session_id=session.id, messages=batch))
            batch = []
    if batch:
        await store.AppendMessages(store_pb.AppendMessagesRequest(session_id=session.id, messages=batch))
    return session.id


async def latency(store: SessionStoreStub, compressor: compressor_pb2_grpc.CompressorStub, quick: bool) -> str:
    chatter = _common.Chatter(11)
    rows = []
    for size in (200, 2000):
        session_id = await seeded_session(store, size, chatter)
        calls = {
            "EstimateTokens": lambda sid=session_id: compressor.EstimateTokens(
                pb.EstimateTokensRequest(session_id=sid, model="qwen3.6", window=32768)
            ),
            "WouldCompress": lambda sid=session_id: compressor.WouldCompress(
                pb.WouldCompressRequest(session_id=sid, model="qwen3.6", window=32768)
            ),
        }
        await calls["EstimateTokens"]()  # the session's counts are made and stored once, then summed
        for name, call in calls.items():
            # Each RPC in a run of its own: interleaved, a WouldCompress (which reads all 2,000
            # messages) leaves the next EstimateTokens ~2 ms slower on this machine's cold caches.
            timings = []
            for _ in range(10 if quick else 40):
                t = time.perf_counter()
                await call()
                timings.append(time.perf_counter() - t)
            rows.append(
                [f"{size:,}", name, _common.ms(_common.p50(timings)), _common.ms(_common.percentile(timings, 95))]
            )
    return (
        "EstimateTokens and WouldCompress through gRPC (store round trips included), 32,768-token window; "
        "each RPC timed in a run of its own calls on one stored session.\n\n"
        + _common.table(["context messages", "RPC", "p50", "p95"], rows)
    )


# What a summary takes the model in the throughput run: the case the Compressor's scaling is for.
SUMMARY_SECONDS = 1.0
REPLICAS = (1, 2, 4)
IN_FLIGHT = 16
_SUMMARY = Reply(text="- summary\nKEYS: a, b", first_chunk_delay=SUMMARY_SECONDS)
# (the table's name for it, the summarizer's reply, whether the Compress carries the Agent's prompt
# head: with it a summary by the session's own model takes the prefix form, as the Agent's do, when
# the conversation fits the window as the Agent's does: ~10,800 tokens here, so a 16,384 window).
PATHS = (
    ("summary, model takes 1 s", _SUMMARY, False),
    ("summary with the Agent's prompt head, 16,384 window", _SUMMARY, True),
    ("hard truncate (summarizer down)", Reply(http_status=500, error="down"), False),
)
HEAD_WINDOW = 16_384
AGENT_HEAD = [Message(role="system", content="You are a careful assistant. Answer briefly.")]


async def throughput(server, quick: bool) -> str:
    sessions = 16 if quick else 64
    measured: dict[tuple[str, int], tuple[float, float]] = {}
    with OllamaSimulator() as sim:
        for path, reply, head in PATHS:
            sim.set_responder(lambda body, reply=reply: reply)
            for replicas in REPLICAS:
                async with _common.fresh_database(server, "compress") as dsn:
                    store_port = free_port()
                    ports = [(free_port(), free_port()) for _ in range(replicas)]  # (gRPC, /metrics)
                    # The replica that answered the sessions' size checks: not one of those measured.
                    checker = (free_port(), free_port())
                    base = {
                        "DATABASE_URL": dsn,
                        "PALIMPSEST_STORE_ADDR": f"127.0.0.1:{store_port}",
                        "OLLAMA_HOST": sim.url,
                        "PALIMPSEST_FILES_ROOT": "/tmp/palimpsest-bench-files",
                    }
                    specs = [("palimpsest.store", base)] + [
                        (
                            "palimpsest.compressor",
                            {
                                **base,
                                "PALIMPSEST_COMPRESSOR_LISTEN": f"127.0.0.1:{grpc_port}",
                                "PALIMPSEST_METRICS_PORT": str(metrics_port),
                            },
                        )
                        for grpc_port, metrics_port in [*ports, checker]
                    ]
                    async with _common.processes(specs[:1]):
                        await _common.wait_ready(f"127.0.0.1:{store_port}")
                        async with _common.processes(specs[1:]):
                            for grpc_port, _ in [*ports, checker]:
                                await _common.wait_ready(f"127.0.0.1:{grpc_port}")
                            measured[path, replicas] = await _compress_all(
                                store_port, ports, sessions, checker[0], head
                            )
    header = ["replicas"] + [
        f"{path}: {column}" for path, _, _ in PATHS for column in ("compressions/s", "Compressor CPU per compression")
    ]
    rows = [
        [replicas]
        + [
            cell
            for path, _, _ in PATHS
            for cell in (f"{measured[path, replicas][0]:.1f}", f"{_common.ms(measured[path, replicas][1])} ms")
        ]
        for replicas in REPLICAS
    ]
    return (
        f"Compress throughput: {sessions} sessions of 120 messages compressed through a round-robin channel, "
        f"{IN_FLIGHT} in flight, by 1, 2 and 4 Compressor replicas; the store and each replica in a process of "
        "its own on this machine, every replica with the model's tokenizer loaded (one request) and every "
        "session size-checked by a replica not measured (each row counted and the counts stored, as before a "
        f"model call) before the clock started. The summarizer answers after {SUMMARY_SECONDS:.0f} s (the simulator's delay), or fails at once "
        "(every compression then hard-truncates, no model wait). Without a prompt head a summary takes the "
        "standalone input; with the Agent's (its system prompt), the prefix form, as every compression the "
        "Agent starts with the session's own model does. *CPU per compression*: the replicas' own CPU "
        "time (user + system, from their `process_cpu_seconds_total` on /metrics) over the run, per "
        "compression.\n\n" + _common.table(header, rows)
    )


async def size_checked(store: SessionStoreStub, checker: compressor_pb2_grpc.CompressorStub, session_id: str) -> int:
    """The size check the Agent runs before a model call, on another replica, and what it stores:
    each row's count (with the call's report; here SetTokenCounts) and, from the Compressor itself,
    the cut of a row over the message budget. Returns how many rows the store holds a count of."""
    context = (
        await store.GetSession(store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_CONTEXT))
    ).session.context
    check = await checker.CheckContextSize(
        pb.CheckContextSizeRequest(model="qwen3.6", messages=list(context), window=8192, session_id=session_id)
    )
    reply = await store.SetTokenCounts(
        store_pb.SetTokenCountsRequest(session_id=session_id, token_digest=check.token_digest, counts=check.new_counts)
    )
    return reply.updated


async def _compress_all(
    store_port: int, ports: list[tuple[int, int]], sessions: int, checker_port: int, head: bool = False
) -> tuple[float, float]:
    """(compressions a second, the replicas' CPU seconds per compression); ``head``: each Compress
    carries the Agent's prompt head, so its summary takes the prefix form."""
    from palimpsest.shared.channels import open_channel
    from palimpsest.shared.settings import Settings

    settings = Settings()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{store_port}") as store_channel:
        store = SessionStoreStub(store_channel)
        chatter = _common.Chatter(5)
        ids = [await seeded_session(store, 120, chatter) for _ in range(sessions)]
        # As in a real session, every row was counted by a size check (on a replica not measured):
        # a compression reads the counts from the store, as one on a replica that never saw it does.
        async with grpc.aio.insecure_channel(f"127.0.0.1:{checker_port}") as checker_channel:
            checker = compressor_pb2_grpc.CompressorStub(checker_channel)
            counted = [await size_checked(store, checker, i) for i in ids]
        assert min(counted) >= 120, counted
        channel = open_channel(",".join(f"127.0.0.1:{grpc_port}" for grpc_port, _ in ports), settings)
        stub = compressor_pb2_grpc.CompressorStub(channel)

        async def one(session_id: str) -> None:
            async for _ in stub.Compress(
                pb.CompressRequest(
                    session_id=session_id,
                    reason=pb.COMPRESSION_REASON_FORCED,
                    model="qwen3.6",
                    window=HEAD_WINDOW if head else 8192,
                    prompt_head=AGENT_HEAD if head else [],
                )
            ):
                pass

        # Steady state: each replica loads the model's tokenizer once (from its disk cache, ~0.5 s)
        # on its first request; that one-time cost is not throughput.
        for grpc_port, _ in ports:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as warm:
                await compressor_pb2_grpc.CompressorStub(warm).EstimateTokens(
                    pb.EstimateTokensRequest(model="qwen3.6", messages=[Message(role="user", content="warm up")])
                )
        cpu_before = await _cpu_seconds(ports)
        started = time.perf_counter()
        await _common.gather_limited([one(i) for i in ids], IN_FLIGHT)
        elapsed = time.perf_counter() - started
        cpu = await _cpu_seconds(ports) - cpu_before
        await channel.close()
    return sessions / elapsed, cpu / sessions


async def _cpu_seconds(ports: list[tuple[int, int]]) -> float:
    """The replicas' CPU time so far, as each one's /metrics reports it."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    async with httpx.AsyncClient() as client:
        for _, metrics_port in ports:
            text = (await client.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
            total += sum(
                sample.value
                for family in text_string_to_metric_families(text)
                for sample in family.samples
                if sample.name == "process_cpu_seconds_total"
            )
    return total


async def run(args) -> str:
    parts = [await estimate_error()]
    async with _common.fresh_database(args.server, "compressor") as dsn:
        async with _common.running_store(dsn) as (store_server, store):
            with OllamaSimulator() as sim:
                from dataclasses import replace

                from palimpsest.compressor.app import start_compressor
                from palimpsest.shared.settings import Settings

                settings = replace(Settings(), ollama_host=sim.url, store_addr=store_server.address)
                compressor = await start_compressor(settings, port=0)
                try:
                    async with grpc.aio.insecure_channel(compressor.address) as channel:
                        parts.append(await latency(store, compressor_pb2_grpc.CompressorStub(channel), args.quick))
                finally:
                    await compressor.stop(0)
    parts.append(await throughput(args.server, args.quick))
    return "\n\n".join(parts)

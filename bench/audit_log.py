"""What the audit log costs a turn: the append of a batch of tool results (three results of about
1 KB, as the Agent stores them after its tools ran) through the SessionStore's gRPC server, without
and with the batch's three ToolRun records riding on it (AppendMessagesRequest.tool_runs, written by
the append function in its one statement). As in a turn, the calls (arguments of about 250 chars)
were stored first, so a record names their message (call_seq) and the store copies their arguments,
redacted already; a sub-agent's records carry theirs, redacted on the way in (the third row). The
arms alternate, append by append, in sessions of their own on one store; then ListToolRuns' newest
page of a session with 1,000 runs.
"""

from __future__ import annotations

import json
import time

from bench._common import Chatter, fresh_database, ms, p50, percentile, running_store, table
from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as pb

NEEDS_POSTGRES = True
APPENDS, QUICK_APPENDS = 400, 40
BATCH = 3  # tool calls in one batch
LOGGED_RUNS = 1_000
READS = 100


def calls(chatter: Chatter, batch: int) -> list[common_pb2.ToolCall]:
    """One batch's calls, arguments as a model writes them (one with a secret to mask)."""
    return [
        common_pb2.ToolCall(
            id=f"call_{i}",
            name="write_file",
            arguments_json=json.dumps(
                {
                    "path": f"src/module_{i}.py",
                    "text": chatter.message("user", 150, 250),
                    **({"api_key": "sk-proj-0123456789abcdefghijklmn"} if i == 0 else {}),
                }
            ),
        )
        for i in range(batch)
    ]


def records(batch: list[common_pb2.ToolCall], call_seq: int = 0) -> list[pb.ToolRun]:
    """The batch's records as the Agent sends them: naming the stored call, or (0) with its arguments."""
    out = []
    for call in batch:
        run = pb.ToolRun(
            turn_id="0" * 32,
            call_id=call.id,
            tool=call.name,
            call_seq=call_seq,
            arguments_json="" if call_seq else call.arguments_json,
            duration_seconds=0.004,
            outcome=pb.TOOL_RUN_OUTCOME_OK,
            bytes_in=len(call.arguments_json),
            bytes_out=1000,
        )
        run.started_at.GetCurrentTime()
        out.append(run)
    return out


async def run(args) -> str:
    appends = QUICK_APPENDS if args.quick else APPENDS
    chatter = Chatter(seed=23)
    async with fresh_database(args.server, "audit_log") as dsn, running_store(dsn) as (_, store):
        arms = ("results only", "results + records", "results + records (a sub-agent's)")
        sessions = {
            label: (await store.CreateSession(pb.CreateSessionRequest(profile_id="bench"))).session.id for label in arms
        }
        seconds: dict[str, list[float]] = {label: [] for label in arms}
        for _ in range(appends):
            batch = calls(chatter, BATCH)
            results = [
                common_pb2.Message(
                    role="tool", name=call.name, tool_call_id=call.id, content=chatter.message("assistant", 800, 1200)
                )
                for call in batch
            ]
            for label, session_id in sessions.items():
                asked = await store.AppendMessages(
                    pb.AppendMessagesRequest(
                        session_id=session_id, messages=[common_pb2.Message(role="assistant", tool_calls=batch)]
                    )
                )
                runs = [] if label == "results only" else records(batch, 0 if "sub-agent" in label else asked.seqs[0])
                request = pb.AppendMessagesRequest(session_id=session_id, messages=results, tool_runs=runs)
                started = time.perf_counter()
                await store.AppendMessages(request)
                seconds[label].append(time.perf_counter() - started)
        rows = [[label, ms(p50(values)), ms(percentile(values, 95))] for label, values in seconds.items()]
        added = p50(seconds["results + records"]) - p50(seconds["results only"])
        rows.append(["difference (p50)", ms(added), ""])

        logged = (await store.CreateSession(pb.CreateSessionRequest(profile_id="bench"))).session.id
        for _ in range(LOGGED_RUNS // 100):
            await store.AppendMessages(
                pb.AppendMessagesRequest(session_id=logged, tool_runs=records(calls(chatter, 100)))
            )
        reads = []
        for _ in range(READS):
            started = time.perf_counter()
            await store.ListToolRuns(pb.ListToolRunsRequest(session_id=logged))
            reads.append(time.perf_counter() - started)
        rows.append([f"ListToolRuns, newest 50 of {LOGGED_RUNS:,}", ms(p50(reads)), ms(percentile(reads, 95))])
    return (
        f"### Audit log: the append of a batch of {BATCH} tool results, {appends} each way, alternating (ms)\n\n"
        + table(["append", "p50", "p95"], rows)
    )

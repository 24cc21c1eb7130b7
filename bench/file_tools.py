"""What the file tools cost inside a turn. The services run as processes of their own (as deployed)
against the Ollama simulator; a client streams turns whose model calls one tool, and each span is
measured as the client sees it, from `tool_started` to `tool_finished` (the tool's run, its result
stored, the events out). Arms alternate turn by turn, so drift on the machine falls on all alike:

- `todo list`, a built-in that does nothing: what any tool round trip adds to a turn;
- `read_file` of a 1 MB log (a page of it comes back: the rest is pointed at);
- `grep` over 10,000 files of varied text (code, logs, JSON, prose, CJK), one match in a few of them.

A file tool's first call in a turn syncs the Agent's mirror with the store (one ListFiles, a stat per
file, downloads of what changed): that is in every file-tool span. The first grep turn on an empty
mirror downloads all 10,000 files; it is reported on its own line.
"""

from __future__ import annotations

import random
import time

from bench import _common
from bench.agent import service_processes
from ollama_sim import Reply
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import session_store_pb2 as store_pb

NEEDS_POSTGRES = True
TURNS, QUICK_TURNS = 60, 8
FILES, QUICK_FILES = 10_000, 1_000
FILE_TOOLS = ["read_file", "write_file", "edit_file", "list_files", "grep"]
PROFILE = {
    "id": "files",
    "model": "qwen3.6",
    "context_window": 32768,
    "think_enabled": False,
    "memory_recall_enabled": False,
    "tools": {"agent": ["todo", *FILE_TOOLS]},
}
ARMS = {
    "todo": ("todo", {"action": "list"}),
    "read_file": ("read_file", {"path": "logs/big.log"}),
    "grep": ("grep", {"pattern": r"needle-\d+"}),
}


def text_file(rng: random.Random, i: int) -> bytes:
    """1–3 KB of one kind of text; every 1,000th file holds the needle grep looks for."""
    kind = i % 5
    lines = []
    for n in range(rng.randint(20, 60)):
        if kind == 0:
            lines.append(f"def handler_{i}_{n}(request):\n    return respond(request, status={200 + n % 5})")
        elif kind == 1:
            lines.append(f"2026-12-07T01:{n % 60:02d}:{i % 60:02d}Z worker-{i % 7} INFO served /api/{n} in {n * 3} ms")
        elif kind == 2:
            lines.append(f'{{"id": {i * 100 + n}, "name": "item-{n}", "tags": ["a", "b"], "price": {n * 1.5}}}')
        elif kind == 3:
            lines.append("The tide comes in twice a day, and the harbour empties and fills with it. " * 2)
        else:
            lines.append("会话记录：今天的任务已经完成，明天继续处理剩下的问题。" + "🙂" * (n % 3))
    if i % 1000 == 0:
        lines.insert(len(lines) // 2, f"here is needle-{i}")
    return "\n".join(lines).encode()


async def put(store, session_id: str, path: str, data: bytes) -> None:
    async def parts():
        yield store_pb.PutFileRequest(header=store_pb.PutFileHeader(session_id=session_id, path=path))
        yield store_pb.PutFileRequest(chunk=data)

    await store.PutFile(parts())


async def one_turn(agent, session_id: str) -> float:
    started = finished = 0.0
    async for event in agent.RunStream(pb.RunStreamRequest(session_id=session_id, text="go")):
        now = time.perf_counter()
        if event.HasField("tool_started"):
            started = now
        elif event.HasField("tool_finished"):
            if event.tool_finished.is_error:
                raise RuntimeError(f"{event.tool_finished.name} failed: {event.tool_finished.preview}")
            finished = now
    if not started or not finished:
        raise RuntimeError("the turn ran no tool")
    return finished - started


async def run(args) -> str:
    turns = QUICK_TURNS if args.quick else TURNS
    files = QUICK_FILES if args.quick else FILES
    rng = random.Random(7)
    async with service_processes(args.server, "file_tools", [PROFILE]) as (sim, store, agent):
        session_id = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="files"))).session.id
        big = "\n".join(
            f"2026-12-07T02:00:{n % 60:02d}Z worker-{n % 9} WARN queue depth {n} over 100" for n in range(20_000)
        ).encode()[: 1024 * 1024]
        await put(store, session_id, "logs/big.log", big)
        upload_started = time.perf_counter()
        await _common.gather_limited(
            [put(store, session_id, f"tree/{i // 100:03d}/f{i:05d}.txt", text_file(rng, i)) for i in range(files)], 8
        )
        upload_s = time.perf_counter() - upload_started

        arm = {"name": "grep"}

        def respond(body):
            if body["messages"][-1]["role"] == "user":
                name, arguments = ARMS[arm["name"]]
                return Reply(tool_calls=[(name, arguments)])
            return Reply(text="done")

        sim.set_responder(respond)
        first_grep = await one_turn(agent, session_id)  # the mirror starts empty: every file downloaded
        spans: dict[str, list[float]] = {name: [] for name in ARMS}
        for _ in range(turns):
            for name in ARMS:
                arm["name"] = name
                spans[name].append(await one_turn(agent, session_id))

    what = {
        "todo": "`todo list` (a tool that does nothing)",
        "read_file": "`read_file` of a 1 MB log",
        "grep": f"`grep` over {files:,} files",
    }
    rows = [
        [what[name], _common.ms(_common.p50(ts)), _common.ms(_common.percentile(ts, 95)), _common.ms(max(ts))]
        for name, ts in spans.items()
    ]
    rows.append([f"`grep`, first turn: the mirror downloads {files:,} files", _common.ms(first_grep), "", ""])
    return "\n".join(
        [
            f"tool_started → tool_finished as the client sees it (ms), {turns} turns of each arm, alternating; "
            f"services as processes; {files:,} files + a 1 MB log in one session "
            f"(uploaded in {upload_s:.1f} s, 8 PutFile streams at once).",
            "",
            _common.table(["tool", "p50", "p95", "max"], rows),
        ]
    )

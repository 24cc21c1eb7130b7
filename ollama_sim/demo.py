"""`make demo` (`python -m ollama_sim.demo`): a scripted long conversation through the real services
against the Ollama simulator, showing the context meter climb and compression fire. Needs no Ollama."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from dataclasses import replace

# Stopping the embedded database forks pg_ctl while gRPC's threads run; gRPC's fork handlers then
# print a `fork_posix.cc` line on the way out. Nothing here forks a process that uses gRPC.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import grpc  # noqa: E402
from rich.console import Console

from ollama_sim import OllamaSimulator, Reply  # noqa: E402
from palimpsest.run import command_as_typed  # noqa: E402
from palimpsest.shared.settings import Settings  # noqa: E402
from palimpsest.v1 import agent_pb2 as pb  # noqa: E402
from palimpsest.v1 import agent_pb2_grpc

TURNS = int(os.environ.get("DEMO_TURNS", "40"))
WINDOW = 4096
console = Console()


def scripted_model(body) -> Reply:
    if not body.get("stream", True):
        return Reply(text="- The user walked through a series of log reviews.\nKEYS: logs, reviews, demo")
    spoken = [m for m in body.get("messages") or [] if m.get("role") != "system"]
    if spoken and spoken[-1].get("role") == "user":
        return Reply(text="Here is a long, careful answer. " + "The log shows steady progress. " * 25)
    return Reply(text="Done.")


def what_it_shows(settings: Settings, window: int) -> str:
    """The numbers the meter is measured against, which in a window this small are not the README's."""
    reserve = min(settings.output_reserve_tokens, window // 4)
    limit = window - reserve
    trigger = min(settings.compression_threshold * window, limit)
    capped = trigger < settings.compression_threshold * window
    return (
        f"The meter is the whole prompt (system prompt and tool schemas included) against the {window}-token window.\n"
        f"{reserve} tokens stay free for the answer (PALIMPSEST_OUTPUT_RESERVE_TOKENS, at most a quarter of the window), "
        f"so a prompt may use {limit} ({limit / window:.0%}); compression starts at {trigger:.0f} tokens "
        f"({trigger / window:.0%})"
        + (
            f", not at PALIMPSEST_COMPRESSION_THRESHOLD={settings.compression_threshold:.2f}: the trigger is never above "
            "that limit"
            if capped
            else ""
        )
        + ". It runs after an answer when that answer's prompt reached it (or came back cut), and before a "
        f"call when the prompt would pass it. It summarizes all but the last {settings.compression_keep_recent} turns (PALIMPSEST_COMPRESSION_KEEP_RECENT); "
        "the meter drops by what the summary saved, and climbs again as turns are added. Between compressions "
        "it dips too: after each turn, answers older than the newest are condensed to their head and tail (no "
        "model call; memory_search finds the rest). A window this small leaves a dozen turns or so between "
        "compressions; a 32k window leaves many dozens.\n"
    )


def meter(tokens: int, window: int, width: int = 40) -> str:
    filled = min(width, int(width * tokens / window))
    colour = "green" if tokens < 0.7 * window else "yellow" if tokens < 0.9 * window else "red"
    return f"[{colour}]{'█' * filled}{'░' * (width - filled)}[/] {tokens:>5}/{window}"


async def main() -> None:
    from palimpsest.agent.app import start_agent
    from palimpsest.compressor.app import start_compressor
    from palimpsest.store.app import start_store

    with OllamaSimulator() as sim, tempfile.TemporaryDirectory() as tmp:
        sim.set_responder(scripted_model)
        profiles = os.path.join(tmp, "profiles.json")
        with open(profiles, "w") as f:
            json.dump({"profiles": [{"id": "demo", "model": "qwen3.6", "context_window": WINDOW}]}, f)
        settings = replace(Settings.from_env(), ollama_host=sim.url, profiles_path=profiles)
        console.print(
            f"[bold]Palimpsest demo[/]: {TURNS} turns in a {WINDOW}-token window, Ollama simulated at {sim.url}"
        )
        console.print(what_it_shows(settings, WINDOW), style="dim", highlight=False, soft_wrap=True)
        embedded = None
        dsn = settings.database_url
        if not dsn:  # a database of our own that we also stop: the demo leaves nothing running
            from palimpsest.shared.embedded_pg import EmbeddedPostgres

            embedded = EmbeddedPostgres(settings.data_dir)
            was_running = embedded.running_port() is not None
            dsn = await asyncio.to_thread(embedded.start)
            if was_running:
                embedded = None  # `make run` owns it
        store = await start_store(settings, port=0, dsn=dsn)
        settings = replace(settings, store_addr=store.address)
        compressor = await start_compressor(settings, port=0)
        settings = replace(settings, compressor_addr=compressor.address)
        agent = await start_agent(settings, port=0)
        try:
            async with grpc.aio.insecure_channel(agent.address) as channel:
                stub = agent_pb2_grpc.AgentStub(channel)
                session_id = ""
                last_compressed = 0
                for turn in range(1, TURNS + 1):
                    request = pb.RunStreamRequest(session_id=session_id, text=f"Turn {turn}: review today's logs")
                    async for event in stub.RunStream(request):
                        session_id = event.session_id
                        kind = event.WhichOneof("event")
                        if kind == "usage":
                            console.print(f"turn {turn:>3}  {meter(event.usage.context_tokens, WINDOW)}")
                        elif kind == "compression_started":
                            console.print("          [magenta]compressing…[/]")
                        elif kind == "context_compressed":
                            c = event.context_compressed
                            since = f", {turn - last_compressed} turns after the last one" if last_compressed else ""
                            last_compressed = turn
                            console.print(
                                f"          [magenta]Context compressed: {c.messages_before} → "
                                f"{c.messages_after} messages, the history now {c.context_tokens} tokens "
                                f"(plus the system prompt and tools){since}[/]"
                            )
                    await asyncio.sleep(0.05)  # let the post-turn check run, as a user pause would
                pal = command_as_typed("pal") or "pal"
                console.print(
                    f"\nsession {session_id}: the full history is still there, in the database "
                    "`make run` uses. With `make run` up:\n"
                    f"  {pal} sessions show {session_id}        every message, the compressed ones too\n"
                    f"  {pal} context {session_id}              what the model sees now: the summary and "
                    "the newest turns\n"
                    f'  {pal} continue --id {session_id} "…"    goes on with it, on make run\'s default '
                    "profile (the demo's own exists only here)",
                    highlight=False,
                    soft_wrap=True,
                )
        finally:
            await agent.stop(1)
            await compressor.stop(1)
            await store.stop(1)
            if embedded is not None:
                await asyncio.to_thread(embedded.stop)


if __name__ == "__main__":
    asyncio.run(main())

"""What a tool says about its result is kept with it: its metadata, an error flag, whether the
summarizer must keep it verbatim (a tool marks its own result critical), and how long it ran."""

from __future__ import annotations

import json
from dataclasses import replace

import grpc
import pytest

from ollama_sim import Reply
from palimpsest.agent.tools.base import ToolContext, ToolResult
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import agent_pb2_grpc
from palimpsest.v1 import session_store_pb2 as store_pb

MODEL = "qwen3.6"


class LedgerTool:
    """Answers with a balance the summarizer must keep verbatim, or fails when asked to."""

    name = "ledger"
    description = "Read the account's ledger balance."
    parameters = {"type": "object", "properties": {"account": {"type": "string"}}, "required": ["account"]}

    async def run(self, args: dict, ctx: ToolContext) -> ToolResult:
        if args["account"] == "closed":
            return ToolResult(content="account closed", is_error=True, untrusted=False)
        return ToolResult(
            content=f"balance of {args['account']}: 1,204.17 EUR",
            critical=True,
            untrusted=False,
            metadata={"currency": "EUR", "rows": 3},
        )


@pytest.fixture(scope="module")
async def ledger_agent(base_settings, store_server, compressor_server, ollama_sim, tmp_path_factory):
    from palimpsest.agent.app import start_agent

    path = tmp_path_factory.mktemp("ledger") / "profiles.json"
    path.write_text(
        json.dumps(
            {
                "profiles": [
                    {
                        "id": "ledger",
                        "model": MODEL,
                        "context_window": 8192,
                        "max_iterations": 4,
                        "custom_tools": ["tests.agent.test_tool_bookkeeping:LedgerTool"],
                        "agent_tools": ["ledger"],
                    }
                ]
            }
        )
    )
    running = await start_agent(
        replace(
            base_settings,
            ollama_host=ollama_sim.url,
            store_addr=store_server.address,
            compressor_addr=compressor_server.address,
            profiles_path=str(path),
        ),
        port=0,
    )
    async with grpc.aio.insecure_channel(running.address) as channel:
        yield agent_pb2_grpc.AgentStub(channel)
    await running.stop(0)


async def test_a_tools_metadata_error_and_critical_mark_are_stored_with_its_result(ledger_agent, store, ollama_sim):
    ollama_sim.script(
        Reply(tool_calls=[("ledger", {"account": "main"}), ("ledger", {"account": "closed"})]),
        Reply(text="Your balance is 1,204.17 EUR."),
    )
    events = [
        e async for e in ledger_agent.RunStream(pb.RunStreamRequest(text="what is my balance?", profile_id="ledger"))
    ]
    assert events[-1].stream_end.reason == pb.STREAM_END_REASON_COMPLETED
    session = (
        await store.GetSession(
            store_pb.GetSessionRequest(session_id=events[0].session_id, view=store_pb.SESSION_VIEW_FULL)
        )
    ).session
    ok, failed = [m for m in session.messages if m.role == "tool"]
    assert ok.is_compression_critical and dict(ok.metadata) == {"currency": "EUR", "rows": 3}
    assert not failed.is_compression_critical and failed.metadata["is_error"] is True
    assert ok.elapsed_seconds > 0 and failed.elapsed_seconds > 0

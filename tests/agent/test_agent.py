"""The Agent end to end: real gRPC servers, the store on PostgreSQL, the Ollama simulator over HTTP."""

from __future__ import annotations

import asyncio
import io
import socket
import threading
import uuid

import grpc
import pytest
from PIL import Image

from ollama_sim import Reply
from ollama_sim.prompt import count_text_tokens
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import agent_pb2_grpc, common_pb2
from palimpsest.v1 import session_store_pb2 as store_pb
from tests.conftest import agent_settings
from tests.helpers.calls import (
    END,
    end_of,
    expect_status,
    full,
    kinds,
    run,
    session_due_for_a_post_turn_compression,
    text_of,
)
from tests.helpers.waiting import until

# Each test starts from the simulator's deterministic echo.
pytestmark = pytest.mark.usefixtures("fresh_sim")


async def test_a_turn_streams_text_usage_and_ends_completed(agent, store, ollama_sim):
    ollama_sim.script(Reply(text="The answer is forty-two.", thinking="Let me think."))
    events = await run(agent, "what is the answer?")
    assert kinds(events)[0] == "model_info"
    assert "thinking_delta" in kinds(events) and "thinking_end" in kinds(events)
    assert kinds(events).index("thinking_end") < kinds(events).index("text_delta")
    assert text_of(events) == "The answer is forty-two."
    usage = [e.usage for e in events if e.HasField("usage")]
    assert len(usage) == 1 and usage[0].max_context_tokens == 8192 and usage[0].context_tokens > 0
    end = end_of(events)
    assert end.reason == END.STREAM_END_REASON_COMPLETED and end.text == "The answer is forty-two."
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    session = await full(store, events[0].session_id)
    assert [(m.role, m.content) for m in session.messages] == [
        ("user", "what is the answer?"),
        ("assistant", "The answer is forty-two."),
    ]
    assert session.messages[1].thinking == "Let me think."
    assert session.name == "what is the answer?" and session.context_token_count == usage[0].context_tokens
    body = ollama_sim.bodies()[-1]
    assert body["options"]["num_ctx"] == 8192 and body["think"] is True and body["tools"]


async def test_tool_calls_run_and_their_results_reach_the_model(agent, store, ollama_sim):
    ollama_sim.script(
        Reply(tool_calls=[("todo", {"action": "set", "items": [{"text": "write tests"}, {"text": "ship"}]})]),
        Reply(text="Todo is ready."),
    )
    events = await run(agent, "plan my day")
    assert kinds(events).count("usage") == 2
    started = [e.tool_started for e in events if e.HasField("tool_started")]
    finished = [e.tool_finished for e in events if e.HasField("tool_finished")]
    assert [s.name for s in started] == ["todo"] and not finished[0].is_error
    todo = [e.todo_updated for e in events if e.HasField("todo_updated")]
    assert [i.text for i in todo[-1].items] == ["write tests", "ship"]
    assert end_of(events).text == "Todo is ready."
    second = [m for m in ollama_sim.bodies()[-1]["messages"] if m["role"] != "system"]
    assert second[-1]["role"] == "tool" and second[-1].get("tool_name") == "todo"
    session = await full(store, events[0].session_id)
    assert [m.role for m in session.messages] == ["user", "assistant", "tool", "assistant"]
    # The bookkeeping each message carries: a tool result its metadata and run time, an answer the
    # seconds of its call and the tokens the model generated for it.
    _, call, result, answer = session.messages
    assert result.metadata["todo"][1]["text"] == "ship" and result.elapsed_seconds > 0
    assert call.elapsed_seconds > 0 and answer.elapsed_seconds > 0
    assert answer.token_count == count_text_tokens("Todo is ready.") > 0
    assert call.token_count > 0


async def test_a_second_turn_continues_the_session(agent, store, ollama_sim):
    first = await run(agent, "remember the number 7")
    session_id = first[0].session_id
    await run(agent, "what number?", session_id=session_id)
    sent = ollama_sim.bodies()[-1]["messages"]
    assert any("remember the number 7" in m["content"] for m in sent)
    assert (await full(store, session_id)).display_message_count == 4


async def test_stop_during_a_silent_prefill(agent, agent_server, store, ollama_sim):
    ollama_sim.script(Reply(text="too late", first_chunk_delay=30))
    before = len(ollama_sim.chats)
    stream = agent.RunStream(pb.RunStreamRequest(text="slow one"))
    first = await stream.read()
    session_id = first.session_id
    # The model is in its silent prefill once the simulator holds the request (the wait runs in a
    # thread: the Agent under test shares this event loop).
    assert await asyncio.to_thread(ollama_sim.wait_until, lambda: len(ollama_sim.chats) > before, 10)
    assert (await agent.Stop(pb.StopRequest(session_id=session_id))).stopped
    rest = []
    while (event := await stream.read()) is not grpc.aio.EOF:
        rest.append(event)
    assert end_of(rest).reason == END.STREAM_END_REASON_STOPPED
    assert ollama_sim.wait_until(lambda: ollama_sim.disconnects >= 1, timeout=5)
    assert [m.role for m in (await full(store, session_id)).messages] == ["user"]
    assert not (await agent.Stop(pb.StopRequest(session_id=session_id))).stopped


async def test_cancelling_before_the_first_token_leaves_no_empty_answer(agent, store, ollama_sim):
    ollama_sim.script(Reply(text="never seen", first_chunk_delay=30), Reply(text="the real answer"))
    before = len(ollama_sim.chats)
    # (A turn outlives its client unless asked otherwise: tests/agent/test_resume_stream.py.)
    call = agent.RunStream(pb.RunStreamRequest(text="slow one", stop_on_disconnect=True))
    session_id = (await call.read()).session_id
    assert await asyncio.to_thread(ollama_sim.wait_until, lambda: len(ollama_sim.chats) > before, 10)
    call.cancel()  # the client leaves during the silent prefill
    # The next turn waits for the session's lock, so it sees whatever the cancelled turn left.
    await run(agent, "try again", session_id=session_id)
    assert [(m.role, m.content) for m in (await full(store, session_id)).messages] == [
        ("user", "slow one"),
        ("user", "try again"),
        ("assistant", "the real answer"),
    ]


@pytest.fixture(scope="module")
async def impatient_agent(base_settings, store_server, compressor_server, ollama_sim, profiles_file):
    from palimpsest.agent.app import start_agent

    # The first chunk waits longer than the next: a prefill slowed by a loaded machine must not
    # pass for the stall after it that the between-chunk test makes.
    running = await start_agent(
        agent_settings(
            base_settings,
            store_server,
            compressor_server,
            ollama_sim,
            profiles_file,
            stream_first_chunk_timeout=2.0,
            stream_chunk_timeout=0.6,
        ),
        port=0,
    )
    async with grpc.aio.insecure_channel(running.address) as channel:
        yield agent_pb2_grpc.AgentStub(channel)
    await running.stop(0)


async def test_first_chunk_timeout_ends_the_turn_with_an_error(impatient_agent, ollama_sim):
    ollama_sim.script(Reply(text="late", first_chunk_delay=5))
    events = await run(impatient_agent, "prefill forever")
    errors = [e.error for e in events if e.HasField("error")]
    assert errors and errors[0].code == "DEADLINE_EXCEEDED" and "first token" in errors[0].message
    assert end_of(events).reason == END.STREAM_END_REASON_ERROR
    assert ollama_sim.wait_until(lambda: ollama_sim.disconnects >= 1, timeout=5)


async def test_between_chunk_timeout_saves_what_arrived(impatient_agent, store, ollama_sim):
    ollama_sim.script(Reply(text="alpha beta gamma delta", chunk_delay=3))
    events = await run(impatient_agent, "stall mid-answer")
    assert "next token" in [e.error for e in events if e.HasField("error")][0].message
    messages = (await full(store, events[0].session_id)).messages
    assert messages[-1].metadata["partial"] is True and messages[-1].content.startswith("alpha")


async def test_a_mid_stream_error_line_becomes_an_error_event(agent, store, ollama_sim):
    ollama_sim.script(Reply(text="partial answer that breaks", error_after_chunks=2, error="GPU fell over"))
    events = await run(agent, "break please")
    error = [e.error for e in events if e.HasField("error")][0]
    assert "GPU fell over" in error.message and error.code == "UNAVAILABLE"
    assert end_of(events).reason == END.STREAM_END_REASON_ERROR
    session = await full(store, events[0].session_id)
    assert [m.role for m in session.messages] == ["user", "assistant"]  # consistent and loadable


async def test_an_unknown_model_names_ollama_pull(agent):
    details = await expect_status(run(agent, "hi", profile_id="missing"), grpc.StatusCode.NOT_FOUND)
    assert "no-such-model" in details and "ollama pull no-such-model" in details


async def test_ollama_down_is_unavailable_with_the_address(
    base_settings, store_server, compressor_server, ollama_sim, profiles_file
):
    from palimpsest.agent.app import start_agent

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    settings = agent_settings(base_settings, store_server, compressor_server, ollama_sim, profiles_file)
    from dataclasses import replace

    running = await start_agent(replace(settings, ollama_host=dead), port=0)
    try:
        async with grpc.aio.insecure_channel(running.address) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            details = await expect_status(run(stub, "hi"), grpc.StatusCode.UNAVAILABLE)
            assert dead in details and "ollama serve" in details and "ollama pull qwen3.6" in details
            from grpc_health.v1 import health_pb2, health_pb2_grpc

            health = health_pb2_grpc.HealthStub(channel)
            assert (
                await health.Check(health_pb2.HealthCheckRequest())
            ).status == health_pb2.HealthCheckResponse.SERVING

            async def ollama_not_serving() -> bool:
                ollama = await health.Check(health_pb2.HealthCheckRequest(service="ollama"))
                return ollama.status == health_pb2.HealthCheckResponse.NOT_SERVING

            assert await until(ollama_not_serving)
    finally:
        await running.stop(0)


async def test_bad_turn_input_is_invalid(agent):
    await expect_status(run(agent, "   "), grpc.StatusCode.INVALID_ARGUMENT, "text")
    await expect_status(run(agent, "x", session_id="not-a-uuid"), grpc.StatusCode.INVALID_ARGUMENT, "session_id")
    await expect_status(run(agent, "x", profile_id="nobody"), grpc.StatusCode.NOT_FOUND, "nobody")


async def test_context_too_large_is_answered_not_raised(agent, store):
    events = await run(agent, "word " * 40_000)
    end = end_of(events)
    assert end.reason == END.STREAM_END_REASON_CONTEXT_TOO_LARGE and "context window" in end.text
    messages = (await full(store, events[0].session_id)).messages
    assert messages[-1].role == "assistant" and messages[-1].content == end.text


async def test_two_turns_on_one_session_never_interleave(agent, store, ollama_sim):
    first = await run(agent, "start")
    session_id = first[0].session_id
    ollama_sim.script(Reply(text="first answer", chunk_delay=0.05), Reply(text="second answer"))
    a, b = await asyncio.gather(run(agent, "one", session_id=session_id), run(agent, "two", session_id=session_id))
    assert {end_of(a).reason, end_of(b).reason} == {END.STREAM_END_REASON_COMPLETED}
    roles = [(m.role, m.content) for m in (await full(store, session_id)).messages][2:]
    assert roles[0][0] == "user" and roles[1][0] == "assistant" and roles[2][0] == "user" and roles[3][0] == "assistant"
    assert {roles[0][1], roles[2][1]} == {"one", "two"}


async def test_unary_run_returns_the_final_text(agent, ollama_sim):
    ollama_sim.script(Reply(text="done and dusted"))
    reply = await agent.Run(pb.RunRequest(text="finish"))
    assert reply.text == "done and dusted" and reply.session_id and reply.reason == END.STREAM_END_REASON_COMPLETED


async def test_run_ephemeral_persists_nothing(agent, store, ollama_sim):
    marker = f"ephemeral-{uuid.uuid4().hex}"
    ollama_sim.script(Reply(text="sub result"))
    reply = await agent.RunEphemeral(pb.RunEphemeralRequest(text=f"do a small thing {marker}", profile_id="tiny"))
    assert reply.text == "sub result" and reply.completed_normally
    ollama_sim.script(*[Reply(tool_calls=[("todo", {"action": "list"})]) for _ in range(3)])
    limited = await agent.RunEphemeral(
        pb.RunEphemeralRequest(text=f"loop {marker}", profile_id="tiny", max_iterations=2)
    )
    assert not limited.completed_normally
    assert (await store.ListSessions(store_pb.ListSessionsRequest(query=marker))).total == 0


async def test_a_sub_agent_past_its_timeout_stops_by_its_event_and_returns_what_it_has(agent, ollama_sim, caplog):
    caplog.set_level("WARNING", logger="palimpsest.agent.subagent")
    ollama_sim.script(Reply(text="partial " * 400, chunk_delay=0.05))  # about 20 s of streaming
    reply = await agent.RunEphemeral(
        pb.RunEphemeralRequest(text="write at length", profile_id="tiny", timeout_seconds=1)
    )
    assert not reply.completed_normally
    assert reply.text.startswith("partial") and reply.text.count("partial") < 400  # cut where it stopped
    assert "sub-agent timed out" in caplog.text
    assert "sub-agent cancelled" not in caplog.text  # the cooperative stop ended it, no task.cancel()


async def test_compact_with_nothing_to_compact_is_a_failed_precondition(agent):
    events = await run(agent, "short")
    await expect_status(
        _collect(agent.Compact(pb.CompactRequest(session_id=events[0].session_id))),
        grpc.StatusCode.FAILED_PRECONDITION,
        "nothing to compact",
    )


async def _collect(call):
    return [e async for e in call]


async def test_list_profiles(agent):
    reply = await agent.ListProfiles(pb.ListProfilesRequest())
    assert reply.default_profile_id == "small"
    assert {p.id for p in reply.profiles} == {"small", "tiny", "missing", "liar", "looper"}
    small = next(p for p in reply.profiles if p.id == "small")
    assert small.context_window == 8192 and "plan" in small.agent_tools


def png(w, h) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (w, h), (10, 20, 30)).save(out, "PNG")
    return out.getvalue()


async def test_pasted_images_are_stored_and_those_past_the_budget_named(agent, store, ollama_sim):
    small, big = png(64, 64), png(2048, 2048)
    events = await run(agent, "look at these", images=[small, big, big])
    session_id = events[0].session_id
    files = (await store.ListFiles(store_pb.ListFilesRequest(session_id=session_id))).files
    assert [f.name for f in files] == ["image_1.png", "image_2.png"]  # the same bytes are stored once
    sent = ollama_sim.bodies()[-1]["messages"]
    user = [m for m in sent if m["role"] == "user"][-1]
    assert len(user["images"]) == 2  # 256 + 4096 fit 0.8 × 8192 − context; a second 4096 does not
    assert "image_view" in user["content"] and "image_2.png" in user["content"]
    session = await full(store, session_id)
    assert session.messages[0].content == "look at these"  # the user's copy has no notice


async def test_trim_keeps_the_messages_the_user_sees_and_no_stale_note(agent, store, ollama_sim):
    todo = ("todo", {"action": "set", "items": [{"text": "a"}]})
    ollama_sim.script(Reply(text="Hi."), Reply(tool_calls=[todo]), Reply(tool_calls=[todo]), Reply(text="Done."))
    session_id = (await run(agent, "hello"))[0].session_id
    await run(agent, "plan it", session_id=session_id)
    stored = await full(store, session_id)
    # Task notes ("[Iteration 2 of 40 …]") are stored, hidden, before the second and third calls.
    assert any(m.content.startswith("[Iteration") for m in stored.context)
    assert [m.role for m in stored.messages] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]

    trimmed = await store.TrimSession(store_pb.TrimSessionRequest(session_id=session_id, keep=5))
    assert (trimmed.before, trimmed.after, trimmed.dropped) == (8, 5, 3)
    kept = await full(store, session_id)
    assert list(kept.messages) == list(stored.messages[3:]) and kept.display_message_count == 5
    # The kept part begins with what the user sees, not a note of a turn long gone; and the Agent's
    # warm copy of the session (appends pass while no message was added) is not what it sends next.
    assert kept.context[0].role == "assistant" and not kept.context[0].content.startswith("[Iteration")

    ollama_sim.script(Reply(text="Still here."))
    await run(agent, "and now?", session_id=session_id)
    sent = [m for m in ollama_sim.bodies()[-1]["messages"] if m["role"] != "system"]
    assert sent[0]["role"] == "assistant" and not any(m["content"].startswith("[Iteration 2") for m in sent)

    # Keeping 4 would start at a tool result whose call is cut: it goes, and the count says 3.
    again = await store.TrimSession(store_pb.TrimSessionRequest(session_id=session_id, keep=4))
    assert again.after == len((await full(store, session_id)).messages) == 3


async def test_only_allowlisted_system_records_reach_the_model(agent, store, ollama_sim):
    """000's allowlist (_LLM_SYSTEM_SOURCES): of the stored system messages, task notes and the
    Synapse event record reach the model; any other record (a marker, a client's note, an unknown
    source) shows in the transcript and never reaches it."""
    from palimpsest.shared.context_view import LLM_SYSTEM_SOURCES

    assert LLM_SYSTEM_SOURCES == {"task_note", "synapse_event"}

    def record(text: str, source: str = "", **flags) -> common_pb2.Message:
        message = common_pb2.Message(
            role="system", content=text, explicit_flags=True, is_context=True, is_display=True, **flags
        )
        if source:
            message.metadata["source"] = source
        return message

    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="small"))).session
    await store.AppendMessages(
        store_pb.AppendMessagesRequest(
            session_id=session.id,
            messages=[
                common_pb2.Message(role="user", content="earlier question"),
                common_pb2.Message(role="assistant", content="earlier answer"),
                record("EVENT: a deploy finished on the CI platform", "synapse_event"),
                record("NOTE: keep going", "task_note"),
                record("AUDIT: an operator looked at this session", "operator_audit"),
                record("PLAIN: a record with no source"),
                record("MARKER: Context compressed: 9 -> 3 messages", is_compression=True),
            ],
        )
    )
    ollama_sim.script(Reply(text="ok"))
    await run(agent, "what happened?", session_id=session.id)
    sent = " ".join(m["content"] for m in ollama_sim.bodies()[-1]["messages"])
    assert "EVENT: a deploy finished" in sent and "NOTE: keep going" in sent
    assert not any(text in sent for text in ("AUDIT:", "PLAIN:", "MARKER:"))
    shown = [m.content for m in (await full(store, session.id)).messages]
    assert any(c.startswith("AUDIT:") for c in shown)  # in the transcript all the same


async def test_hidden_turns_store_no_files_and_show_nothing(agent, store):
    events = await run(agent, '{"form": "submitted"}', hidden=True)
    session_id = events[0].session_id
    assert not (await store.ListFiles(store_pb.ListFilesRequest(session_id=session_id))).files
    session = await full(store, session_id)
    assert [m.role for m in session.messages] == ["assistant"]


async def test_tool_output_marks_the_session_untrusted(agent, store, ollama_sim):
    ollama_sim.script(Reply(tool_calls=[("session_search", {"action": "list"})]), Reply(text="ok"))
    events = await run(agent, "what did we talk about?")
    assert (await full(store, events[0].session_id)).untrusted_ingested


async def test_an_edited_profiles_file_applies_from_the_next_turn(agent, agent_server, profiles_file, ollama_sim):
    import json
    import os
    from pathlib import Path

    path = Path(profiles_file)
    original = path.read_text()
    data = json.loads(original)
    data["profiles"][0]["system_prompt"] = "Always answer in haiku."
    try:
        path.write_text(json.dumps(data))
        os.utime(path, (1, 1))  # a different mtime however fast the edit
        await run(agent, "hello again")
        system = ollama_sim.bodies()[-1]["messages"][0]["content"]
        assert "Always answer in haiku." in system
    finally:
        path.write_text(original)
        os.utime(path, (2, 2))


async def test_an_edit_naming_a_missing_prompt_file_leaves_turns_working(agent, profiles_file, ollama_sim, caplog):
    """Once the prompt file was read on every size check: a missing one failed every turn as INTERNAL.
    Now the edit is refused, naming the file, and turns go on under the profiles in use."""
    import json
    import os
    from pathlib import Path

    path = Path(profiles_file)
    original = path.read_text()
    data = json.loads(original)
    missing = str(path.parent / "no-such-summary-prompt.txt")
    data["profiles"][0]["compression_prompt_file"] = missing
    try:
        path.write_text(json.dumps(data))
        os.utime(path, (3, 3))
        events = await run(agent, "still there?")
        assert end_of(events).reason == pb.STREAM_END_REASON_COMPLETED
        assert not [e for e in events if e.HasField("error")]
        assert missing in caplog.text and "keeping the profiles last read" in caplog.text
    finally:
        path.write_text(original)
        os.utime(path, (4, 4))


async def test_a_cut_prompt_on_the_estimate_path_is_never_learned_from(
    agent, agent_server, compressor, store, ollama_sim, profile
):
    """A model without a vocabulary, whose calibration line lies: Ollama cuts a prompt the estimate
    said would fit. The half-window report is neither the baseline nor the meter's count, and no
    alarm is raised on an estimate (only an exact count proves a cut)."""
    from ollama_sim import ModelSpec, count_text_tokens
    from palimpsest.v1 import common_pb2
    from palimpsest.v1 import compressor_pb2 as cpb
    from tests.conftest import LIAR_MODEL

    ollama_sim.models[LIAR_MODEL] = ModelSpec(context_length=65536, capabilities=("completion", "tools"))
    # A calibration line of one token per four chars, while this text really costs far more.
    for chars, tokens in ((4000, 1000), (8000, 2000)):
        await compressor.RecordBaseline(
            cpb.RecordBaselineRequest(model=LIAR_MODEL, prompt_eval_count=tokens, sent_tokens=tokens, sent_chars=chars)
        )
    dense = " ".join(f"{i:x}{i * 7919 % 65521:x}" for i in range(2400))[:20_000]  # hex: dense in tokens
    assert count_text_tokens(dense) > len(dense) * 0.4
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="liar", model=LIAR_MODEL))).session
    history = []
    for i in range(5):  # ~100k chars: about 25k tokens by that line (it fits 32k), far more for real
        history += [
            common_pb2.Message(role="user", content=f"part {i}: {dense}"),
            common_pb2.Message(role="assistant", content=f"noted {i}"),
        ]
    await store.AppendMessages(store_pb.AppendMessagesRequest(session_id=session.id, messages=history))
    ollama_sim.script(Reply(text="fine"))
    events = await run(agent, "and one more", session_id=session.id)
    assert end_of(events).reason == END.STREAM_END_REASON_COMPLETED
    assert ollama_sim.chats[-1].truncated  # the simulator cut it, as Ollama would
    usage = [e.usage for e in events if e.HasField("usage")][0]
    assert usage.prompt_tokens == 32768 // 2 + 2 and usage.context_tokens > usage.prompt_tokens
    assert usage.count_method == "calibrated"
    baseline = await store.GetBaseline(store_pb.GetBaselineRequest(session_id=session.id))
    assert not baseline.HasField("baseline") or baseline.baseline.tokens != usage.prompt_tokens
    assert not baseline.HasField("baseline") or not baseline.baseline.context_truncated


async def test_sub_agent_events_are_forwarded_and_its_state_never_leaks(agent, agent_server, ollama_sim):

    ollama_sim.script(
        Reply(tool_calls=[("spawn_agent", {"task": "count the files", "profile_id": "tiny"})]),
        Reply(text="sub answer: 3 files"),
        Reply(text="parent done"),
    )
    events = await run(agent, "delegate this")
    sub = [e for e in events if e.is_subagent]
    assert sub and "sub answer: 3 files" in "".join(e.text_delta.text for e in sub if e.HasField("text_delta"))
    assert not any(e.HasField("stream_end") for e in sub)  # only the parent's turn ends the stream
    assert end_of(events).text == "parent done"
    tool = [e.tool_finished for e in events if e.HasField("tool_finished") and not e.is_subagent][0]
    assert tool.name == "spawn_agent" and "3 files" in tool.preview


async def test_a_turn_awaited_in_its_callers_task_gives_the_callers_session_back(agent_server, ollama_sim):
    """003's ContextVar rule: a turn sets the current session and resets it when it ends, so what
    runs next in the caller's task (and any task it starts) never sees the turn's id. Awaited
    directly, not through run_subagent's task, whose copied context would hide a missing reset."""
    from palimpsest.agent.conversation import EphemeralConversation
    from palimpsest.agent.events import EventSink
    from palimpsest.agent.turn import Turn, current_session
    from palimpsest.agent.turn_context import SubagentOptions, TurnContext, TurnInput

    deps = agent_server.servicer.deps
    profile = deps.profiles.get("tiny")
    turn = Turn(
        TurnContext(
            deps,
            EphemeralConversation([]),
            profile,
            EventSink(is_subagent=True),
            (),
            await deps.ollama.model_facts(profile.model),
            subagent=SubagentOptions(parent_session_id="the-parent", system_prompt="be brief"),
        )
    )
    seen_inside: list[str] = []
    original = turn._run

    async def watching(turn_input):
        seen_inside.append(current_session.get())
        return await original(turn_input)

    turn._run = watching  # type: ignore[method-assign]
    token = current_session.set("parent-session")
    try:
        ollama_sim.script(Reply(text="done"))
        result = await turn.run(TurnInput(text="tiny job"))
        assert result.completed_normally and seen_inside == ["subagent-of-the-parent"]
        assert current_session.get() == "parent-session"
        assert await asyncio.create_task(asyncio.sleep(0, current_session.get())) == "parent-session"
    finally:
        current_session.reset(token)


async def test_budget_goal_and_anti_stall_notes_reach_the_model(agent, ollama_sim):
    ollama_sim.script(*[Reply(tool_calls=[("todo", {"action": "list"})]) for _ in range(5)], Reply(text="gave up"))
    events = await run(agent, "find the needle", profile_id="looper")
    assert end_of(events).text == "gave up"
    bodies = [body["messages"] for body in ollama_sim.bodies()[-6:]]
    for before, after in zip(bodies, bodies[1:]):
        assert after[: len(before)] == before  # notes stay where they were given: the prompt only grows
    notes = [
        [m["content"] for m in body[len(bodies[i - 1]) if i else 1 :] if m["role"] == "system"]
        for i, body in enumerate(bodies)
    ]  # the notes each call got
    # The budget from the second call on: the first ends with the user's words.
    assert [any("Iteration" in n for n in call) for call in notes] == [False] + [True] * 5
    assert bodies[0][-1] == {"role": "user", "content": "find the needle"}
    assert [any("Goal reminder" in n and "find the needle" in n for n in call) for call in notes] == [
        False,
        False,
        True,
        False,
        True,
        False,
    ]  # every 2nd iteration after the first
    stalled = [any("without progress" in n for n in call) for call in notes]
    assert stalled == [False, False, False, True, True, True]  # after 3 iterations with no todo progress


async def test_compressed_history_is_recalled_once_when_it_matches(agent, store, ollama_sim):
    from palimpsest.v1 import common_pb2

    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="small"))).session
    await store.AppendMessages(
        store_pb.AppendMessagesRequest(
            session_id=session.id,
            messages=[
                common_pb2.Message(
                    role="user",
                    content="[Summary] We set up the vault.",
                    is_summary=True,
                    explicit_flags=True,
                    is_context=True,
                    is_display=False,
                )
            ],
        )
    )
    await store.IndexChunks(
        store_pb.IndexChunksRequest(
            session_id=session.id,
            chunks=[common_pb2.RawChunk(content="user: the vault code is 7741-alpha, keep it safe")],
        )
    )
    await run(agent, "what was the vault code?", session_id=session.id)
    first = " ".join(m["content"] for m in ollama_sim.bodies()[-1]["messages"])
    assert "Recalled from earlier" in first and "7741-alpha" in first
    await run(agent, "what was the vault code again?", session_id=session.id)
    second = " ".join(m["content"] for m in ollama_sim.bodies()[-1]["messages"])
    # The first turn's excerpt stays where it was given; remembered as injected, it is not recalled twice.
    assert second.count("7741-alpha") == 1


async def test_recalled_excerpts_keep_to_their_share_of_the_window_and_centre_on_the_match(agent, store, ollama_sim):
    """Two 2,000-character excerpts of dense logs per turn took a quarter of an 8,192 window right
    after a compression and brought the next one within a turn or two: what is recalled between
    two compressions keeps to a sixteenth of the window, around the words that matched."""
    from palimpsest.agent.context_builder import recall_chars
    from palimpsest.v1 import common_pb2

    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="small"))).session
    await store.AppendMessages(
        store_pb.AppendMessagesRequest(
            session_id=session.id,
            messages=[
                common_pb2.Message(
                    role="user",
                    content="[Summary] We read the deploy logs.",
                    is_summary=True,
                    explicit_flags=True,
                    is_context=True,
                    is_display=False,
                )
            ],
        )
    )
    noise = "\n".join(f"2026-11-30T10:{i % 60:02d}:00 INFO worker[{i}] deploy step {i} ok" for i in range(80))
    await store.IndexChunks(
        store_pb.IndexChunksRequest(
            session_id=session.id,
            chunks=[
                common_pb2.RawChunk(
                    content=f"tool: {noise}\nERROR deploy {n} failed: quorumlost-{n} on node-{n}\n{noise}"
                )
                for n in range(8)
            ],
        )
    )
    for n in range(4):
        await run(agent, f"why did deploy {n} fail with quorumlost-{n}?", session_id=session.id)
    context = (
        await store.GetSession(store_pb.GetSessionRequest(session_id=session.id, view=store_pb.SESSION_VIEW_CONTEXT))
    ).session.context
    recalled = [m.content for m in context if m.is_recall]
    assert recalled and len(noise) * 2 > 4000  # long chunks, cut to their excerpts
    assert sum(len(r) for r in recalled) <= recall_chars(8192)
    assert "quorumlost-0" in recalled[0]  # the excerpt is where the match is, not the chunk's opening lines


async def test_a_session_changed_between_turns_by_someone_else_still_takes_the_next_turn(
    agent, agent_server, store, ollama_sim
):
    """The Agent keeps a session's state for its next turn; a write from elsewhere in between makes the
    store refuse the stale revision, and the turn reloads instead of failing."""
    events = await run(agent, "first")
    session_id = events[0].session_id
    # The turn's post-turn pass ends by keeping the session's state: once it is done, the write
    # below comes after the kept copy, which is then stale.
    await asyncio.gather(*agent_server.servicer.deps.post_turn_tasks)
    await store.UpdateSession(store_pb.UpdateSessionRequest(session_id=session_id, name="renamed elsewhere"))
    from palimpsest.v1 import common_pb2

    await store.AppendMessages(
        store_pb.AppendMessagesRequest(
            session_id=session_id, messages=[common_pb2.Message(role="user", content="written by another replica")]
        )
    )
    ollama_sim.set_responder(lambda body: Reply(text="second answer"))
    calls_before = len(ollama_sim.bodies())
    try:
        second = await run(agent, "second", session_id=session_id)
    finally:
        ollama_sim.set_responder(None)
    assert end_of(second).reason == END.STREAM_END_REASON_COMPLETED
    sent = [m["content"] for m in ollama_sim.bodies()[-1]["messages"]]
    assert "written by another replica" in sent  # the reload saw the other writer's message
    # The call started while the message was being stored, from the stale copy, was dropped
    # before anything reached the client, and made again from what is stored. That dropped call
    # is the proof the turn started from the kept copy: one loaded from the store is not stale.
    dropped = ollama_sim.bodies()[calls_before:-1]
    assert len(dropped) == 1
    assert "written by another replica" not in [m["content"] for m in dropped[0]["messages"]]
    assert "".join(e.text_delta.text for e in second if e.HasField("text_delta")) == "second answer"
    session = await full(store, session_id)
    assert session.name == "renamed elsewhere"
    assert [m.content for m in session.messages][-2:] == ["second", "second answer"]


async def answer_while(agent, store, ollama_sim, session_id: str, meanwhile) -> list[pb.AgentEvent]:
    """A turn whose model call is held until ``meanwhile()`` (another writer) has run."""
    asked, release = threading.Event(), threading.Event()

    def responder(body):
        asked.set()
        release.wait(30)  # the simulator's handler thread holds the answer until the other write is in
        return Reply(text="the held answer")

    async def question_stored() -> bool:
        return "a question" in [m.content for m in (await full(store, session_id)).messages]

    ollama_sim.set_responder(responder)
    try:
        turn = asyncio.ensure_future(run(agent, "a question", session_id=session_id))
        assert await asyncio.to_thread(asked.wait, 30)
        # The question is stored while the model starts: the other write comes after it, so it
        # meets the turn's answer (before, the turn would reload and ask the model again).
        assert await until(question_stored)
        await meanwhile()
        release.set()
        return await turn
    finally:
        release.set()
        ollama_sim.set_responder(None)


async def test_a_rename_or_a_taint_while_a_turn_runs_does_not_cost_its_answer(agent, agent_server, store, ollama_sim):
    """The answer's write is guarded by the revision the turn holds; a change that adds no message
    (a rename, an upload's taint) moves the revision, and the answer is stored all the same."""
    session_id = (await run(agent, "first"))[0].session_id
    await asyncio.gather(*agent_server.servicer.deps.post_turn_tasks)

    async def rename():
        await store.UpdateSession(store_pb.UpdateSessionRequest(session_id=session_id, name="renamed meanwhile"))

    events = await answer_while(agent, store, ollama_sim, session_id, rename)
    assert end_of(events).reason == END.STREAM_END_REASON_COMPLETED
    await asyncio.gather(*agent_server.servicer.deps.post_turn_tasks)

    async def upload():
        async def parts():
            yield store_pb.PutFileRequest(header=store_pb.PutFileHeader(session_id=session_id, filename="notes.txt"))
            yield store_pb.PutFileRequest(chunk=b"pasted from the web")

        await store.PutFile(parts())

    events = await answer_while(agent, store, ollama_sim, session_id, upload)
    assert end_of(events).reason == END.STREAM_END_REASON_COMPLETED
    session = await full(store, session_id)
    assert session.name == "renamed meanwhile" and session.untrusted_ingested
    assert [m.content for m in session.messages].count("the held answer") == 2
    # The copy kept for the next turn took the changes in (its sub-agents see the taint), and the
    # next turn starts from it without a stale start (no call dropped and made again).
    await asyncio.gather(*agent_server.servicer.deps.post_turn_tasks)
    runtime = agent_server.servicer.sessions
    warm = runtime.take_warm(session_id, ())
    assert warm is not None and warm.untrusted_ingested and warm.name == "renamed meanwhile"
    runtime.keep_warm(session_id, (), warm)
    calls_before = len(ollama_sim.bodies())
    assert end_of(await run(agent, "third", session_id=session_id)).reason == END.STREAM_END_REASON_COMPLETED
    assert len(ollama_sim.bodies()) == calls_before + 1


async def test_another_writers_message_while_a_turn_runs_still_refuses_its_answer(
    agent, agent_server, store, ollama_sim
):
    """What the revision guard is for: two writers' messages never interleave. The answer is not
    stored and the client is told where its text is."""
    from palimpsest.v1 import common_pb2

    session_id = (await run(agent, "first"))[0].session_id
    await asyncio.gather(*agent_server.servicer.deps.post_turn_tasks)

    async def interleave():
        await store.AppendMessages(
            store_pb.AppendMessagesRequest(
                session_id=session_id, messages=[common_pb2.Message(role="user", content="from another writer")]
            )
        )

    events = await answer_while(agent, store, ollama_sim, session_id, interleave)
    assert end_of(events).reason == END.STREAM_END_REASON_ERROR and end_of(events).text == "the held answer"
    assert "not stored" in next(e.error.message for e in events if e.HasField("error"))
    assert "the held answer" not in [m.content for m in (await full(store, session_id)).messages]


async def test_switch_profile_takes_effect_at_the_next_call(agent, store, ollama_sim):
    ollama_sim.script(Reply(tool_calls=[("switch_profile", {"profile_id": "tiny"})]), Reply(text="now tiny"))
    events = await run(agent, "switch to the small model please")
    assert end_of(events).text == "now tiny"
    first, second = ollama_sim.bodies()[-2:]
    assert first["model"] == "qwen3.6" and second["model"] == "tiny"
    assert "think" not in second  # tiny cannot think: the reloaded profile's facts apply
    infos = [e.model_info.model for e in events if e.HasField("model_info")]
    assert infos[-1] == "tiny"
    assert (await full(store, events[0].session_id)).profile_id == "tiny"


async def test_a_new_turn_drops_an_unfinished_post_turn_pass(agent, agent_server, store, ollama_sim):
    """A summary can take the model a while; the user's next message does not wait for it. The pass is
    dropped whole (its commit is one transaction): no marker, no demotion, the session consistent."""
    session = await session_due_for_a_post_turn_compression(store)
    slow_summary = Reply(text="- summary\nKEYS: a", first_chunk_delay=30)
    ollama_sim.set_responder(lambda body: slow_summary if body.get("stream") is False else Reply(text="ok"))
    await run(agent, "first", session_id=session.id)
    # The post-turn pass is now waiting on the summarizer.
    assert await until(lambda: any(b.get("stream") is False for b in ollama_sim.bodies())), (
        "the post-turn pass never asked for a summary"
    )
    ollama_sim.set_responder(
        lambda body: Reply(text="- summary\nKEYS: a") if body.get("stream") is False else Reply(text="ok")
    )
    second = await run(agent, "second", session_id=session.id)
    assert end_of(second).reason == END.STREAM_END_REASON_COMPLETED
    assert await until(
        lambda: ollama_sim.disconnects >= 1
    )  # the summary call was closed (the simulator notices the hang-up)
    after = await full(store, session.id)
    shown = [m.content for m in after.messages if not m.is_compression]
    assert shown[-4:] == ["first", "ok", "second", "ok"]
    before_second = after.messages[: [m.content for m in after.messages].index("second")]
    assert not any(m.is_compression for m in before_second)  # the dropped pass left nothing behind


async def test_a_session_whose_profile_is_gone_runs_on_the_default(agent, store, ollama_sim):
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="removed-long-ago"))).session
    events = await run(agent, "hello again", session_id=session.id)
    assert end_of(events).reason == END.STREAM_END_REASON_COMPLETED and end_of(events).text
    with pytest.raises(grpc.aio.AioRpcError) as error:  # a profile asked for by name must exist
        await run(agent, "switch", session_id=session.id, profile_id="no-such-profile")
    assert error.value.code() == grpc.StatusCode.NOT_FOUND and "no-such-profile" in error.value.details()


async def test_a_new_session_with_an_unknown_profile_is_refused_before_it_exists(agent):
    # The store cannot know the Agent's profiles; the Agent refuses before it creates the session.
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await run(agent, "hello", profile_id="never-configured")
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
    assert error.value.details().startswith("profile_id:") and "never-configured" in error.value.details()


async def test_a_watcher_sees_the_turn_and_the_compression_after_its_stream_end(agent, store, ollama_sim):
    """WatchSession: a second client (a meter, grpcurl) sees each turn start, every event of it,
    the title change, and the post-turn compression that no turn's own stream carries."""
    session = await session_due_for_a_post_turn_compression(store)
    watch = agent.WatchSession(pb.WatchSessionRequest(session_id=session.id))
    await watch.initial_metadata()  # in place: nothing from here on is missed
    ollama_sim.set_responder(
        lambda body: Reply(text="- summary\nKEYS: a") if body.get("stream") is False else Reply(text="watched answer")
    )
    try:
        events = await run(agent, "name me please", session_id=session.id)
        seen = []
        while not any(e.HasField("context_compressed") for e in seen):
            seen.append(await asyncio.wait_for(watch.read(), timeout=30))
    finally:
        ollama_sim.set_responder(None)
        watch.cancel()
    kinds = [e.WhichOneof("event") for e in seen]
    assert kinds[0] == "turn_started" and seen[0].turn_started.text == "name me please"
    assert "session_renamed" in kinds and seen[kinds.index("session_renamed")].session_renamed.name == "name me please"
    # The turn's own events, in its order, then the compression its stream never carried.
    own = [e for e in seen if e.WhichOneof("event") not in ("turn_started", "session_renamed")]
    assert [e.seq for e in own[: len(events)]] == [e.seq for e in events]
    end = kinds.index("stream_end")
    assert kinds[end + 1 :] == ["compression_started", "context_compressed"]
    assert not any(e.HasField("context_compressed") for e in events)


async def test_a_plain_turn_makes_two_internal_calls_and_none_after_the_answer(
    agent, agent_server, ollama_sim, store, monkeypatch
):
    """A plain turn in a warm session: the size check, and the append stream that stores the user's
    message while it runs, both before the model is asked; the answer with the call's report
    (baseline, observation, counts, meter) goes on that stream after the last token, without a call
    of its own. Nothing after stream_end: no post-turn pass under the trigger, no reload to keep the
    session warm (12 internal calls before, 5 of them between the last token and stream_end)."""
    from palimpsest.compressor.rpcs import base as compressor_base
    from palimpsest.shared import server as shared_server

    # The model's observations are read again once 5 s old: a loaded machine must not make that this turn's.
    monkeypatch.setattr(compressor_base, "OBSERVATIONS_TTL_S", 3600.0)
    calls: list[str] = []  # "Service.Method" as each server received it
    intercept = shared_server.ErrorInterceptor.intercept_service

    async def recording(self, continuation, details):
        service, method = details.method.lstrip("/").split("/")
        calls.append(f"{service.rsplit('.', 1)[-1]}.{method}")
        return await intercept(self, continuation, details)

    first = await run(agent, "hello there")
    session_id = first[0].session_id
    await asyncio.gather(*agent_server.servicer.deps.post_turn_tasks)  # warm now
    monkeypatch.setattr(shared_server.ErrorInterceptor, "intercept_service", recording)
    calls_when_asked: list[int] = []

    def answer(body) -> Reply:
        calls_when_asked.append(len(calls))
        return Reply(text="a plain answer")

    ollama_sim.set_responder(answer)
    try:
        events = await run(agent, "and again", session_id=session_id)
    finally:
        ollama_sim.set_responder(None)
    await asyncio.gather(*agent_server.servicer.deps.post_turn_tasks)
    assert end_of(events).reason == pb.STREAM_END_REASON_COMPLETED
    internal = [name for name in calls if not name.startswith("Agent.")]
    assert sorted(internal) == ["Compressor.CheckContextSize", "SessionStore.AppendStream"], internal
    assert calls_when_asked == [len(calls)]  # no call made after the model was asked
    stored = (
        await store.GetSession(store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_FULL))
    ).session
    assert [m.content for m in stored.messages[-2:]] == ["and again", "a plain answer"]
    usage = next(e.usage for e in events if e.HasField("usage"))
    assert usage.count_method == "reported"  # the report was kept, with the answer

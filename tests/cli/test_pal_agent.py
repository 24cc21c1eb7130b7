"""`pal run`, `pal continue`, `pal chat`, `pal profiles` and `pal health` against the real Agent and the
Ollama simulator, typed as a user would: subprocesses, piped stdin, and SIGINT for Ctrl-C."""

from __future__ import annotations

import asyncio
import io
import json
import signal
import uuid
from dataclasses import replace

import grpc
import pytest
from PIL import Image

from ollama_sim import Reply
from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as pb
from tests.helpers.pal_cli import (  # noqa: F401 — importing registers the fixtures
    CLOSED,
    COMPLETED,
    agent_server_fixture,
    chat_messages,
    new_session,
    open_terminal,
    pal,
    pal_env,
    pal_profiles_fixture,
    read_until,
    start_pal,
)
from tests.helpers.relay import Relay

Message = common_pb2.Message


@pytest.fixture
def env(agent_server, store_server, compressor_server) -> dict[str, str]:
    return pal_env(store=store_server.address, agent=agent_server.address, compressor=compressor_server.address)


@pytest.fixture(autouse=True)
def echoing_simulator(ollama_sim):
    """Every test starts from the simulator's deterministic echo, whatever the previous one scripted."""
    ollama_sim.set_responder(None)
    ollama_sim.clear()
    yield
    ollama_sim.set_responder(None)


async def display(store, session_id: str) -> list[Message]:
    got = await store.GetSession(pb.GetSessionRequest(session_id=session_id, view=pb.SESSION_VIEW_DISPLAY))
    return list(got.session.messages)


def sessions_of(events: list[dict]) -> list[str]:
    """Session ids in the order the events first named them."""
    seen: list[str] = []
    for event in events:
        if event.get("session_id") and event["session_id"] not in seen:
            seen.append(event["session_id"])
    return seen


def png(width: int = 32, height: int = 24) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


# -- run and continue -------------------------------------------------------------------------------
async def test_run_streams_the_answer_into_a_new_session(env, store, pal_profiles):
    ran = await pal("run", "What is the capital of Peru?", env=env)
    assert ran.code == 0, ran.stderr
    assert "Simulated answer to: What is the capital of Peru?" in ran.stdout
    assert "Reading the request" in ran.stdout  # thinking is shown (dimmed on a terminal)
    assert "context" in ran.stdout and "/ 8,192 tokens" in ran.stdout  # the meter from `usage`
    session_id = ran.stdout.split("session ")[-1].split()[0]
    messages = await display(store, session_id)
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[0].content == "What is the capital of Peru?"
    summary = (await store.GetSession(pb.GetSessionRequest(session_id=session_id))).session
    assert summary.profile_id == pal_profiles[0]


async def test_run_json_prints_one_parseable_event_per_line(env):
    ran = await pal("run", "--json", "Say hello", env=env)
    assert ran.code == 0, ran.stderr
    events = ran.json_lines()
    kinds = [next(k for k in e if k not in ("session_id", "seq", "is_subagent", "turn_id", "extra")) for e in events]
    assert {"model_info", "text_delta", "usage"} <= set(kinds)
    assert kinds[-1] == "stream_end" and events[-1]["stream_end"]["reason"] == COMPLETED
    assert events[-1]["stream_end"]["text"] == "Simulated answer to: Say hello"
    assert len(sessions_of(events)) == 1
    assert [int(e["seq"]) for e in events] == sorted(int(e["seq"]) for e in events)


async def test_run_reads_the_task_from_stdin_and_sends_images(env, store, tmp_path):
    picture = tmp_path / "chart.png"
    picture.write_bytes(png())
    ran = await pal("run", "--json", "--image", str(picture), "-", env=env, stdin="Describe this chart\n")
    assert ran.code == 0, ran.stderr
    (session_id,) = sessions_of(ran.json_lines())
    first = (await display(store, session_id))[0]
    assert first.content.strip() == "Describe this chart" and len(first.files) == 1
    files = await store.ListFiles(pb.ListFilesRequest(session_id=session_id))
    assert [f.name for f in files.files] == ["image_1.png"]


async def test_continue_goes_to_the_most_recent_session_of_a_profile(env, store, pal_profiles):
    first = sessions_of((await pal("run", "--json", "first task", env=env)).json_lines())[0]
    latest = sessions_of((await pal("run", "--json", "second task", env=env)).json_lines())[0]
    ran = await pal("continue", "--profile", pal_profiles[0], "--json", "and then?", env=env)
    assert ran.code == 0, ran.stderr
    assert sessions_of(ran.json_lines()) == [latest]
    assert [m.content for m in await display(store, latest)][-2] == "and then?"

    by_id = await pal("continue", "--id", first, "back to the first", env=env)
    assert by_id.code == 0 and "Simulated answer to: back to the first" in by_id.stdout
    assert len(await display(store, first)) == 4


async def test_run_and_continue_carry_refs_and_a_malformed_one_is_a_usage_error(env, store, ollama_sim):
    ran = await pal(
        "run",
        "--json",
        "--ref",
        "ci-run=https://ci.example.test/runs/4821",
        "--ref",
        "kind=dashboard,uri=https://grafana.example.test/d/a,b,created_by=ops,read_only=true",
        "Summarize the failing tests",
        env=env,
    )
    assert ran.code == 0, ran.stderr
    (session_id,) = sessions_of(ran.json_lines())
    more = await pal("continue", "--id", session_id, "--external-ref", "ticket=https://t.test/PAL-7", "and?", env=env)
    assert more.code == 0, more.stderr
    session = (await store.GetSession(pb.GetSessionRequest(session_id=session_id))).session
    assert [(r.kind, r.uri, r.created_by, r.read_only) for r in session.external_refs] == [
        ("ci-run", "https://ci.example.test/runs/4821", "cli", False),
        ("dashboard", "https://grafana.example.test/d/a,b", "ops", True),
        ("ticket", "https://t.test/PAL-7", "cli", False),
    ]
    shown = await pal("sessions", "show", session_id, env=env)
    assert "dashboard: https://grafana.example.test/d/a,b (read-only)" in shown.stdout

    ollama_sim.clear()
    bad = await pal("run", "--ref", "CI=https://x.test/", "never sent", env=env)
    assert bad.code == 2 and "--ref" in bad.stderr and "lower-case" in bad.stderr and "Traceback" not in bad.stderr
    assert not ollama_sim.bodies()


async def test_continue_an_unknown_session_is_one_line(env):
    unknown = str(uuid.uuid4())
    (await pal("continue", "--id", unknown, "hello", env=env)).assert_one_line_error(unknown)


# -- profiles and health ---------------------------------------------------------------------------
async def test_profiles_lists_what_the_agent_is_configured_with(env, pal_profiles):
    main, other, _ = pal_profiles
    ran = await pal("profiles", env=env)
    assert ran.code == 0, ran.stderr
    rows = {
        line.split()[1] if line.startswith("*") else line.split()[0]: line
        for line in ran.stdout.splitlines()[1:]
        if line.strip()
    }
    assert rows[main].startswith("*") and "qwen3.6" in rows[main]
    assert "tiny" in rows[other]
    data = (await pal("profiles", "--json", env=env)).json()
    assert data["default_profile_id"] == main
    assert {p["id"] for p in data["profiles"]} == {main, other}


async def test_health_is_green_when_everything_runs(env):
    ran = await pal("health", "--json", env=env)
    assert ran.code == 0, ran.stdout
    status = {row["service"]: row["status"] for row in ran.json()["services"]}
    assert status == {
        "SessionStore": "SERVING",
        "Compressor": "SERVING",
        "Agent": "SERVING",
        "Ollama": "SERVING",
        "Sandbox": "SERVING",
    }


async def test_ollama_missing_is_reported_by_health_and_by_a_turn(
    base_settings, store_server, compressor_server, pal_profiles
):
    from palimpsest.agent.app import start_agent

    settings = replace(
        base_settings,
        ollama_host=f"http://{CLOSED}",
        store_addr=store_server.address,
        compressor_addr=compressor_server.address,
        profiles_path=str(pal_profiles[2]),
    )
    agent = await start_agent(settings, port=0)
    try:
        env = pal_env(store=store_server.address, agent=agent.address, compressor=compressor_server.address)
        health = await pal("health", "--json", env=env)
        assert health.code == 1
        ollama = next(row for row in health.json()["services"] if row["service"] == "Ollama")
        assert ollama["status"] == "NOT_SERVING" and "ollama serve" in ollama["error"]
        ran = await pal("run", "hello", env=env)
        line = ran.assert_one_line_error("Ollama")
        assert CLOSED in line and "ollama pull qwen3.6" in line
    finally:
        await agent.stop(0)


async def test_a_sandbox_that_cannot_start_is_said_at_start_and_by_health(
    base_settings, store_server, ollama_sim, compressor_server, tmp_path, monkeypatch, caplog
):
    from palimpsest.agent.app import start_agent
    from palimpsest.agent.sandbox import availability

    profiles = tmp_path / "profiles.json"
    profiles.write_text(
        json.dumps(
            {
                "profiles": [
                    {"id": "coder", "tools": {"agent": ["todo", "run_command"]}},
                    {"id": "chat", "tools": {"agent": ["todo"]}},
                    {"id": "trusted", "tools": {"agent": ["run_command"]}, "sandbox": {"enabled": False}},
                ]
            }
        )
    )
    monkeypatch.setenv("PATH", str(tmp_path))  # the Agent's host has no bubblewrap
    availability.forget()
    settings = replace(
        base_settings,
        ollama_host=ollama_sim.url,
        store_addr=store_server.address,
        compressor_addr=compressor_server.address,
        profiles_path=str(profiles),
    )
    try:
        agent = await start_agent(settings, port=0)
        try:
            said = [r.getMessage() for r in caplog.records if "sandbox" in r.getMessage()]
            assert len(said) == 1 and "apt-get install bubblewrap" in said[0] and "coder" in said[0]
            assert "chat" not in said[0] and "trusted" not in said[0]
            env = pal_env(store=store_server.address, agent=agent.address, compressor=compressor_server.address)
            health = await pal("health", "--json", env=env)
            assert health.code == 1 and health.json()["services_serving"] is True
            row = next(row for row in health.json()["services"] if row["service"] == "Sandbox")
            assert row["status"] == "NOT_SERVING" and "apt-get install bubblewrap" in row["error"]
            shown = await pal("health", env=env)
            assert "only the sandbox cannot start" in shown.stdout
        finally:
            await agent.stop(0)
    finally:
        availability.forget()  # the next test's Agent finds bubblewrap again


async def test_agent_down_is_one_line_naming_its_address(store_server):
    for args in (("run", "hello"), ("profiles",), ("continue", "--id", str(uuid.uuid4()), "hi")):
        ran = await pal(*args, env=pal_env(store=store_server.address))
        ran.assert_one_line_error("cannot reach the Agent at 127.0.0.1:1", "make run")


# -- chat ---------------------------------------------------------------------------------------------
async def test_chat_reads_multi_line_messages_and_starts_over_on_new(env, store):
    typed = 'first line \\\nsecond line\n/id\n"""\nblock one\nblock two\n"""\n/new\nanother topic\n'
    ran = await pal("chat", "--json", env=env, stdin=typed)
    assert ran.code == 0, ran.stderr
    first, second = sessions_of(ran.json_lines())
    assert [m.content for m in await display(store, first) if m.role == "user"] == [
        "first line \nsecond line",
        "block one\nblock two",
    ]
    assert [m.content for m in await display(store, second) if m.role == "user"] == ["another topic"]
    assert first in ran.stderr  # /id answered
    assert "new session" in ran.stderr


async def test_chat_sends_its_profile_and_refs_once_so_a_switch_by_the_model_holds(
    env, store, ollama_sim, pal_profiles
):
    main, tiny, _ = pal_profiles
    ollama_sim.script(
        Reply(tool_calls=[("switch_profile", {"profile_id": main})]), Reply(text="switched"), Reply(text="still there")
    )
    ran = await pal(
        "chat",
        "--json",
        "--profile",
        tiny,
        "--ref",
        "ticket=https://t.test/PAL-9",
        env=env,
        stdin="switch to the main profile\nwhat now?\n",
    )
    assert ran.code == 0, ran.stderr
    (session_id,) = sessions_of(ran.json_lines())
    # tiny for the first call (--profile), the main profile's model after the switch, and the next
    # message resumes where the switch left the session instead of sending --profile again.
    assert [body["model"] for body in ollama_sim.bodies()] == ["tiny", "qwen3.6", "qwen3.6"]
    session = (await store.GetSession(pb.GetSessionRequest(session_id=session_id))).session
    assert (session.profile_id, session.model) == (main, "qwen3.6")
    assert [(r.kind, r.uri) for r in session.external_refs] == [("ticket", "https://t.test/PAL-9")]


async def test_chat_attach_uploads_then_tells_the_model_where_the_file_is(env, store, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("buy milk\n")
    picture = tmp_path / "photo one.png"
    picture.write_bytes(png())
    typed = (
        f"/attach {notes}\nplease read my notes\n/image {picture}\nwhat colour is this?\nand this one: '{picture}'\n"
    )
    ran = await pal("chat", env=env, stdin=typed)
    assert ran.code == 0, ran.stderr
    assert "Traceback" not in ran.stderr
    session_id = next(
        line.split("started session ")[1].split()[0] for line in ran.stdout.splitlines() if "started session" in line
    )
    files = {f.name: f for f in (await store.ListFiles(pb.ListFilesRequest(session_id=session_id))).files}
    assert "notes.txt" in files and "image_1.png" in files
    users = [m for m in await display(store, session_id) if m.role == "user"]
    assert users[0].content == "please read my notes" and list(users[0].files) == ["notes.txt"]
    context = (
        await store.GetSession(pb.GetSessionRequest(session_id=session_id, view=pb.SESSION_VIEW_CONTEXT))
    ).session.context
    told = next(m.content for m in context if m.role == "user")
    assert told == "please read my notes\n\n[Files for this message, in the workspace:\n- notes.txt]"
    assert users[1].content == "what colour is this?" and len(users[1].files) == 1
    assert len(users[2].files) == 1  # the pasted (quoted) path was sent as an image too
    session = (await store.GetSession(pb.GetSessionRequest(session_id=session_id))).session
    assert session.untrusted_ingested  # an upload is content from outside
    assert "Simulated answer to:" in ran.stdout


async def test_run_and_continue_attach_files_the_model_is_told_about(env, store, tmp_path, ollama_sim):
    report = tmp_path / "report.csv"
    report.write_text("quarter,revenue\nQ1,10\n")
    ran = await pal("run", "--attach", str(report), "--json", "what", "is", "in", "it?", env=env)
    assert ran.code == 0, ran.stderr
    session_id = sessions_of(ran.json_lines())[0]
    assert f"attached {report} as report.csv" in ran.stderr
    told = [m for m in ollama_sim.bodies()[-1]["messages"] if m["role"] == "user"][-1]["content"]
    assert told.endswith("[Files for this message, in the workspace:\n- report.csv]")

    again = await pal("continue", "--id", session_id, "--attach", str(report), "and now?", env=env)
    assert again.code == 0, again.stderr
    told = [m for m in ollama_sim.bodies()[-1]["messages"] if m["role"] == "user"][-1]["content"]
    assert told.endswith("\n- report_1.csv]")  # the same name, numbered
    names = [f.name for f in (await store.ListFiles(pb.ListFilesRequest(session_id=session_id))).files]
    assert names == ["report.csv", "report_1.csv"]


async def test_run_with_an_unreadable_or_refused_file_makes_no_session(env, store, tmp_path, ollama_sim):
    missing = await pal("run", "--attach", str(tmp_path / "nope.txt"), "hello", env=env)
    assert missing.code != 0 and "cannot read" in missing.stderr and "nope.txt" in missing.stderr
    folder = await pal("run", "--attach", str(tmp_path), "hello", env=env)
    assert folder.code != 0 and "cannot read" in folder.stderr
    script = tmp_path / "notes.txt"
    script.write_text("#!/bin/sh\necho hi\n")
    refused = await pal("run", "--attach", str(script), "hello", env=env)
    assert refused.code != 0 and "no programs or scripts" in refused.stderr
    assert not ollama_sim.bodies()
    made = (refused.stdout + refused.stderr).split("started session ")[1].split()[0]  # for the file, then removed again
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        await store.GetSession(pb.GetSessionRequest(session_id=made))
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND


async def test_chat_commands_report_problems_without_leaving(env, tmp_path, pal_profiles):
    typed = (
        f"/attach {tmp_path / 'missing.txt'}\n/profile nope\n/profile {pal_profiles[1]}\n/frobnicate\n"
        "/compact\n/help\nstill here?\n/exit\nnot sent\n"
    )
    ran = await pal("chat", env=env, stdin=typed)
    assert ran.code == 0, ran.stderr
    out = ran.stdout
    assert "cannot read" in out and "no profile 'nope'" in out and f"using profile {pal_profiles[1]}" in out
    assert "unknown command /frobnicate" in out and "nothing to compact yet" in out and "/attach FILE" in out
    assert "Simulated answer to: still here?" in out and "not sent" not in out


async def test_chat_compact_shows_the_compression_card(env, store, pal_profiles):
    filler = "the deployment of service alpha uses a blue-green rollout with health checks. " * 30
    s = await new_session(
        store,
        pal_profiles[0],
        *chat_messages(*[(f"question {i}: {filler}", f"answer {i}: {filler}") for i in range(8)]),
    )
    ran = await pal("chat", "--id", s.id, env=env, stdin="/compact\n/compact\n")
    assert ran.code == 0, ran.stderr
    assert "Context compressed: 16 → " in ran.stdout
    after = (await store.GetSession(pb.GetSessionRequest(session_id=s.id, view=pb.SESSION_VIEW_CONTEXT))).session
    assert any(m.is_summary for m in after.context)
    context = await pal("context", s.id, env=env)
    assert "summary" in context.stdout


async def test_chat_resuming_an_unknown_session_is_one_line(env):
    unknown = str(uuid.uuid4())
    (await pal("chat", "--id", unknown, env=env, stdin="hello\n")).assert_one_line_error(unknown)


def slow_answer(lines: int = 400) -> Reply:
    return Reply(text="".join(f"line {i}\n" for i in range(lines)), chunk_delay=0.05)


async def test_ctrl_c_stops_the_running_turn(env, store, ollama_sim):
    ollama_sim.set_responder(lambda body: slow_answer())
    proc = await start_pal("run", "tell me a long story", env=env)
    shown = await read_until(proc.stdout, "line 3")
    proc.send_signal(signal.SIGINT)
    async with asyncio.timeout(15):
        out, err = await proc.communicate()
    text = shown + out.decode()
    assert proc.returncode == 130, err.decode()
    assert "Traceback" not in err.decode()
    assert "stopped" in text and "line 399" not in text
    session_id = text.split("session ")[-1].split()[0]
    # The partial answer was kept: the session stays loadable and shows what was streamed.
    messages = await display(store, session_id)
    assert messages[0].content == "tell me a long story"


async def test_a_second_ctrl_c_leaves_chat(env, ollama_sim):
    """Wherever the second Ctrl-C lands after "turn stopped" (the turn's handler still installed, or
    already the prompt's, or in between), it leaves with 0."""
    ollama_sim.set_responder(lambda body: slow_answer())
    proc = await start_pal("chat", env=env)
    try:
        proc.stdin.write(b"tell me a long story\n")
        await proc.stdin.drain()
        await read_until(proc.stdout, "line 3")
        proc.send_signal(signal.SIGINT)
        await read_until(proc.stdout, "stopped")
        assert proc.returncode is None  # the turn stopped; the chat is still there
        proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(15):
            _, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    assert "Traceback" not in err.decode()


async def test_chat_in_a_terminal_streams_live_and_obeys_ctrl_c(env, ollama_sim):
    term = await open_terminal("chat", env=env)
    try:
        await term.expect("you›")
        term.type("hello from a terminal\r")
        await term.expect("Simulated answer to: hello from a terminal")
        await term.expect("/ 8,192 tokens")  # the context meter stays under the answer
        await term.expect("you›")

        ollama_sim.set_responder(lambda body: slow_answer())
        term.type("now a long story\r")
        await term.expect("line 3")
        term.type("\x03")  # Ctrl-C: stop the turn, keep the chat
        await term.expect("stopping the turn")
        await term.expect("turn stopped")
        await term.expect("you›")
        term.type("\x03")  # Ctrl-C again: leave
        try:
            assert await term.exit_code() == 0
        except TimeoutError:
            raise AssertionError(
                f"pal did not leave on the second Ctrl-C; its screen ends:\n{term.screen[-1500:]}"
            ) from None
    finally:
        term.close()
    assert "Traceback" not in term.screen and "line 399" not in term.screen


async def test_chat_hears_of_a_compression_after_the_answer(env, store, ollama_sim):
    """The post-turn pass compresses after stream_end; no turn's stream carries it. pal chat watches
    its session and says so at its next prompt, its meter right."""
    from tests.helpers.calls import session_due_for_a_post_turn_compression
    from tests.helpers.waiting import until

    session = await session_due_for_a_post_turn_compression(store)
    ollama_sim.set_responder(
        lambda body: Reply(text="- summary\nKEYS: a") if body.get("stream") is False else Reply(text="answered")
    )
    term = await open_terminal("chat", "--id", session.id, env=env)
    try:
        await term.expect("you›")
        term.type("first question\r")
        await term.expect("answered")

        async def compressed() -> bool:
            return any(m.is_compression for m in await display(store, session.id))

        assert await until(compressed, 30)  # the post-turn pass has committed
        # pal hears of it on its watch stream just after that commit, and says so before its next
        # prompt: before the one after the answer when the news was that quick, else an empty line
        # brings another prompt (and again, while the news is on its way).
        news = "context compressed after the last answer"
        for _ in range(100):
            if await term.expect_first(news, "you›") == news:
                break
            term.type("\r")
        else:
            raise AssertionError(f"pal never said {news!r}; the screen ends with:\n{term.screen[-1500:]}")
        await term.expect("you›")
        term.type("second question\r")
        await term.expect("answered")
        await term.expect("you›")
        term.type("\x03")  # Ctrl-C at the prompt: leave
        assert await term.exit_code() == 0
    finally:
        term.close()
    assert "Traceback" not in term.screen


async def test_files_list_and_get_follow_a_link_without_clobbering(env, store, tmp_path):
    session = await new_session(store, "newcomer")

    async def parts():
        yield pb.PutFileRequest(header=pb.PutFileHeader(session_id=session.id, filename="chart data.csv"))
        yield pb.PutFileRequest(chunk=b"x,y\n1,2\n")

    await store.PutFile(parts())
    listed = await pal("files", "list", session.id, env=env)
    assert listed.code == 0 and "chart data.csv" in listed.stdout and "text/csv" in listed.stdout

    link = f"palimpsest://sessions/{session.id}/files/chart%20data.csv"
    got = await pal("files", "get", link, "-o", str(tmp_path), env=env)
    assert got.code == 0, got.stderr
    assert (tmp_path / "chart data.csv").read_bytes() == b"x,y\n1,2\n"
    again = await pal("files", "get", session.id, "chart data.csv", "-o", str(tmp_path / "chart data.csv"), env=env)
    assert again.code != 0 and "already exists" in again.stderr and "--force" in again.stderr
    piped = await pal("files", "get", link, "-o", "-", env=env)
    assert piped.stdout == "x,y\n1,2\n"
    missing = await pal("files", "get", session.id, "nope.csv", "-o", str(tmp_path), env=env)
    assert missing.code != 0 and "nope.csv" in missing.stderr and not (tmp_path / "nope.csv").exists()


# -- a dropped connection -----------------------------------------------------------------------------
async def test_run_resumes_the_turn_after_the_connection_to_the_agent_drops(
    agent_server, store_server, compressor_server, store, ollama_sim
):
    """The network between pal and the Agent is cut mid-answer and comes back: pal picks the turn up
    where its screen left off, and the answer is shown whole, each part once."""
    host, port = agent_server.address.rsplit(":", 1)
    relay = Relay((host, int(port)))
    await relay.start()
    answer = "".join(f"line {i}\n" for i in range(60))
    ollama_sim.set_responder(lambda body: Reply(text=answer, chunk_delay=0.05))
    env = pal_env(store=store_server.address, agent=f"127.0.0.1:{relay.port}", compressor=compressor_server.address)
    proc = await start_pal("run", "--json", "count to sixty", env=env)
    shown = ""
    while shown.count("text_delta") < 5:  # a few words of the answer are on screen
        shown += await read_until(proc.stdout, "text_delta")
    await relay.cut()  # every connection reset, nothing listening for a moment
    await relay.start()
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert "resuming the turn" in err.decode() and "Traceback" not in err.decode()
    events = [json.loads(line) for line in (shown + out.decode()).splitlines() if line.strip()]
    assert [int(e["seq"]) for e in events] == list(range(1, len(events) + 1))  # none missed, none twice
    text = "".join(e["text_delta"]["text"] for e in events if "text_delta" in e)
    assert text == answer and events[-1]["stream_end"]["reason"] == COMPLETED
    session_id = events[0]["session_id"]
    assert [m.content for m in await display(store, session_id)] == ["count to sixty", answer]

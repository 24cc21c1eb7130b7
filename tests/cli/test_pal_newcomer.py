"""`pal` as a newcomer meets it (issue 14), against the real services and the Ollama simulator."""

from __future__ import annotations

import json
import logging
import os
import uuid
from dataclasses import replace

import pytest

from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as pb
from tests.helpers.pal_cli import CLOSED, chat_messages, new_session, open_terminal, pal, pal_env

Message = common_pb2.Message


@pytest.fixture(scope="module")
def profiles_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("newcomer-profiles") / "profiles.json"
    path.write_text(
        json.dumps(
            {"default": "newcomer", "profiles": [{"id": "newcomer", "model": "qwen3.6", "context_window": 8192}]}
        )
    )
    return path


@pytest.fixture(scope="module")
async def agent_server(base_settings, store_server, compressor_server, ollama_sim, profiles_path):
    from palimpsest.agent.app import start_agent

    settings = replace(
        base_settings,
        ollama_host=ollama_sim.url,
        store_addr=store_server.address,
        compressor_addr=compressor_server.address,
        profiles_path=str(profiles_path),
    )
    running = await start_agent(settings, port=0)
    yield running
    await running.stop(0)


@pytest.fixture
def env(agent_server, store_server, compressor_server) -> dict[str, str]:
    return pal_env(store=store_server.address, agent=agent_server.address, compressor=compressor_server.address)


def write_later(path, text: str) -> None:
    """Write the file with a modification time the previous content did not have."""
    before = path.stat().st_mtime
    path.write_text(text)
    os.utime(path, (before + 1, before + 1))


# -- profiles ----------------------------------------------------------------------------------------
async def test_a_broken_edit_keeps_the_last_good_profiles_and_says_why(env, profiles_path, caplog):
    good = profiles_path.read_text()
    try:
        write_later(profiles_path, '{"default": "newcomer", "profiles": [\n  {"id": "newcomer",\n   "model": }\n]}')
        with caplog.at_level(logging.ERROR, logger="palimpsest.agent"):
            ran = await pal("profiles", env=env)
        assert ran.code == 0, ran.stderr
        assert "newcomer" in ran.stdout and "qwen3.6" in ran.stdout  # the last good profiles, still in use
        assert f"{profiles_path} line 3 column" in ran.stderr and "last good" in ran.stderr
        logged = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(logged) == 1 and f"{profiles_path} line 3" in logged[0] and "PALIMPSEST_PROFILES" in logged[0]
        data = (await pal("profiles", "--json", env=env)).json()
        assert f"{profiles_path} line 3" in data["profiles_error"]
        assert [p["id"] for p in data["profiles"]] == ["newcomer"]
        # Fixed: the error goes, and the file's profiles apply again.
        write_later(profiles_path, good.replace("8192", "4096"))
        fixed = (await pal("profiles", "--json", env=env)).json()
        assert fixed["profiles_error"] == "" and fixed["profiles"][0]["context_window"] == 4096
    finally:
        write_later(profiles_path, good)


# -- health ------------------------------------------------------------------------------------------
async def test_health_shows_ollama_host(env, ollama_sim):
    ran = await pal("health", env=env)
    assert ran.code == 0, ran.stdout
    assert ollama_sim.url in ran.stdout
    assert (await pal("health", "--json", env=env)).json()["services_serving"] is True


async def test_health_without_ollama_says_the_services_are_fine(
    base_settings, store_server, compressor_server, profiles_path
):
    from palimpsest.agent.app import start_agent

    settings = replace(
        base_settings,
        ollama_host=f"http://{CLOSED}",
        store_addr=store_server.address,
        compressor_addr=compressor_server.address,
        profiles_path=str(profiles_path),
    )
    agent = await start_agent(settings, port=0)
    try:
        env = pal_env(store=store_server.address, agent=agent.address, compressor=compressor_server.address)
        ran = await pal("health", env=env)
        assert ran.code == 1
        assert f"OLLAMA_HOST=http://{CLOSED}" in ran.stdout
        assert "three services are fine" in ran.stdout and "only Ollama is missing" in ran.stdout
        data = (await pal("health", "--json", env=env)).json()
        assert data["healthy"] is False and data["services_serving"] is True
    finally:
        await agent.stop(0)


# -- after make demo ---------------------------------------------------------------------------------
async def test_continue_a_session_whose_profile_this_agent_does_not_have(env, store):
    """`make demo` leaves a session of its own profile `demo` in make run's database."""
    session = await new_session(
        store,
        f"demo-{uuid.uuid4().hex[:6]}",
        Message(role="user", content="hi"),
        Message(role="assistant", content="hello"),
    )
    ran = await pal("continue", "--id", session.id, "and now?", env=env)
    assert ran.code == 0, ran.stderr
    assert "Simulated answer to: and now?" in ran.stdout


# -- pal chat ----------------------------------------------------------------------------------------
async def test_ctrl_d_in_a_terminal_ends_the_line_and_says_how_to_resume(env):
    term = await open_terminal("chat", env=env)
    try:
        await term.expect("you›")
        term.type("hello\r")
        await term.expect("Simulated answer to: hello")
        await term.expect("you›")
        term.type("\x04")  # Ctrl-D
        assert await term.exit_code() == 0
    finally:
        term.close()
    last = term.screen.rstrip("\n").splitlines()
    assert last[-2].strip() == "you›"  # the prompt's line was ended, not written over
    session_id = last[-1].split("session ")[1].split()[0]
    assert last[-1].endswith(f"resume with: pal chat --id {session_id}")


async def test_leaving_chat_by_exit_or_end_of_input_says_how_to_resume(env):
    for typed in ("hi\n/exit\n", "hi\n"):
        ran = await pal("chat", env=env, stdin=typed)
        assert ran.code == 0, ran.stderr
        assert "resume with: pal chat --id " in ran.stdout.splitlines()[-1]
    ran = await pal("chat", env=env, stdin="/exit\n")  # no session yet: nothing to resume
    assert "resume" not in ran.stdout


async def test_compact_on_a_short_session_says_why_in_plain_words(env, store):
    session = await new_session(store, "newcomer", *chat_messages(("hi", "hello")))
    ran = await pal("chat", "--id", session.id, env=env, stdin="/compact\n")
    assert ran.code == 0, ran.stderr
    assert "nothing to compact yet: the context is only 2 messages" in ran.stdout
    assert "nothing to compress" not in ran.stdout and "nothing to compact: " not in ran.stdout


async def test_attach_refusal_says_what_is_allowed(env, tmp_path):
    script = tmp_path / "x.py"
    script.write_text("print('hi')\n")
    ran = await pal("chat", env=env, stdin=f"/attach {script}\n")
    assert ran.code == 0, ran.stderr
    assert "'x.py' is refused: a session keeps no programs or scripts" in ran.stdout
    assert "Text, data, documents and images are accepted" in ran.stdout and "'x.py.txt'" in ran.stdout


# -- sessions and JSON -------------------------------------------------------------------------------
async def test_trim_and_search_json_use_the_same_shapes_as_the_rest(env, store):
    word = f"okapi{uuid.uuid4().hex[:6]}"
    s = await new_session(store, "newcomer", *chat_messages(*[(f"q{i} {word}", f"a{i}") for i in range(3)]))
    trimmed = (await pal("sessions", "trim", s.id, "--keep", "4", "--json", env=env)).json()
    assert trimmed["session_id"] == s.id and trimmed["after"] == "4"
    found = (await pal("sessions", "search", word, "--json", env=env)).json()
    listed = (await pal("sessions", "list", "--json", env=env)).json()
    assert isinstance(found["total"], str) and isinstance(listed["total"], str)  # int64: a string in both
    assert set(listed) <= set(found)  # search's object is list's, plus the query and each session's matches
    assert found["sessions"][0]["id"] == s.id and "matches" in found["sessions"][0]


async def test_show_counts_what_it_numbers_and_says_when_tokens_are_unmeasured(env, store):
    s = await new_session(
        store, "newcomer", *chat_messages(("old question", "old answer"), ("recent question", "recent answer"))
    )
    await store.CommitCompression(
        pb.CommitCompressionRequest(
            session_id=s.id,
            demote_seqs=[1, 2],
            summary=Message(
                role="user", content="Summary: an old question.", replaces=common_pb2.SeqRange(first=1, last=2)
            ),
            marker=Message(role="assistant", content="Compressed 2 messages"),
            context_token_count=42,
        )
    )
    await store.AppendMessages(
        pb.AppendMessagesRequest(session_id=s.id, messages=[Message(role="user", content="newest question")])
    )
    shown = (await pal("sessions", "show", s.id, env=env)).stdout
    numbers = [int(n) for n in __import__("re").findall(r"^#(\d+) ", shown, __import__("re").M)]
    header = next(line for line in shown.splitlines() if "messages" in line)
    assert "5 + 1 compression marker" in header and f"#1–#{max(numbers)}" in header, shown
    assert "pal context" in header
    await pal("sessions", "trim", s.id, "--keep", "2", env=env)
    after = (await pal("sessions", "show", s.id, env=env)).stdout
    assert "0 tokens" not in after and "not measured yet (the next turn measures it)" in after


async def test_shared_opens_a_share_token(env, store):
    s = await new_session(
        store, "newcomer", *chat_messages(*[(f"q{i}", f"a{i}") for i in range(3)]), name="for a friend"
    )
    token = (await pal("sessions", "share", s.id, env=env)).stdout.strip()
    ran = await pal("shared", token, env=env)
    assert ran.code == 0, ran.stderr
    assert "for a friend" in ran.stdout and "read-only" in ran.stdout
    assert all(f"q{i}" in ran.stdout and f"a{i}" in ran.stdout for i in range(3))
    page = await pal("shared", token, "--last", "2", env=env)
    assert "q2" in page.stdout and "q1" not in page.stdout
    assert "older messages: pal shared TOKEN --before 5" in page.stdout
    older = await pal("shared", token, "--before", "5", "--json", env=env)
    assert [m["content"] for m in older.json()["messages"]] == ["q0", "a0", "q1", "a1"]
    (await pal("shared", "not-a-token", env=env)).assert_one_line_error()


async def test_a_token_beginning_with_a_dash_reaches_the_store(env, store):
    """Links made before the store stopped issuing them: one token in 64 began with '-'."""
    s = await new_session(store, "newcomer", *chat_messages(("q", "a")), name="dashed")
    token = (await pal("sessions", "share", s.id, env=env)).stdout.strip()
    assert not token.startswith("-")
    unknown = await pal("shared", "-" + token[1:], "--last", "5", env=env)  # a valid shape, no such link
    assert unknown.code != 0 and "usage:" not in unknown.stderr, unknown.stderr
    assert unknown.stderr.startswith("pal: ") and "share" in unknown.stderr.lower(), unknown.stderr

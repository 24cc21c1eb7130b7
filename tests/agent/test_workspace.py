"""A session's workspace: files at paths in the SessionStore (the source of truth), mirrored by each
Agent, and the file tools a model uses on it — read_file, write_file, edit_file, list_files, grep —
against the real Agent(s), the store on PostgreSQL and the Ollama simulator. Every path a model sends
is judged before anything is opened; what the store refuses is a result the model reads."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ollama_sim import Reply
from palimpsest.shared.auth import vouching_metadata
from palimpsest.shared.workspace_paths import BadPath, matches, workspace_path
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import agent_pb2_grpc, session_store_pb2_grpc
from palimpsest.v1 import session_store_pb2 as store_pb
from tests.conftest import JWT_SECRET, _start_store, agent_settings, bearer
from tests.helpers.calls import END, expect_status, file_bytes, full, inline, put_file, run

# Each test starts from the simulator's deterministic echo.
pytestmark = pytest.mark.usefixtures("fresh_sim")

FILE_TOOLS = ["read_file", "write_file", "edit_file", "list_files", "grep", "image_view"]


# -- paths, pure ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "raw, cwd, expected",
    [
        ("notes.txt", "", "notes.txt"),
        ("src/app.py", "", "src/app.py"),
        ("./src//app.py", "", "src/app.py"),
        ("app.py", "src", "src/app.py"),
        ("../lib/x.py", "src/a", "src/lib/x.py"),
        ("/workspace/src/app.py", "docs", "src/app.py"),
        (".gitignore", "", ".gitignore"),
        ("données/été.csv", "", "données/été.csv"),
    ],
)
def test_a_workspace_path_is_normalized_from_the_working_folder(raw, cwd, expected):
    assert workspace_path(raw, cwd) == expected


@pytest.mark.parametrize(
    "raw, why",
    [
        ("", "empty"),
        ("../etc/passwd", "leads out of the workspace"),
        ("a/../../x", "leads out of the workspace"),
        ("/etc/passwd", "is absolute"),
        ("C:/Windows/x", "is absolute"),
        ("a\x00b", "NUL"),
        ("a\nb", "control"),
        ("x.py\u200b", "invisible"),
        ("\u202egnp.exe", "invisible"),
        ("a\\b", "uses '\\'"),
        ("CON", "device name"),
        ("dir/nul.txt", "device name"),
        ("x" * 256, "longer than 255 bytes"),
        ("/".join(["d"] * 40), "folders deep"),
        (".sha256/x", "keeps for itself"),
        ("a/.upload-1.part", "keeps for itself"),
        ("trailing. ", "ends with a space or a dot"),
        ("/workspace", "the workspace itself"),
    ],
)
def test_a_path_that_leaves_or_hides_is_refused_with_why(raw, why):
    with pytest.raises(BadPath) as refused:
        workspace_path(raw)
    assert why in str(refused.value)


GREP_LINES = st.lists(st.text(alphabet="ab c\t\r\n\x0b\x85é1-", max_size=12), max_size=6)


@settings(max_examples=300, deadline=None)
@given(
    lines=GREP_LINES,
    raw=st.sampled_from(
        [
            "a",
            "ab",
            "a b",
            "b+c",
            r"\d",
            "a|c",
            r"\s",
            r"a\sb",
            "[^a]b",
            r"\bab\b",
            "a.b",
            "é",
            r"(a)\1",
            "^a",
            "b$",
            r"\Aa",
            r"a(?!\n)",
            "(?<=b)a",
        ]
    ),
)
def test_grep_skips_a_file_only_when_no_line_of_it_matches(lines, raw):
    import regex

    from palimpsest.agent.tools.files import whole_file_filter

    pattern = regex.compile(raw)
    text = "\n".join(lines)
    prefilter = whole_file_filter(pattern)
    if prefilter is not None and any(pattern.search(line) for line in text.splitlines()):
        assert prefilter.search(text)


def test_globs_match_by_name_anywhere_or_by_path():
    assert matches("src/deep/app.py", "*.py") and not matches("src/app.pyc", "*.py")
    assert matches("src/deep/app.py", "src/**/*.py") and matches("src/app.py", "src/**/*.py")
    assert not matches("lib/app.py", "src/**") and matches("src/x/y", "src/**")


# -- the store keeps paths ------------------------------------------------------------------------
async def write(store, session_id: str, path: str, data: bytes, metadata=(), **header) -> store_pb.PutFileResponse:
    async def parts():
        yield store_pb.PutFileRequest(header=store_pb.PutFileHeader(session_id=session_id, path=path, **header))
        yield store_pb.PutFileRequest(chunk=data)

    return await store.PutFile(parts(), metadata=metadata)


async def test_the_store_keeps_files_at_paths_replacing_them_whole(store):
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="p"))).session
    await write(store, session.id, "src/app.py", b"print(1)\n", from_tool=True)
    await write(store, session.id, "src/app.py", b"print(2)\n", from_tool=True)
    await write(store, session.id, "docs/a/b.md", b"# b\n", from_tool=True, outside_content=True)
    listed = (await store.ListFiles(store_pb.ListFilesRequest(session_id=session.id))).files
    assert [(f.name, f.size, f.outside_content) for f in listed] == [("docs/a/b.md", 4, True), ("src/app.py", 9, False)]
    assert await file_bytes(store, session.id, "src/app.py") == b"print(2)\n"
    freed = await store.DeleteFile(store_pb.DeleteFileRequest(session_id=session.id, name="docs/a/b.md"))
    assert freed.freed == 4
    assert [f.name for f in (await store.ListFiles(store_pb.ListFilesRequest(session_id=session.id))).files] == [
        "src/app.py"
    ]
    await expect_status(
        store.DeleteFile(store_pb.DeleteFileRequest(session_id=session.id, name="docs/a/b.md")),
        grpc.StatusCode.NOT_FOUND,
        "docs/a/b.md",
    )


async def test_a_listing_names_a_token_that_changes_with_every_write_and_delete(store):
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="p"))).session

    async def listing(unless: str = "") -> store_pb.ListFilesResponse:
        return await store.ListFiles(store_pb.ListFilesRequest(session_id=session.id, unless_token=unless))

    await write(store, session.id, "a.txt", b"a", from_tool=True)
    first = await listing()
    assert [f.name for f in first.files] == ["a.txt"] and first.token and not first.unchanged
    again = await listing(first.token)
    assert again.unchanged and not again.files and again.token == first.token
    await write(store, session.id, "a.txt", b"b", from_tool=True)  # replaced: same name, new content
    replaced = await listing(first.token)
    assert not replaced.unchanged and [f.sha256 for f in replaced.files] != [f.sha256 for f in first.files]
    await store.DeleteFile(store_pb.DeleteFileRequest(session_id=session.id, name="a.txt"))
    emptied = await listing(replaced.token)
    assert not emptied.unchanged and not emptied.files and emptied.token != replaced.token
    await put_file(store, session.id, "upload.csv", b"x,y\n")  # an upload, not a tool's write
    assert not (await listing(emptied.token)).unchanged
    assert (await listing("not-a-token")).files  # an unknown token lists


@pytest.mark.parametrize(
    "path",
    ["../escape.txt", "/etc/passwd", "a/../../x", ".sha256/x", "CON", ".palimpsest-changes", "src/.palimpsest-changes"],
)
async def test_the_store_refuses_a_path_that_is_not_a_workspace_path(store, path):
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="p"))).session
    await expect_status(
        write(store, session.id, path, b"x", from_tool=True), grpc.StatusCode.INVALID_ARGUMENT, "header.path"
    )
    assert not (await store.ListFiles(store_pb.ListFilesRequest(session_id=session.id))).files


async def test_only_the_services_tool_writes_may_keep_source_code(store_auth, user):
    me = bearer(user)
    session = (await store_auth.CreateSession(store_pb.CreateSessionRequest(profile_id="p"), metadata=me)).session
    await expect_status(
        write(store_auth, session.id, "app.py", b"print(1)\n", me, from_tool=True),
        grpc.StatusCode.INVALID_ARGUMENT,
        "program",
    )
    vouched = me + vouching_metadata(True, JWT_SECRET)
    kept = await write(store_auth, session.id, "app.py", b"#!/usr/bin/env python3\nprint(1)\n", vouched, from_tool=True)
    assert kept.file.name == "app.py" and not kept.file.outside_content
    await expect_status(
        write(store_auth, session.id, "a.out", b"\x7fELF\x02\x01\x01" + b"\0" * 64, vouched, from_tool=True),
        grpc.StatusCode.INVALID_ARGUMENT,
        "program",
    )
    got = await store_auth.GetSession(store_pb.GetSessionRequest(session_id=session.id), metadata=me)
    assert not got.session.untrusted_ingested  # the conversation's own code does not taint


# -- the tools, through the Agent ------------------------------------------------------------------
@pytest.fixture(scope="module")
def files_profiles(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("ws-profiles") / "profiles.json"
    path.write_text(
        json.dumps(
            {
                "default": "hands",
                "profiles": [
                    {
                        "id": "hands",
                        "model": "qwen3.6",
                        "context_window": 8192,
                        "max_iterations": 8,
                        "think_enabled": False,
                        "memory_recall_enabled": False,
                        "tools": {"agent": [*FILE_TOOLS, "spawn_agent"], "subagent": FILE_TOOLS},
                    }
                ],
            }
        )
    )
    return str(path)


@pytest.fixture(scope="module")
async def two_agents(base_settings, store_server, compressor_server, ollama_sim, files_profiles):
    """Two Agent replicas on one SessionStore, each with a mirror of its own."""
    from palimpsest.agent.app import start_agent

    settings = agent_settings(base_settings, store_server, compressor_server, ollama_sim, files_profiles)
    first = await start_agent(settings, port=0)
    second = await start_agent(settings, port=0)
    async with grpc.aio.insecure_channel(first.address) as one, grpc.aio.insecure_channel(second.address) as two:
        yield agent_pb2_grpc.AgentStub(one), agent_pb2_grpc.AgentStub(two)
    await second.stop(0)
    await first.stop(0)


def tool_results(ollama_sim) -> list[str]:
    return [m["content"] for m in ollama_sim.bodies()[-1]["messages"] if m["role"] == "tool"]


def finished(events) -> list[tuple[str, bool]]:
    return [(e.tool_finished.name, e.tool_finished.is_error) for e in events if e.HasField("tool_finished")]


async def test_a_model_reads_an_attachment_by_its_workspace_path(two_agents, store, ollama_sim):
    agent, _ = two_agents
    ollama_sim.script(Reply(tool_calls=[("read_file", {"path": "notes.txt"})]), Reply(text="Milk and eggs."))
    events = await run(agent, "what do I need to buy?", inline_attachments=[inline("notes.txt", b"milk\neggs\n")])
    told = [m for m in ollama_sim.bodies()[0]["messages"] if m["role"] == "user"][-1]["content"]
    assert told.endswith("[Files for this message, in the workspace:\n- notes.txt]")
    assert tool_results(ollama_sim) == ["     1\tmilk\n     2\teggs"]
    assert events[-1].stream_end.reason == END.STREAM_END_REASON_COMPLETED
    assert (await full(store, events[0].session_id)).untrusted_ingested  # an upload is outside content


async def test_a_model_writes_edits_and_reads_back_and_the_store_has_every_change(two_agents, store, ollama_sim):
    agent, _ = two_agents
    ollama_sim.script(
        Reply(tool_calls=[("write_file", {"path": "src/app.py", "content": "def f():\n    return 1\n"})]),
        Reply(tool_calls=[("edit_file", {"path": "src/app.py", "old_string": "return 1", "new_string": "return 2"})]),
        Reply(tool_calls=[("read_file", {"path": "/workspace/src/app.py"})]),
        Reply(text="done"),
    )
    events = await run(agent, "write it")
    session_id = events[0].session_id
    assert finished(events) == [("write_file", False), ("edit_file", False), ("read_file", False)]
    assert await file_bytes(store, session_id, "src/app.py") == b"def f():\n    return 2\n"
    created, edited, read = tool_results(ollama_sim)
    assert created == "Created src/app.py (22 bytes, 2 lines)."
    assert edited.startswith("Edited src/app.py: 1 replacement.") and "return 2" in edited
    assert read == "     1\tdef f():\n     2\t    return 2"
    session = await full(store, session_id)
    assert not session.untrusted_ingested  # the conversation's own files: nothing from outside


async def test_what_one_replica_wrote_the_other_reads_in_the_next_turn(two_agents, store, ollama_sim):
    first, second = two_agents
    ollama_sim.script(
        Reply(tool_calls=[("write_file", {"path": "plan.md", "content": "step one\n"})]), Reply(text="ok")
    )
    session_id = (await run(first, "note the plan"))[0].session_id
    ollama_sim.script(
        Reply(tool_calls=[("write_file", {"path": "plan.md", "content": "step two\n"})]), Reply(text="ok")
    )
    await run(second, "change it", session_id=session_id)

    def read_when_asked(body):  # (the first replica's kept copy is stale: its first call is made again)
        last = body["messages"][-1]
        asked = last["role"] == "user" and "read it" in last["content"]
        return Reply(tool_calls=[("read_file", {"path": "plan.md"})]) if asked else Reply(text="ok")

    ollama_sim.set_responder(read_when_asked)
    await run(first, "read it", session_id=session_id)  # its mirror still had "step one"
    assert tool_results(ollama_sim)[-1] == "     1\tstep two"


async def test_a_sub_agent_works_in_its_parents_workspace(two_agents, store, ollama_sim):
    agent, _ = two_agents
    ollama_sim.script(
        Reply(tool_calls=[("spawn_agent", {"task": "write the notes"})]),
        Reply(tool_calls=[("write_file", {"path": "notes/sub.md", "content": "from the sub-agent\n"})]),
        Reply(text="written"),
        Reply(text="done"),
    )
    session_id = (await run(agent, "delegate"))[0].session_id
    assert await file_bytes(store, session_id, "notes/sub.md") == b"from the sub-agent\n"


async def test_the_turns_working_folder_resolves_relative_paths(two_agents, store, ollama_sim):
    agent, _ = two_agents
    ollama_sim.script(
        Reply(
            tool_calls=[("write_file", {"path": "app.py", "content": "x = 1\n"}), ("list_files", {"pattern": "*.py"})]
        ),
        Reply(text="ok"),
    )
    events = await run(agent, "write it here", cwd="src")
    assert await file_bytes(store, events[0].session_id, "src/app.py") == b"x = 1\n"
    assert tool_results(ollama_sim)[1] == "1 file in src matching '*.py':\nsrc/app.py  (6 bytes)"
    await expect_status(run(agent, "nowhere", cwd="../up"), grpc.StatusCode.INVALID_ARGUMENT, "cwd")


async def test_edit_file_says_when_the_text_is_absent_or_not_unique(two_agents, store, ollama_sim):
    agent, _ = two_agents
    ollama_sim.script(
        Reply(tool_calls=[("write_file", {"path": "a.txt", "content": "one\ntwo\none\n"})]),
        Reply(
            tool_calls=[
                ("edit_file", {"path": "a.txt", "old_string": "three", "new_string": "3"}),
                ("edit_file", {"path": "a.txt", "old_string": "one", "new_string": "1"}),
                ("edit_file", {"path": "b.txt", "old_string": "one", "new_string": "1"}),
                ("edit_file", {"path": "a.txt", "old_string": "one", "new_string": "1", "replace_all": True}),
            ]
        ),
        Reply(text="ok"),
    )
    events = await run(agent, "edit")
    absent, twice, missing, replaced = tool_results(ollama_sim)[1:]
    assert "the text to replace is not in a.txt" in absent
    assert "appears 2 times in a.txt (lines 1, 3)" in twice
    assert "there is no file 'b.txt'" in missing and "a.txt" in missing  # a close name is offered
    assert replaced.startswith("Edited a.txt: 2 replacements.")
    assert await file_bytes(store, events[0].session_id, "a.txt") == b"1\ntwo\n1\n"


async def test_grep_and_list_files_find_what_is_there(two_agents, store, ollama_sim):
    agent, _ = two_agents
    ollama_sim.script(
        Reply(
            tool_calls=[
                ("write_file", {"path": "src/a.py", "content": "import os\n# TODO: fix\n"}),
                ("write_file", {"path": "src/b.py", "content": "x = 1  # todo later\n"}),
                ("write_file", {"path": "README.md", "content": "TODO list\n"}),
            ]
        ),
        Reply(
            tool_calls=[
                ("grep", {"pattern": "todo", "ignore_case": True, "glob": "*.py"}),
                ("grep", {"pattern": "(a+)+$"}),
                ("grep", {"pattern": "[unclosed"}),
                ("list_files", {}),
                ("list_files", {"path": "src", "pattern": "b*"}),
            ]
        ),
        Reply(text="ok"),
    )
    await run(agent, "look")
    found, nothing, bad, everything, some = tool_results(ollama_sim)[3:]
    assert found == "src/a.py:2: # TODO: fix\nsrc/b.py:1: x = 1  # todo later"
    assert nothing.startswith("No match for '(a+)+$' in 3 files")
    assert "not a valid regular expression" in bad
    assert everything.splitlines()[1:] == ["README.md  (10 bytes)", "src/a.py  (22 bytes)", "src/b.py  (20 bytes)"]
    assert some.splitlines()[1:] == ["src/b.py  (20 bytes)"]


async def test_read_file_pages_a_long_file_and_describes_binary_and_images(two_agents, store, ollama_sim):
    agent, _ = two_agents
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="hands"))).session
    long = "".join(f"line {n} " + "x" * 60 + "\n" for n in range(1, 3001)).encode()
    await write(store, session.id, "big.log", long, from_tool=True)
    await write(store, session.id, "blob.bin", bytes(range(256)) * 4, from_tool=True)
    from tests.helpers.calls import png_bytes

    await write(store, session.id, "shot.png", png_bytes(), from_tool=True)
    ollama_sim.script(
        Reply(
            tool_calls=[
                ("read_file", {"path": "big.log"}),
                ("read_file", {"path": "big.log", "offset": 2999}),
                ("read_file", {"path": "blob.bin"}),
                ("read_file", {"path": "shot.png"}),
            ]
        ),
        Reply(text="ok"),
    )
    await run(agent, "read them", session_id=session.id)
    first, end, binary, image = tool_results(ollama_sim)
    assert first.startswith("     1\tline 1 ") and "the file goes on: read_file with offset=" in first
    assert len(first) < 5_000  # an 8k window's share, not 200 KB
    assert end.splitlines() == [f"{n:>6}\tline {n} " + "x" * 60 for n in (2999, 3000)]
    assert "blob.bin is binary" in binary and "not shown" in binary
    assert "shot.png is an image" in image and "image_view" in image


@pytest.mark.parametrize(
    "path", ["../../etc/passwd", "/etc/passwd", "x\x00y", "CON", "a\u200b.txt", "../" + "x" * 300, "/proc/self/environ"]
)
async def test_a_path_out_of_the_workspace_is_refused_with_a_reason(two_agents, ollama_sim, path):
    agent, _ = two_agents
    ollama_sim.script(
        Reply(tool_calls=[("read_file", {"path": path}), ("write_file", {"path": path, "content": "x"})]),
        Reply(text="ok"),
    )
    events = await run(agent, "try it")
    assert finished(events) == [("read_file", True), ("write_file", True)]
    read, wrote = tool_results(ollama_sim)
    assert read.startswith("read_file: 'path': ") and wrote.startswith("write_file: 'path': ")


@pytest.fixture(scope="module")
async def small_quota(base_settings, database_url, compressor_server, ollama_sim, files_profiles):
    """A store that keeps at most 2 KB per file, with auth on, and an Agent in front of it."""
    from palimpsest.agent.app import start_agent

    settings = replace(base_settings, files_max_bytes=2_000, auth_enabled=True)
    store_server = await _start_store(settings, database_url)
    agent_server = await start_agent(
        replace(
            agent_settings(settings, store_server, compressor_server, ollama_sim, files_profiles), auth_enabled=True
        ),
        port=0,
    )
    async with (
        grpc.aio.insecure_channel(agent_server.address) as channel,
        grpc.aio.insecure_channel(store_server.address) as store_channel,
    ):
        yield agent_pb2_grpc.AgentStub(channel), session_store_pb2_grpc.SessionStoreStub(store_channel)
    await agent_server.stop(0)
    await store_server.stop(0)


async def test_a_write_the_store_refuses_is_a_result_the_model_reads(small_quota, ollama_sim):
    agent, store = small_quota
    me = bearer(f"ws-{uuid.uuid4().hex[:8]}")
    ollama_sim.script(
        Reply(
            tool_calls=[
                ("write_file", {"path": "big.txt", "content": "x" * 5_000}),
                ("write_file", {"path": "tool.exe", "content": "MZ" + "\0" * 100}),
            ]
        ),
        Reply(text="could not"),
    )
    events = [e async for e in agent.RunStream(pb.RunStreamRequest(text="write"), metadata=me)]
    assert events[-1].stream_end.reason == END.STREAM_END_REASON_COMPLETED
    too_big, program = tool_results(ollama_sim)
    assert "big.txt was not written" in too_big and "2000 bytes" in too_big
    assert "tool.exe was not written" in program and "program" in program
    files = await store.ListFiles(store_pb.ListFilesRequest(session_id=events[0].session_id), metadata=me)
    assert not files.files


async def test_a_file_deleted_meanwhile_is_gone_from_the_next_turn(two_agents, store, ollama_sim):
    agent, _ = two_agents
    ollama_sim.script(Reply(tool_calls=[("read_file", {"path": "gone.txt"})]), Reply(text="ok"))
    session_id = (await run(agent, "read it", inline_attachments=[inline("gone.txt", b"here\n")]))[0].session_id
    assert tool_results(ollama_sim) == ["     1\there"]
    ollama_sim.script(Reply(tool_calls=[("list_files", {})]), Reply(text="ok"))
    await run(agent, "and now?", session_id=session_id)  # unchanged since: the mirror is not listed again
    assert "gone.txt" in tool_results(ollama_sim)[-1]
    await store.DeleteFile(store_pb.DeleteFileRequest(session_id=session_id, name="gone.txt"))
    ollama_sim.script(Reply(tool_calls=[("read_file", {"path": "gone.txt"})]), Reply(text="ok"))
    await run(agent, "once more", session_id=session_id)
    assert tool_results(ollama_sim)[-1].startswith("read_file: there is no file 'gone.txt' in the workspace")


async def test_a_file_uploaded_meanwhile_is_seen_by_the_next_turn(two_agents, store, ollama_sim):
    agent, _ = two_agents
    ollama_sim.script(Reply(tool_calls=[("list_files", {})]), Reply(text="ok"))
    session_id = (await run(agent, "what is there?"))[0].session_id
    assert tool_results(ollama_sim) == ["No files in the workspace."]
    await put_file(store, session_id, "later.csv", b"a,b\n")
    ollama_sim.script(Reply(tool_calls=[("read_file", {"path": "later.csv"})]), Reply(text="ok"))
    await run(agent, "and now?", session_id=session_id)
    assert tool_results(ollama_sim)[-1] == "     1\ta,b"

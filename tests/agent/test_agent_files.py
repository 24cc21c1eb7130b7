"""Files in the conversation: a turn's attachments and the upload policy, share_file and content_publish,
against real files, the Agent, the SessionStore on PostgreSQL and the Ollama simulator."""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import replace

import grpc
import pytest

from ollama_sim import Reply
from palimpsest.agent.attachments import INLINE_MAX_BYTES, MAX_ATTACHMENTS
from palimpsest.agent.local_files import Refused, open_shareable, read_chunk
from palimpsest.agent.profiles import Profile
from palimpsest.agent.tools.base import ToolContext, TurnState
from palimpsest.agent.tools.registry import BUILTIN, execute
from palimpsest.shared.channels import open_channel
from palimpsest.shared.ollama import OllamaClient
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import agent_pb2_grpc, session_store_pb2_grpc
from palimpsest.v1 import session_store_pb2 as store_pb
from palimpsest.v1.session_store_pb2_grpc import SessionStoreStub
from tests.conftest import _start_store, agent_settings, bearer
from tests.helpers.calls import END, expect_status, file_bytes, full, inline, new_session, png_bytes, put_file, run
from tests.helpers.event_sinks import drained, recording_sink
from tests.helpers.waiting import until

# Each test starts from the simulator's deterministic echo.
pytestmark = pytest.mark.usefixtures("fresh_sim")


def last_user_message(ollama_sim) -> dict:
    return [m for m in ollama_sim.bodies()[-1]["messages"] if m["role"] == "user"][-1]


# -- a turn's files ----------------------------------------------------------------------------
async def test_inline_files_start_a_session_and_the_model_is_told_where_they_are(agent, store, ollama_sim):
    ollama_sim.script(Reply(text="I see two files."))
    events = await run(
        agent,
        "summarize these",
        inline_attachments=[inline("notes.txt", b"buy milk\n"), inline("data.csv", b"a,b\n1,2\n")],
    )
    session_id = events[0].session_id
    assert events[-1].stream_end.reason == END.STREAM_END_REASON_COMPLETED
    assert await file_bytes(store, session_id, "notes.txt") == b"buy milk\n"
    assert await file_bytes(store, session_id, "data.csv") == b"a,b\n1,2\n"

    told = last_user_message(ollama_sim)["content"]
    assert told == "summarize these\n\n[Files for this message, in the workspace:\n- notes.txt\n- data.csv]"
    session = await full(store, session_id)
    shown = session.messages[0]
    assert shown.content == "summarize these" and list(shown.files) == ["notes.txt", "data.csv"]
    assert session.untrusted_ingested


async def test_files_uploaded_first_are_named_by_their_stored_names(agent, store, ollama_sim, profile):
    session = await new_session(store, "small")
    first = await put_file(store, session.id, "report.pdf", b"%PDF-1.4 one")
    second = await put_file(store, session.id, "report.pdf", b"%PDF-1.4 two")  # a taken name gets a number
    assert (first, second) == ("report.pdf", "report_1.pdf")
    ollama_sim.script(Reply(text="compared"))
    events = await run(agent, "compare them", session_id=session.id, attachments=[second, first, second])
    assert events[-1].stream_end.reason == END.STREAM_END_REASON_COMPLETED
    told = last_user_message(ollama_sim)["content"]
    assert told.endswith("- report_1.pdf\n- report.pdf]")


async def test_a_turn_of_files_alone_needs_no_text(agent, store, ollama_sim):
    ollama_sim.script(Reply(text="got it"))
    events = await run(agent, "", inline_attachments=[inline("todo.md", b"# todo\n")])
    assert events[-1].stream_end.reason == END.STREAM_END_REASON_COMPLETED
    assert last_user_message(ollama_sim)["content"].startswith("[Files for this message, in the workspace:\n- todo.md]")


async def test_a_named_file_that_is_not_there_is_not_found_and_nothing_is_said(agent, store, ollama_sim):
    session = await new_session(store, "small")
    await put_file(store, session.id, "a.txt", b"a")
    details = await expect_status(
        run(agent, "read", session_id=session.id, attachments=["a.txt", "b.txt"]),
        grpc.StatusCode.NOT_FOUND,
        "attachments[1]",
        "'b.txt'",
        "PutFile",
    )
    assert "ListFiles" in details
    assert not (await full(store, session.id)).messages and not ollama_sim.bodies()


@pytest.mark.parametrize(
    "kw, code, words",
    [
        (
            {"hidden": True, "inline_attachments": [inline("a.txt", b"a")]},
            "INVALID_ARGUMENT",
            ["attachments", "hidden"],
        ),
        ({"attachments": ["a.txt"]}, "INVALID_ARGUMENT", ["attachments", "new session", "inline_attachments"]),
        (
            {"inline_attachments": [inline(f"f{i}.txt", b"x") for i in range(MAX_ATTACHMENTS + 1)]},
            "RESOURCE_EXHAUSTED",
            ["attachments", f"at most {MAX_ATTACHMENTS}"],
        ),
        (
            {"inline_attachments": [inline("big.txt", b"x" * (INLINE_MAX_BYTES + 1))]},
            "RESOURCE_EXHAUSTED",
            ["inline_attachments", "16 MB", "PutFile"],
        ),
        (
            {"inline_attachments": [inline("ok.txt", b"x"), inline("../../etc/passwd", b"x")]},
            "INVALID_ARGUMENT",
            ["inline_attachments[1].filename", "folder"],
        ),
        (
            {"inline_attachments": [inline("C:\\Users\\me\\a.txt", b"x")]},
            "INVALID_ARGUMENT",
            ["inline_attachments[0].filename", "folder"],
        ),
        ({"inline_attachments": [inline(".env", b"SECRET=1")]}, "INVALID_ARGUMENT", ["filename", "hidden"]),
        ({"inline_attachments": [inline("..", b"x")]}, "INVALID_ARGUMENT", ["filename"]),
        (
            {"inline_attachments": [inline("", b"x")]},
            "INVALID_ARGUMENT",
            ["inline_attachments[0].filename", "required"],
        ),
        ({"inline_attachments": [inline("a\x07b.txt", b"x")]}, "INVALID_ARGUMENT", ["filename", "control"]),
        (
            {"inline_attachments": [inline("x.py\u200b", b"print(1)")]},
            "INVALID_ARGUMENT",
            ["inline_attachments[0].filename", "U+200B", "ZERO WIDTH SPACE"],
        ),
        (
            {"inline_attachments": [inline("ok.txt", b"x"), inline("invoice\u202efdp.exe", b"x")]},
            "INVALID_ARGUMENT",
            ["inline_attachments[1].filename", "U+202E"],
        ),
        (
            {"inline_attachments": [inline("notes.txt.", b"x")]},
            "INVALID_ARGUMENT",
            ["inline_attachments[0].filename", "ends with a dot"],
        ),
        ({"inline_attachments": [inline("x" * 252 + ".txt", b"x")]}, "INVALID_ARGUMENT", ["filename", "255"]),
        (
            {"inline_attachments": [inline("deploy.sh", b"echo hi")]},
            "INVALID_ARGUMENT",
            ["inline_attachments[0].filename", "no programs", "'deploy.sh.txt'"],
        ),
        (
            {"inline_attachments": [inline("notes.txt", b"#!/bin/sh\nrm -rf /")]},
            "INVALID_ARGUMENT",
            ["inline_attachments[0].data", "no programs"],
        ),
        ({"inline_attachments": [inline("a.txt", b"\x7fELF\x02\x01")]}, "INVALID_ARGUMENT", ["data", "executable"]),
        ({"inline_attachments": [inline("app.js", b"alert(1)")]}, "INVALID_ARGUMENT", ["filename", "no programs"]),
        (
            {"inline_attachments": [inline("m.dat", b"\x00asm\x01\x00\x00\x00")]},
            "INVALID_ARGUMENT",
            ["inline_attachments[0].data", "WebAssembly"],
        ),
    ],
)
async def test_the_upload_policy_refuses_naming_the_field_before_anything_is_made(
    agent, store, ollama_sim, kw, code, words
):
    await expect_status(run(agent, "look", **kw), getattr(grpc.StatusCode, code), *words)
    assert not ollama_sim.bodies()  # no turn ran (and no session was made: the check comes first)


@pytest.mark.parametrize("name", ["a/b.txt", "../a.txt", ".hidden", "a  b.txt", "x\x00y"])
async def test_a_named_file_must_be_a_stored_name(agent, store, name):
    session = await new_session(store, "small")
    await expect_status(
        run(agent, "read", session_id=session.id, attachments=[name]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "attachments[0]",
    )


# -- a store that refuses a file ----------------------------------------------------------------
@pytest.fixture(scope="module")
async def tight(base_settings, database_url, compressor_server, ollama_sim, profiles_file):
    """A store that keeps files of at most 1,000 bytes, with auth on, and an Agent in front of it."""
    from palimpsest.agent.app import start_agent

    settings = replace(base_settings, files_max_bytes=1000, auth_enabled=True)
    store_server = await _start_store(settings, database_url)
    agent_server = await start_agent(
        replace(
            agent_settings(settings, store_server, compressor_server, ollama_sim, profiles_file), auth_enabled=True
        ),
        port=0,
    )
    async with (
        grpc.aio.insecure_channel(agent_server.address) as agent_channel,
        grpc.aio.insecure_channel(store_server.address) as store_channel,
    ):
        yield (agent_pb2_grpc.AgentStub(agent_channel), session_store_pb2_grpc.SessionStoreStub(store_channel))
    await agent_server.stop(0)
    await store_server.stop(0)


async def test_a_session_made_for_a_turn_whose_file_the_store_refuses_is_removed_again(tight, ollama_sim):
    agent, store = tight
    me = bearer(f"files-{uuid.uuid4().hex[:8]}")
    call = agent.RunStream(
        pb.RunStreamRequest(text="read", inline_attachments=[inline("big.txt", b"x" * 2000)]), metadata=me
    )
    await expect_status(_drain(call), grpc.StatusCode.RESOURCE_EXHAUSTED, "1000 bytes")
    listed = await store.ListSessions(store_pb.ListSessionsRequest(page_size=10), metadata=me)
    assert listed.total == 0 and not ollama_sim.bodies()


async def _drain(call) -> None:
    async for _ in call:
        pass


# -- share_file ------------------------------------------------------------------------------------


@pytest.fixture
def workspace(tmp_path):
    root = tmp_path / "workspace"
    root.mkdir()
    return root


@pytest.fixture
async def tool_ctx(store_server, base_settings, ollama_sim, workspace, store):
    """A ToolContext as a turn builds one: a new session, the store as the Agent reaches it, and
    share_file allowed to read `workspace` only, up to 64 KB."""
    settings = replace(base_settings, share_file_roots=(workspace,), share_file_max_bytes=64 * 1024)
    session = await new_session(store, "small")
    async with open_channel(store_server.address, settings, service="SessionStore") as channel:
        client = OllamaClient(ollama_sim.url)
        yield ToolContext(
            session_id=session.id,
            store=SessionStoreStub(channel),
            ollama=client,
            profile=Profile(),
            settings=settings,
            events=recording_sink(session.id),
            state=TurnState(),
            window=8192,
        )
        await client.aclose()


async def tool(tool_name: str, ctx: ToolContext, **args):
    return await execute(BUILTIN[tool_name], args, ctx)


def events_of(ctx: ToolContext) -> list[pb.AgentEvent]:
    return drained(ctx.events)


async def test_share_file_copies_the_file_and_gives_its_link(tool_ctx, store, workspace):
    (workspace / "out").mkdir()
    source = workspace / "out" / "chart report.csv"
    source.write_bytes(b"month,sales\njan,3\n" * 100)
    result = await tool("share_file", tool_ctx, source=str(source))
    link = f"palimpsest://sessions/{tool_ctx.session_id}/files/chart%20report.csv"
    assert not result.is_error, result.content
    assert link in result.content and result.files == ["chart report.csv"] and not result.untrusted
    assert await file_bytes(store, tool_ctx.session_id, "chart report.csv") == source.read_bytes()
    [event] = events_of(tool_ctx)
    assert event.file_shared.link == link and event.file_shared.size == source.stat().st_size
    assert event.file_shared.content_type == "text/csv" and not event.file_shared.viewer

    renamed = await tool("share_file", tool_ctx, source=str(source), name="sales.csv")
    assert renamed.files == ["sales.csv"]


async def test_share_file_refuses_what_an_attacker_would_ask_for(tool_ctx, store, workspace, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the key")
    (workspace / "link.txt").symlink_to(secret)
    (workspace / "inner.txt").write_text("fine")
    (workspace / "inner_link.txt").symlink_to(workspace / "inner.txt")
    (workspace / "linked_dir").symlink_to(tmp_path)
    os.link(secret, workspace / "hard.txt")
    os.mkfifo(workspace / "pipe")
    (workspace / "big.bin").write_bytes(b"\0" * (64 * 1024 + 1))
    (workspace / "sub").mkdir()
    refusals = {
        "notes.txt": "not an absolute path",
        f"{workspace}/../secret.txt": "'..'",
        str(secret): "outside the folders",
        str(workspace / "link.txt"): "resolves to",
        str(workspace / "inner_link.txt"): "symbolic link",
        str(workspace / "linked_dir" / "secret.txt"): "outside the folders",
        str(workspace / "hard.txt"): "hard links",
        str(workspace / "pipe"): "not a regular file",
        "/dev/zero": "outside the folders",
        "/etc/passwd": "outside the folders",
        str(workspace / "big.bin"): "PALIMPSEST_SHARE_FILE_MAX_MB",
        str(workspace / "sub"): "is a folder",
        str(workspace / "nope.txt"): "does not exist",
    }
    for source, words in refusals.items():
        result = await tool("share_file", tool_ctx, source=source)
        assert result.is_error and words in result.content, (source, result.content)
    assert not (await store.ListFiles(store_pb.ListFilesRequest(session_id=tool_ctx.session_id))).files
    assert not events_of(tool_ctx)


async def test_share_file_keeps_the_stores_rules(tool_ctx, workspace):
    (workspace / "run.sh").write_text("echo hi\n")
    result = await tool("share_file", tool_ctx, source=str(workspace / "run.sh"))
    assert result.is_error and "no programs or scripts" in result.content


def test_a_file_that_changes_while_it_is_read_is_refused(workspace):
    path = workspace / "growing.log"
    path.write_bytes(b"x" * 10)
    opened = open_shareable(str(path), [workspace], 1000)
    try:
        with path.open("ab") as f:
            f.write(b"more")
        with pytest.raises(Refused, match="grew"):
            read_chunk(opened, 0)
    finally:
        opened.close()
    opened = open_shareable(str(path), [workspace], 1000)
    try:
        os.truncate(path, 3)
        assert read_chunk(opened, 0) == b"xxx"
        with pytest.raises(Refused, match="changed"):
            read_chunk(opened, 3)
    finally:
        opened.close()


class ChangingUnderway:
    """The store as the tool reaches it, but the file being shared grows after the upload's first
    piece went out: a real change of the real file in the middle of a real PutFile."""

    def __init__(self, store: SessionStoreStub, path) -> None:
        self._store, self._path = store, path

    def __getattr__(self, name):
        return getattr(self._store, name)

    def PutFile(self, requests, **call):
        async def changing():
            async for part in requests:
                yield part
                if part.HasField("chunk"):
                    with self._path.open("ab") as f:
                        f.write(b"appended while copying")

        return self._store.PutFile(changing(), **call)


async def test_a_file_changing_during_the_upload_leaves_nothing_in_the_session(
    tool_ctx, store, workspace, base_settings
):
    path = workspace / "live.log"
    path.write_bytes(b"x" * (3 << 20))  # three pieces of a megabyte
    ctx = replace(
        tool_ctx,
        store=ChangingUnderway(tool_ctx.store, path),
        settings=replace(tool_ctx.settings, share_file_max_bytes=8 << 20),
    )
    result = await tool("share_file", ctx, source=str(path))
    assert result.is_error and "while it was being copied" in result.content, result.content
    assert not (await store.ListFiles(store_pb.ListFilesRequest(session_id=ctx.session_id))).files
    folder = base_settings.files_root / ctx.session_id
    # The store drops its partial copy when it sees the call cancelled, a moment after the Agent does.
    assert await until(lambda: not folder.exists() or not any(p.name.startswith(".upload-") for p in folder.iterdir()))


# -- content_publish ---------------------------------------------------------------------------------


TS_STREAM = (b"\x47\x40\x00\x10" + b"\xff" * 184) * 3  # three MPEG-TS packets, sync byte each 188


@pytest.mark.parametrize(
    "name, data, content_type, shown_as",
    [
        ("page.html", b"<!DOCTYPE html><html><body>hi</body></html>", "text/html", "html"),
        ("drawing.svg", b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg"/>', "image/svg+xml", "svg"),
        ("paper.pdf", b"%PDF-1.7\n...", "application/pdf", "pdf"),
        ("picture.txt", png_bytes(), "image/png", "image"),  # a PNG saved as .txt still opens as an image
        ("main.ts", b"export const answer: number = 42;\n", "text/plain", "text"),  # TypeScript, not a stream
        ("clip.ts", TS_STREAM, "video/mp2t", "video"),
        ("part.stl", b"solid cube\nfacet normal 0 0 1\nendsolid cube\n", "model/stl", "model"),
        ("scene.glb", b"glTF\x02\x00\x00\x00" + b"\x00" * 16, "model/gltf-binary", "model"),
        ("song.mp3", b"ID3\x04\x00" + b"\x00" * 20, "audio/mpeg", "audio"),
        ("notes.md", b"# Notes\n", "text/markdown", "text"),
    ],
)
async def test_content_publish_registers_a_session_file_with_its_viewer(
    tool_ctx, store, name, data, content_type, shown_as
):
    stored = await put_file(store, tool_ctx.session_id, name, data)
    result = await tool("content_publish", tool_ctx, path=f"session_files/{tool_ctx.session_id}/{stored}", title="Look")
    assert not result.is_error, result.content
    assert result.files == [stored] and not result.untrusted
    [event] = events_of(tool_ctx)
    assert (event.file_shared.content_type, event.file_shared.viewer) == (content_type, shown_as)
    assert event.file_shared.sandbox == (shown_as in ("html", "svg"))
    assert event.file_shared.title == "Look" and event.file_shared.link.endswith(f"/files/{stored}")


@pytest.mark.parametrize(
    "name, data, shown_as",
    [
        ("page.html", b"<!DOCTYPE html><script>fetch('/steal?'+document.cookie)</script>", "html"),
        ("clean.html", b"<!DOCTYPE html><p>no script here</p>", "html"),
        ("drawing.svg", b'<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"/>', "svg"),
    ],
)
async def test_html_and_svg_are_published_for_a_sandbox_only(tool_ctx, store, name, data, shown_as):
    """Any page or drawing can hold script, and a scan would miss some: each is shown sandboxed."""
    stored = await put_file(store, tool_ctx.session_id, name, data)
    result = await tool("content_publish", tool_ctx, path=stored)
    [event] = events_of(tool_ctx)
    assert (event.file_shared.viewer, event.file_shared.sandbox) == (shown_as, True)
    assert result.metadata["sandbox"] is True and "in a sandbox" in result.content


async def test_content_publish_refuses_what_it_cannot_show_or_cannot_find(tool_ctx, store):
    await put_file(store, tool_ctx.session_id, "blob.dat", b"\x00\x01\x02\x03")
    binary = await tool("content_publish", tool_ctx, path="blob.dat")
    assert binary.is_error and "no inline view" in binary.content and "palimpsest://" in binary.content
    missing = await tool("content_publish", tool_ctx, path="nope.html")
    assert missing.is_error and "no file 'nope.html'" in missing.content and "blob.dat" in missing.content
    other = await tool("content_publish", tool_ctx, path=f"session_files/{uuid.uuid4()}/blob.dat")
    assert other.is_error and "another session" in other.content
    escape = await tool("content_publish", tool_ctx, path="../../etc/passwd")
    assert escape.is_error and "leads out of the workspace" in escape.content
    assert not events_of(tool_ctx)


# -- a simulated model using the tools through the Agent ------------------------------------------------
@pytest.fixture(scope="module")
async def files_agent(base_settings, store_server, compressor_server, ollama_sim, tmp_path_factory):
    """An Agent whose default profile offers share_file and content_publish, sharing from a
    workspace folder of its own."""
    from palimpsest.agent.app import start_agent

    root = tmp_path_factory.mktemp("agent-workspace")
    profiles = tmp_path_factory.mktemp("files-profiles") / "profiles.json"
    profiles.write_text(
        json.dumps(
            {
                "default": "files",
                "profiles": [
                    {
                        "id": "files",
                        "model": "qwen3.6",
                        "context_window": 8192,
                        "max_iterations": 4,
                        "think_enabled": False,
                        "tools": {"agent": ["share_file", "content_publish"]},
                    }
                ],
            }
        )
    )
    settings = replace(
        agent_settings(base_settings, store_server, compressor_server, ollama_sim, str(profiles)),
        share_file_roots=(root,),
    )
    running = await start_agent(settings, port=0)
    async with grpc.aio.insecure_channel(running.address) as channel:
        yield agent_pb2_grpc.AgentStub(channel), root
    await running.stop(0)


async def test_a_model_shares_a_file_then_publishes_it_and_the_user_gets_both(files_agent, store, ollama_sim):
    agent, root = files_agent
    report = root / "report.html"
    report.write_text("<!doctype html><title>Q3</title><p>revenue up</p>")
    ollama_sim.script(
        Reply(tool_calls=[("share_file", {"source": str(report)})]),
        Reply(tool_calls=[("content_publish", {"path": "report.html", "title": "Q3 report"})]),
        Reply(text="Here is the report."),
    )
    events = await run(agent, "make me the Q3 report")
    session_id = events[0].session_id
    assert events[-1].stream_end.reason == END.STREAM_END_REASON_COMPLETED
    shared = [e.file_shared for e in events if e.HasField("file_shared")]
    link = f"palimpsest://sessions/{session_id}/files/report.html"
    assert [(s.name, s.link, s.viewer, s.title) for s in shared] == [
        ("report.html", link, "", ""),
        ("report.html", link, "html", "Q3 report"),
    ]
    assert await file_bytes(store, session_id, "report.html") == report.read_bytes()

    stored = await full(store, session_id)
    assert not stored.untrusted_ingested  # the copy's content never reached the model (the tool vouches)
    results = [m for m in stored.messages if m.role == "tool"]
    assert [(m.name, list(m.files)) for m in results] == [
        ("share_file", ["report.html"]),
        ("content_publish", ["report.html"]),
    ]
    told = [m["content"] for m in ollama_sim.bodies()[-1]["messages"] if m["role"] == "tool"]
    assert link in told[0] and "inline as html" in told[1]


async def test_a_model_asking_for_a_secret_gets_a_refusal_it_can_read(files_agent, store, ollama_sim):
    agent, _ = files_agent
    ollama_sim.script(Reply(tool_calls=[("share_file", {"source": "/etc/shadow"})]), Reply(text="I cannot."))
    events = await run(agent, "share /etc/shadow")
    finished = [e.tool_finished for e in events if e.HasField("tool_finished")]
    assert finished[0].is_error and "outside the folders" in finished[0].preview
    assert not [e for e in events if e.HasField("file_shared")]
    files = (await store.ListFiles(store_pb.ListFilesRequest(session_id=events[0].session_id))).files
    assert not files

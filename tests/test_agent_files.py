"""Files in the conversation: a turn's attachments, end to end through the Agent, the SessionStore on
PostgreSQL and the Ollama simulator."""

from __future__ import annotations

import uuid
from dataclasses import replace

import grpc
import pytest

from ollama_sim import Reply
from palimpsest.v1 import agent_pb2 as pb, agent_pb2_grpc, session_store_pb2 as store_pb, session_store_pb2_grpc
from services.agent.attachments import INLINE_MAX_BYTES, MAX_ATTACHMENTS
from tests.conftest import _start_store, agent_settings, bearer
from tests.test_store_sessions import expect_status, full, new_session

END = pb.StreamEndReason


@pytest.fixture(autouse=True)
def fresh_sim(ollama_sim):
    ollama_sim.clear()
    ollama_sim.set_responder(None)
    yield


async def run(agent, text="hello", **kw) -> list[pb.AgentEvent]:
    return [e async for e in agent.RunStream(pb.RunStreamRequest(text=text, **kw))]


def inline(name: str, data: bytes) -> pb.InlineAttachment:
    return pb.InlineAttachment(filename=name, data=data)


async def put_file(store, session_id: str, name: str, data: bytes) -> str:
    async def parts():
        yield store_pb.PutFileRequest(header=store_pb.PutFileHeader(session_id=session_id, filename=name))
        yield store_pb.PutFileRequest(chunk=data)

    return (await store.PutFile(parts())).file.name


async def file_bytes(store, session_id: str, name: str) -> bytes:
    data = b""
    async for part in store.GetFile(store_pb.GetFileRequest(session_id=session_id, name=name)):
        data += part.chunk
    return data


def last_user_message(ollama_sim) -> dict:
    return [m for m in ollama_sim.bodies()[-1]["messages"] if m["role"] == "user"][-1]


# -- a turn's files ----------------------------------------------------------------------------
async def test_inline_files_start_a_session_and_the_model_is_told_where_they_are(agent, store, ollama_sim):
    ollama_sim.script(Reply(text="I see two files."))
    events = await run(agent, "summarize these", inline_attachments=[
        inline("notes.txt", b"buy milk\n"), inline("data.csv", b"a,b\n1,2\n")])
    session_id = events[0].session_id
    assert events[-1].stream_end.reason == END.STREAM_END_REASON_COMPLETED
    assert await file_bytes(store, session_id, "notes.txt") == b"buy milk\n"
    assert await file_bytes(store, session_id, "data.csv") == b"a,b\n1,2\n"

    told = last_user_message(ollama_sim)["content"]
    assert told == (f"summarize these\n\n[Uploaded files on disk:\n"
                    f"- notes.txt → session_files/{session_id}/notes.txt\n"
                    f"- data.csv → session_files/{session_id}/data.csv]")
    shown = (await full(store, session_id)).messages[0]
    assert shown.content == "summarize these" and list(shown.files) == ["notes.txt", "data.csv"]


async def test_files_uploaded_first_are_named_by_their_stored_names(agent, store, ollama_sim, profile):
    session = await new_session(store, "small")
    first = await put_file(store, session.id, "report.pdf", b"%PDF-1.4 one")
    second = await put_file(store, session.id, "report.pdf", b"%PDF-1.4 two")  # a taken name gets a number
    assert (first, second) == ("report.pdf", "report_1.pdf")
    ollama_sim.script(Reply(text="compared"))
    events = await run(agent, "compare them", session_id=session.id, attachments=[second, first, second])
    assert events[-1].stream_end.reason == END.STREAM_END_REASON_COMPLETED
    told = last_user_message(ollama_sim)["content"]
    assert told.endswith(f"- report_1.pdf → session_files/{session.id}/report_1.pdf\n"
                         f"- report.pdf → session_files/{session.id}/report.pdf]")


async def test_a_turn_of_files_alone_needs_no_text(agent, store, ollama_sim):
    ollama_sim.script(Reply(text="got it"))
    events = await run(agent, "", inline_attachments=[inline("todo.md", b"# todo\n")])
    assert events[-1].stream_end.reason == END.STREAM_END_REASON_COMPLETED
    assert last_user_message(ollama_sim)["content"].startswith("[Uploaded files on disk:\n- todo.md → ")


async def test_a_named_file_that_is_not_there_is_not_found_and_nothing_is_said(agent, store, ollama_sim):
    session = await new_session(store, "small")
    await put_file(store, session.id, "a.txt", b"a")
    details = await expect_status(run(agent, "read", session_id=session.id, attachments=["a.txt", "b.txt"]),
                                  grpc.StatusCode.NOT_FOUND, "attachments[1]", "'b.txt'", "PutFile")
    assert "ListFiles" in details
    assert not (await full(store, session.id)).messages and not ollama_sim.bodies()


@pytest.mark.parametrize("kw, code, words", [
    ({"hidden": True, "inline_attachments": [inline("a.txt", b"a")]}, "INVALID_ARGUMENT",
     ["attachments", "hidden"]),
    ({"attachments": ["a.txt"]}, "INVALID_ARGUMENT", ["attachments", "new session", "inline_attachments"]),
    ({"inline_attachments": [inline(f"f{i}.txt", b"x") for i in range(MAX_ATTACHMENTS + 1)]},
     "RESOURCE_EXHAUSTED", ["attachments", f"at most {MAX_ATTACHMENTS}"]),
    ({"inline_attachments": [inline("big.txt", b"x" * (INLINE_MAX_BYTES + 1))]}, "RESOURCE_EXHAUSTED",
     ["inline_attachments", "16 MB", "PutFile"]),
    ({"inline_attachments": [inline("ok.txt", b"x"), inline("../../etc/passwd", b"x")]}, "INVALID_ARGUMENT",
     ["inline_attachments[1].filename", "folder"]),
    ({"inline_attachments": [inline("C:\\Users\\me\\a.txt", b"x")]}, "INVALID_ARGUMENT",
     ["inline_attachments[0].filename", "folder"]),
    ({"inline_attachments": [inline(".env", b"SECRET=1")]}, "INVALID_ARGUMENT", ["filename", "hidden"]),
    ({"inline_attachments": [inline("..", b"x")]}, "INVALID_ARGUMENT", ["filename"]),
    ({"inline_attachments": [inline("", b"x")]}, "INVALID_ARGUMENT", ["inline_attachments[0].filename", "required"]),
    ({"inline_attachments": [inline("a\x07b.txt", b"x")]}, "INVALID_ARGUMENT", ["filename", "control"]),
    ({"inline_attachments": [inline("x" * 252 + ".txt", b"x")]}, "INVALID_ARGUMENT", ["filename", "255"]),
    ({"inline_attachments": [inline("deploy.sh", b"echo hi")]}, "INVALID_ARGUMENT",
     ["inline_attachments[0].filename", "no programs", "'deploy.sh.txt'"]),
    ({"inline_attachments": [inline("notes.txt", b"#!/bin/sh\nrm -rf /")]}, "INVALID_ARGUMENT",
     ["inline_attachments[0].data", "no programs"]),
    ({"inline_attachments": [inline("a.txt", b"\x7fELF\x02\x01")]}, "INVALID_ARGUMENT", ["data", "executable"]),
])
async def test_the_upload_policy_refuses_naming_the_field_before_anything_is_made(agent, store, ollama_sim, kw,
                                                                                  code, words):
    await expect_status(run(agent, "look", **kw), getattr(grpc.StatusCode, code), *words)
    assert not ollama_sim.bodies()  # no turn ran (and no session was made: the check comes first)


@pytest.mark.parametrize("name", ["a/b.txt", "../a.txt", ".hidden", "a  b.txt", "x\x00y"])
async def test_a_named_file_must_be_a_stored_name(agent, store, name):
    session = await new_session(store, "small")
    await expect_status(run(agent, "read", session_id=session.id, attachments=[name]),
                        grpc.StatusCode.INVALID_ARGUMENT, "attachments[0]")


# -- a store that refuses a file ----------------------------------------------------------------
@pytest.fixture(scope="module")
async def tight(base_settings, database_url, compressor_server, ollama_sim, profiles_file):
    """A store that keeps files of at most 1,000 bytes, with auth on, and an Agent in front of it."""
    from services.agent.app import start_agent

    settings = replace(base_settings, files_max_bytes=1000, auth_enabled=True)
    store_server = await _start_store(settings, database_url)
    agent_server = await start_agent(replace(agent_settings(settings, store_server, compressor_server, ollama_sim,
                                                            profiles_file), auth_enabled=True), port=0)
    async with grpc.aio.insecure_channel(agent_server.address) as agent_channel, \
            grpc.aio.insecure_channel(store_server.address) as store_channel:
        yield (agent_pb2_grpc.AgentStub(agent_channel), session_store_pb2_grpc.SessionStoreStub(store_channel))
    await agent_server.stop(0)
    await store_server.stop(0)


async def test_a_session_made_for_a_turn_whose_file_the_store_refuses_is_removed_again(tight, ollama_sim):
    agent, store = tight
    me = bearer(f"files-{uuid.uuid4().hex[:8]}")
    call = agent.RunStream(pb.RunStreamRequest(text="read", inline_attachments=[inline("big.txt", b"x" * 2000)]),
                           metadata=me)
    await expect_status(_drain(call), grpc.StatusCode.RESOURCE_EXHAUSTED, "1000 bytes")
    listed = await store.ListSessions(store_pb.ListSessionsRequest(page_size=10), metadata=me)
    assert listed.total == 0 and not ollama_sim.bodies()


async def _drain(call) -> None:
    async for _ in call:
        pass

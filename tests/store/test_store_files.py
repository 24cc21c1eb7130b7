"""Session files through the SessionStore: streamed upload and download, caps, images, hot window."""

from __future__ import annotations

import io
from dataclasses import replace

import grpc
import pytest
from PIL import Image

from palimpsest.v1 import common_pb2, session_store_pb2_grpc
from palimpsest.v1 import session_store_pb2 as pb
from tests.helpers.calls import conversation, expect_status, full, new_session

Message = common_pb2.Message


@pytest.fixture(scope="module")
async def small_store(base_settings, database_url, tmp_path_factory):
    """A store with tiny caps, to reach its limits cheaply."""
    from palimpsest.store.app import start_store

    settings = replace(
        base_settings, files_root=tmp_path_factory.mktemp("small-files"), files_max_bytes=1000, hot_window_messages=10
    )
    running = await start_store(settings, port=0, dsn=database_url)
    async with grpc.aio.insecure_channel(running.address) as channel:
        yield session_store_pb2_grpc.SessionStoreStub(channel)
    await running.stop(0)


def png(size=(8, 8), color=(255, 0, 0, 128)) -> bytes:
    out = io.BytesIO()
    Image.new("RGBA", size, color).save(out, "PNG")
    return out.getvalue()


def jpeg() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (0, 0, 255)).save(out, "JPEG")
    return out.getvalue()


async def put(store, session_id, data: bytes, filename="", kind=pb.FILE_KIND_UNSPECIFIED, chunk=300):
    async def parts():
        yield pb.PutFileRequest(header=pb.PutFileHeader(session_id=session_id, filename=filename, kind=kind))
        for i in range(0, len(data), chunk):
            yield pb.PutFileRequest(chunk=data[i : i + chunk])

    return await store.PutFile(parts())


async def download(store, session_id, name) -> tuple[common_pb2.FileInfo, bytes]:
    info, data = None, bytearray()
    async for part in store.GetFile(pb.GetFileRequest(session_id=session_id, name=name)):
        if part.HasField("info"):
            info = part.info
        else:
            data.extend(part.chunk)
    return info, bytes(data)


async def test_upload_download_round_trip_with_duplicate_names(store, profile):
    s = await new_session(store, profile)
    body = b"line\n" * 50_000
    first = (await put(store, s.id, body, "report.txt", chunk=64 * 1024)).file
    second = (await put(store, s.id, b"v2", "report.txt")).file
    assert first.name == "report.txt" and second.name != "report.txt" and second.name.endswith(".txt")
    info, data = await download(store, s.id, "report.txt")
    assert data == body and info.size == len(body)
    listed = await store.ListFiles(pb.ListFilesRequest(session_id=s.id))
    assert sorted(f.name for f in listed.files) == sorted([first.name, second.name])


async def test_names_never_escape_the_session_folder(store, profile):
    s = await new_session(store, profile)
    stored = (await put(store, s.id, b"data", "../../etc/passwd")).file
    assert "/" not in stored.name and ".." not in stored.name
    assert stored.path == stored.name  # relative to the session's folder: the host's layout stays private


async def test_executables_are_rejected_by_extension_and_content(store, profile):
    s = await new_session(store, profile)
    await expect_status(put(store, s.id, b"echo hi", "run.sh"), grpc.StatusCode.INVALID_ARGUMENT)
    await expect_status(
        put(store, s.id, b"\x7fELF\x02\x01\x01" + b"\0" * 100, "notes.txt"), grpc.StatusCode.INVALID_ARGUMENT
    )
    await expect_status(put(store, s.id, b"#!/bin/sh\nrm -rf /", "readme.txt"), grpc.StatusCode.INVALID_ARGUMENT)
    assert not (await store.ListFiles(pb.ListFilesRequest(session_id=s.id))).files


@pytest.mark.parametrize(
    "name, data, field",
    [
        ("app.js", b"alert(1)", "filename"),
        ("x.cgi", b"echo", "filename"),
        ("a.pif", b"MZ", "filename"),
        ("a.msc", b"<?xml?>", "filename"),
        ("go.desktop", b"[Desktop Entry]\nExec=sh", "filename"),
        ("m.wasm", b"\x00asm", "filename"),
        ("doc.ps", b"%!PS", "filename"),
        ("module.dat", b"\x00asm\x01\x00\x00\x00" + b"\x00" * 40, "content"),
        ("page.txt", b"%!PS-Adobe-3.0\n/Helvetica findfont", "content"),
        ("link.bin.txt", b"L\x00\x00\x00\x01\x14\x02\x00" + b"\x00" * 40, "content"),
    ],
)
async def test_scripts_and_programs_of_every_platform_are_refused(store, profile, name, data, field):
    s = await new_session(store, profile)
    await expect_status(put(store, s.id, data, name), grpc.StatusCode.INVALID_ARGUMENT, field, "no programs")
    assert not (await store.ListFiles(pb.ListFilesRequest(session_id=s.id))).files


@pytest.mark.parametrize(
    "name",
    [
        "x.py\u200b",  # shows as x.py; was stored as x.py_
        "report\u202efdp.exe",  # a right-to-left override: shows as report‮exe.pdf
        "\ufeffnotes.txt",
        "a\u00a0b.txt",
        "line\u2028two.txt",
        "tab\there.txt",
        "notes.txt.",
        "notes.txt ",
        " notes.txt",
    ],
)
async def test_a_name_that_does_not_show_what_it_is_is_refused_not_renamed(store, profile, name):
    s = await new_session(store, profile)
    await expect_status(put(store, s.id, b"some notes", name), grpc.StatusCode.INVALID_ARGUMENT, "header.filename")
    assert not (await store.ListFiles(pb.ListFilesRequest(session_id=s.id))).files
    assert not (await full(store, s.id)).untrusted_ingested  # nothing was taken in


async def test_size_cap_is_enforced_while_streaming(small_store, profile):
    s = await new_session(small_store, profile)
    assert (await put(small_store, s.id, b"x" * 1000, "exact.bin.txt")).file.size == 1000
    await expect_status(put(small_store, s.id, b"x" * 1001, "over.txt"), grpc.StatusCode.RESOURCE_EXHAUSTED)
    names = [f.name for f in (await small_store.ListFiles(pb.ListFilesRequest(session_id=s.id))).files]
    assert names == ["exact.bin.txt"]


async def test_pasted_images_are_numbered_typed_by_bytes_and_stored_once(store, profile):
    s = await new_session(store, profile)
    a = await put(store, s.id, png(), "ignored.jpg", kind=pb.FILE_KIND_IMAGE)
    b = await put(store, s.id, jpeg(), kind=pb.FILE_KIND_IMAGE)
    again = await put(store, s.id, png(), kind=pb.FILE_KIND_IMAGE)
    assert (a.file.name, b.file.name) == ("image_1.png", "image_2.jpg")
    assert again.file.name == "image_1.png" and again.deduplicated and not a.deduplicated
    _, data = await download(store, s.id, "image_1.png")
    assert data == png()  # stored exactly as sent: the alpha channel survives
    await expect_status(put(store, s.id, b"not an image", kind=pb.FILE_KIND_IMAGE), grpc.StatusCode.INVALID_ARGUMENT)


async def test_file_calls_check_their_input(store, profile):
    s = await new_session(store, profile)

    async def no_header():
        yield pb.PutFileRequest(chunk=b"x")

    await expect_status(store.PutFile(no_header()), grpc.StatusCode.INVALID_ARGUMENT, "header")
    await expect_status(put(store, s.id, b"x", ""), grpc.StatusCode.INVALID_ARGUMENT, "filename")
    await expect_status(download(store, s.id, "missing.txt"), grpc.StatusCode.NOT_FOUND)


async def test_hot_window_archives_oldest_groups_and_keeps_the_task_hot(small_store, profile):
    s = await new_session(small_store, profile)
    await small_store.AppendMessages(
        pb.AppendMessagesRequest(session_id=s.id, messages=[Message(role="system", content="record"), *conversation(4)])
    )
    await small_store.AppendMessages(pb.AppendMessagesRequest(session_id=s.id, messages=conversation(3)))
    archived = (await small_store.GetArchivedMessages(pb.GetArchivedMessagesRequest(session_id=s.id))).messages
    assert archived, "past the 10-row cap the oldest groups move out"
    seqs = [m.seq for m in archived]
    assert 1 not in seqs and 2 not in seqs  # first system and first user message stay hot
    assert archived[0].role == "assistant" or archived[0].role == "user"
    got = await full(small_store, s.id)
    assert [m.seq for m in got.messages] == list(range(1, 16))  # nothing is dropped
    assert len(got.context) == 15


async def test_file_responses_never_show_the_hosts_layout(store, profile, base_settings):
    s = await new_session(store, profile)
    uploaded = (await put(store, s.id, b"notes", "notes.txt")).file
    pasted = (await put(store, s.id, png(), kind=pb.FILE_KIND_IMAGE)).file
    listed = (await store.ListFiles(pb.ListFilesRequest(session_id=s.id))).files
    fetched, _ = await download(store, s.id, "notes.txt")
    for info in (uploaded, pasted, fetched, *listed):
        assert info.path == info.name and str(base_settings.files_root) not in str(info) and s.id not in str(info)


async def test_messages_from_before_keep_their_files_as_names(store, profile):
    s = await new_session(store, profile)
    old = Message(
        role="user",
        content="look",
        files=[f"/var/lib/palimpsest/session_files/{s.id}/image_1.png", "/home/me/photo.png", "image_2.png"],
    )
    await store.AppendMessages(pb.AppendMessagesRequest(session_id=s.id, messages=[old]))
    # A path into a session folder was the store's; the others are what a client wrote.
    assert list((await full(store, s.id)).messages[0].files) == ["image_1.png", "/home/me/photo.png", "image_2.png"]

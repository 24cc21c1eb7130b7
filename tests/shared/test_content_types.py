"""What a session file is (from its bytes, then its name), how it is shown, named and linked: pure
functions, no server."""

from __future__ import annotations

import pytest

from palimpsest.shared.content_types import content_type, sandboxed, viewer
from palimpsest.shared.file_policy import file_link, parse_file_link, upload_name_problem

TS_PACKETS = (b"\x47\x40\x00\x10" + b"\xff" * 184) * 2


@pytest.mark.parametrize(
    "name, head, expected",
    [
        ("index.html", b"  <!DOCTYPE html>\n<html>", "text/html"),
        ("page.txt", b"<html><body>", "text/html"),  # the bytes decide over the name
        ("logo", b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg">', "image/svg+xml"),
        ("x.svg", b"<!-- a long comment that hides the root element -->", "image/svg+xml"),
        ("main.ts", b"const x: number = 1;\n", "text/plain"),
        ("clip.ts", TS_PACKETS, "video/mp2t"),
        ("clip.bin", TS_PACKETS, "video/mp2t"),
        ("movie.mp4", b"\x00\x00\x00\x18ftypisom", "video/mp4"),
        ("voice.m4a", b"\x00\x00\x00\x18ftypM4A ", "audio/mp4"),
        ("photo.heic", b"\x00\x00\x00\x18ftypheic", "image/heic"),
        ("a.webm", b"\x1a\x45\xdf\xa3\x01", "video/webm"),
        ("a.wav", b"RIFF\x00\x00\x00\x00WAVEfmt ", "audio/wav"),
        ("a.ogg", b"OggS\x00", "audio/ogg"),
        ("a.flac", b"fLaC\x00", "audio/flac"),
        ("part.stl", b"\x00" * 80 + b"\x01\x00\x00\x00", "model/stl"),  # binary STL: by name
        ("part.stl", b"solid part\n", "model/stl"),
        ("scene.gltf", b'{"asset": {"version": "2.0"}}', "model/gltf+json"),
        ("scene.bin", b"glTF\x02\x00\x00\x00", "model/gltf-binary"),
        ("lib.rs", b"fn main() {}\n", "text/plain"),
        ("data.json", b'{"a": 1}', "application/json"),
        ("photo.png", b"plain words", "text/plain"),  # a note under an image's name is text
        ("café.txt", "naïve".encode() + b"\xc3", "text/plain"),  # a head cut inside a character
        ("blob", b"\x00\x01", "application/octet-stream"),
        ("archive.zip", b"PK\x03\x04", "application/zip"),  # binary by its control bytes, typed by name
    ],
)
def test_the_bytes_decide_then_the_name(name, head, expected):
    assert content_type(name, head) == expected


@pytest.mark.parametrize(
    "mime, shown_as",
    [
        ("model/stl", "model"),
        ("model/gltf-binary", "model"),
        ("text/html", "html"),
        ("image/svg+xml", "svg"),
        ("application/pdf", "pdf"),
        ("image/png", "image"),
        ("video/mp2t", "video"),
        ("audio/mpeg", "audio"),
        ("text/x-python", "text"),
        ("application/json", "text"),
        ("application/zip", ""),
        ("application/octet-stream", ""),
    ],
)
def test_each_type_has_its_viewer_or_none(mime, shown_as):
    assert viewer(mime) == shown_as
    assert sandboxed(shown_as) == (mime in ("text/html", "image/svg+xml"))  # what may run script


def test_a_link_names_its_session_and_file_and_reads_back():
    link = file_link("0b7e5c1e-8f6a-4d2b-9c3e-1a2b3c4d5e6f", "Q3 report #2.pdf")
    assert link == "palimpsest://sessions/0b7e5c1e-8f6a-4d2b-9c3e-1a2b3c4d5e6f/files/Q3%20report%20%232.pdf"
    assert parse_file_link(link) == ("0b7e5c1e-8f6a-4d2b-9c3e-1a2b3c4d5e6f", "Q3 report #2.pdf")
    for other in (
        "https://example.com/files/x",
        "palimpsest://sessions/abc",
        "palimpsest://sessions//files/x",
        "palimpsest://sessions/a/b/files/x",
    ):
        assert parse_file_link(other) is None


@pytest.mark.parametrize(
    "name, problem",
    [
        ("report.pdf", ""),
        ("my notes.txt", ""),
        ("x.sh.txt", ""),
        ("", "required"),
        ("a/b.txt", "folder"),
        ("..\\b.txt", "folder"),
        (".env", "hidden"),
        ("..", "hidden"),
        ("a\tb", "control"),
        ("x" * 256, "255 bytes"),
        ("run.PY", "no programs"),
    ],
)
def test_a_turns_file_name_is_a_plain_visible_name(name, problem):
    found = upload_name_problem(name)
    assert (problem in found) if problem else found == ""

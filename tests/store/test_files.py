import hashlib
import io
import os
import uuid
from pathlib import Path

import pytest
from PIL import Image

from palimpsest.shared.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from palimpsest.shared.file_policy import unseen_character_problem
from palimpsest.store.file_disk import numbered_name
from palimpsest.store.files import (
    DIGEST_DIR,
    FileInfo,
    FileStore,
    content_type,
    has_executable_extension,
    has_executable_magic,
    image_extension,
    safe_name,
)

SID = "0b7e5c1e-8f6a-4d2b-9c3e-1a2b3c4d5e6f"
OTHER_SID = "11111111-2222-4333-8444-555555555555"


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return FileStore(tmp_path / "session_files", max_bytes=1000)


def image_bytes(fmt: str, mode: str = "RGB", size=(4, 3), color=(200, 10, 10)) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, color).save(buf, format=fmt)
    return buf.getvalue()


def entries(folder: Path) -> list[str]:
    """What a folder holds besides the kept digests (test_digests_* look at those)."""
    return sorted(e for e in os.listdir(folder) if e != DIGEST_DIR) if folder.exists() else []


# --- safe_name ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("report.pdf", "report.pdf"),
        ("My Report (final).pdf", "My Report _final_.pdf"),
        ("../../etc/passwd", "passwd"),
        ("/etc/shadow", "shadow"),
        ("..\\..\\Windows\\system32\\evil.txt", "evil.txt"),
        ("C:\\Users\\me\\notes.txt", "notes.txt"),
        ("a\x00b.txt", "ab.txt"),
        ("line\nbreak\r.txt", "linebreak.txt"),
        (".bashrc", "bashrc"),
        ("...hidden", "hidden"),
        ("naïve café.txt", "na_ve caf_.txt"),
        ("ｆｕｌｌ.txt", "full.txt"),
        ("a???b***c.txt", "a_b_c.txt"),
        ("two   spaces.txt", "two spaces.txt"),
        ("trailing. ", "trailing"),
        ("dir/", None),
    ],
)
def test_safe_name(raw, expected):
    if expected is None:
        with pytest.raises(InvalidArgument) as excinfo:
            safe_name(raw)
        assert excinfo.value.field == "filename"
    else:
        assert safe_name(raw) == expected


@pytest.mark.parametrize("raw", ["", ".", "..", "../..", "/", "\\", "\x00", " . ", "foo/..", "a/./"])
def test_safe_name_rejects_empty_results(raw):
    with pytest.raises(InvalidArgument) as excinfo:
        safe_name(raw)
    assert excinfo.value.field == "filename"


def test_safe_name_caps_at_255_bytes_keeping_extension():
    out = safe_name("x" * 300 + ".pdf")
    assert len(out.encode()) == 255
    assert out.endswith(".pdf")
    assert safe_name("y" * 255) == "y" * 255
    assert len(safe_name("z" * 256)) == 255


def test_safe_name_absurd_extension_is_not_kept():
    out = safe_name("a." + "e" * 400)
    assert len(out) == 255


@pytest.mark.parametrize(
    "name", ["report.pdf", "My Report (final).pdf", "naïve café.txt", "日本語のメモ.txt", "a b.txt", "v1.2.tar.gz"]
)
def test_names_that_show_what_they_are_pass(name):
    assert unseen_character_problem(name) == ""


@pytest.mark.parametrize(
    "name, words",
    [
        ("x.py\u200b", ["U+200B", "ZERO WIDTH SPACE"]),
        ("a\u200db.txt", ["U+200D"]),
        ("a\u2066b.txt", ["U+2066"]),
        ("a\u00adb.txt", ["U+00AD", "SOFT HYPHEN"]),
        ("a\u3000b.txt", ["U+3000"]),
        ("a\x85b.txt", ["U+0085"]),
        ("trailing.", ["dot"]),
        ("trailing ", ["space"]),
        (" leading", ["space"]),
    ],
)
def test_names_that_do_not_show_what_they_are_say_why(name, words):
    problem = unseen_character_problem(name)
    assert problem and all(word in problem for word in words), problem


def test_numbered_name():
    assert numbered_name("report.pdf", 0) == "report.pdf"
    assert numbered_name("report.pdf", 1) == "report_1.pdf"
    assert numbered_name("README", 2) == "README_2"
    assert numbered_name("archive.tar.gz", 1) == "archive.tar_1.gz"
    long = "x" * 251 + ".pdf"
    assert len(numbered_name(long, 12)) == 255 and numbered_name(long, 12).endswith("_12.pdf")


# --- executables (by extension, by first bytes) / content_type --------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "run.sh",
        "RUN.SH",
        "x.py",
        "x.PyC",
        "setup.exe",
        "a.bat",
        "a.cmd",
        "a.ps1",
        "a.msi",
        "lib.so",
        "lib.dylib",
        "a.dll",
        "a.jar",
        "a.vbs",
        "a.pl",
        "a.rb",
        "a.php",
        "a.bin",
        "a.run",
        "a.AppImage",
        "app.js",
        "a.MJS",
        "x.cgi",
        "a.pif",
        "a.msc",
        "a.desktop",
        "m.wasm",
        "doc.ps",
        "fig.eps",
        "a.chm",
        "a.url",
        "A.class",
    ],
)
def test_executable_by_extension(name):
    assert has_executable_extension(name)


@pytest.mark.parametrize(
    "head",
    [
        b"\x7fELF\x02\x01\x01",
        b"MZ\x90\x00",
        b"\xfe\xed\xfa\xce",
        b"\xce\xfa\xed\xfe",
        b"\xfe\xed\xfa\xcf",
        b"\xcf\xfa\xed\xfe",
        b"\xca\xfe\xba\xbe",
        b"\xbe\xba\xfe\xca",
        b"#!/bin/sh\n",
        b"#!",
        b"\x00asm\x01\x00\x00\x00",
        b"dex\n035\x00",
        b"L\x00\x00\x00\x01\x14\x02\x00",
        b"%!PS-Adobe-3.0",
    ],
)
def test_executable_by_content(head):
    assert has_executable_magic(head)


@pytest.mark.parametrize(
    "name, head",
    [
        ("report.pdf", b"%PDF-1.7"),
        ("notes.txt", b"# heading"),
        ("data.csv", b"a,b\n"),
        ("x.sh.txt", b"echo"),
        ("Makefile", b"all:"),
        ("photo.png", b"\x89PNG\r\n\x1a\n"),
        ("empty.txt", b""),
        ("data.json", b'{"js": 1}'),
        ("app.js.txt", b"%! not PostScript"),
        ("index.html", b"<!doctype html>"),
        ("dex.md", b"dex\nnotes"),
    ],
)
def test_not_executable(name, head):
    assert not has_executable_extension(name) and not has_executable_magic(head)


@pytest.mark.parametrize(
    "name, head, expected",
    [
        ("a.pdf", b"", "application/pdf"),
        ("a.txt", b"hi", "text/plain"),
        ("a.csv", b"a,b", "text/csv"),
        ("unknown.zzz", b"??", "text/plain"),
        ("unknown.zzz", b"\x00\x01\x02", "application/octet-stream"),
        ("noext", b"", "application/octet-stream"),
        ("fake.txt", b"\x89PNG\r\n\x1a\n\x00", "image/png"),
        ("photo.png", b"\xff\xd8\xff\xe0", "image/jpeg"),
        ("x.bin", b"GIF89a..", "image/gif"),
        ("x.bin", b"GIF87a..", "image/gif"),
        ("doc.txt", b"%PDF-1.4", "application/pdf"),
        ("x", b"RIFF\x00\x00\x00\x00WEBP", "image/webp"),
    ],
)
def test_content_type(name, head, expected):
    assert content_type(name, head) == expected


# --- session_dir -------------------------------------------------------------------------


def test_session_dir_validates_uuid(store):
    assert store.session_dir(SID) == store.root / SID
    assert store.session_dir(SID.upper()) == store.root / SID
    for bad in ["", "not-a-uuid", "../" + SID, SID + "/x", "0b7e5c1e8f6a4d2b9c3e1a2b3c4d5e6f", f"{{{SID}}}"]:
        with pytest.raises(InvalidArgument) as excinfo:
            store.session_dir(bad)
        assert excinfo.value.field == "session_id"


# --- uploads -----------------------------------------------------------------------------


def test_upload_streams_and_commits(store):
    upload = store.begin_upload(SID, "report.pdf")
    upload.write(b"%PDF-1.7\n")
    upload.write(b"body")
    info = upload.commit()
    data = b"%PDF-1.7\nbody"
    assert info == FileInfo(
        name="report.pdf",
        path=store.session_dir(SID) / "report.pdf",
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        content_type="application/pdf",
    )
    assert info.path.read_bytes() == data
    assert entries(store.session_dir(SID)) == ["report.pdf"]  # no temp file left


@pytest.mark.parametrize("raw", ["../../etc/passwd", "/etc/passwd", "..\\..\\passwd", "sub/dir/passwd", "pass\x00wd"])
def test_traversal_attempts_stay_in_session_folder(store, tmp_path, raw):
    info = store.save(SID, raw, b"root:x:0:0")
    assert info.path.parent == store.session_dir(SID)
    assert info.name == "passwd"
    assert not (tmp_path / "etc").exists()
    assert [p.parent for p in tmp_path.rglob("passwd") if p.parent.name != DIGEST_DIR] == [info.path.parent]


def test_exactly_at_the_cap_passes(store):
    upload = store.begin_upload(SID, "big.dat")
    upload.write(b"a" * 600)
    upload.write(b"b" * 400)
    assert upload.commit().size == 1000


def test_one_byte_over_the_cap_fails_mid_stream_and_leaves_nothing(store):
    upload = store.begin_upload(SID, "big.dat")
    upload.write(b"a" * 600)
    upload.write(b"b" * 399)
    with pytest.raises(ResourceExhausted, match="1000 bytes"):
        upload.write(b"cc")
    assert entries(store.session_dir(SID)) == []
    with pytest.raises(FailedPrecondition):
        upload.write(b"more")
    with pytest.raises(FailedPrecondition):
        upload.commit()


def test_cap_checked_before_writing_a_huge_first_chunk(store):
    upload = store.begin_upload(SID, "big.dat")
    with pytest.raises(ResourceExhausted):
        upload.write(b"x" * 5000)
    assert entries(store.session_dir(SID)) == []


def test_default_cap_is_200_mb(tmp_path):
    assert FileStore(tmp_path).max_bytes == 200 * 1024 * 1024


@pytest.mark.parametrize("name", ["evil.sh", "tool.EXE", "script.py", "lib.so", "../bin/thing.bat"])
def test_executable_extension_rejected_before_any_bytes(store, name):
    with pytest.raises(InvalidArgument) as excinfo:
        store.begin_upload(SID, name)
    assert excinfo.value.field == "filename"
    assert entries(store.session_dir(SID)) == []


@pytest.mark.parametrize(
    "chunks",
    [
        [b"\x7fELF\x02\x01\x01\x00" + b"\x00" * 100],
        [b"\x7f", b"E", b"L", b"F", b"\x02\x01\x01\x00\x00"],  # magic split across chunks
        [b"#!/bin/bash\necho pwned\n"],
        [b"#!"],  # shorter than the sniffed head, caught at commit
        [b"MZ\x90\x00\x03\x00\x00\x00"],
        [b"\xcf\xfa\xed\xfe\x07\x00\x00\x01"],
    ],
)
def test_executable_content_in_txt_rejected(store, chunks):
    with pytest.raises(InvalidArgument) as excinfo:
        with store.begin_upload(SID, "notes.txt") as upload:
            for chunk in chunks:
                upload.write(chunk)
            upload.commit()
    assert excinfo.value.field == "content"
    assert entries(store.session_dir(SID)) == []


def test_shebang_not_at_start_is_fine(store):
    assert store.save(SID, "notes.txt", b"see #!/bin/sh").name == "notes.txt"


def test_duplicate_names_get_numeric_suffix(store):
    names = [store.save(SID, "report.pdf", f"v{i}".encode()).name for i in range(4)]
    assert names == ["report.pdf", "report_1.pdf", "report_2.pdf", "report_3.pdf"]
    assert (store.session_dir(SID) / "report.pdf").read_bytes() == b"v0"  # never clobbered
    assert (store.session_dir(SID) / "report_3.pdf").read_bytes() == b"v3"
    assert store.save(SID, "README", b"x").name == "README"
    assert store.save(SID, "README", b"y").name == "README_1"


def test_concurrent_uploads_of_same_name_do_not_clobber(store):
    first = store.begin_upload(SID, "same.txt")
    second = store.begin_upload(SID, "same.txt")
    first.write(b"first")
    second.write(b"second")
    # Commit order decides, not begin order; neither overwrites the other.
    assert second.commit().name == "same.txt"
    assert first.commit().name == "same_1.txt"
    folder = store.session_dir(SID)
    assert (folder / "same.txt").read_bytes() == b"second"
    assert (folder / "same_1.txt").read_bytes() == b"first"


def test_abort_and_context_manager_remove_temp_file(store):
    upload = store.begin_upload(SID, "x.txt")
    upload.write(b"partial")
    assert len(entries(store.session_dir(SID))) == 1
    upload.abort()
    upload.abort()  # idempotent
    assert entries(store.session_dir(SID)) == []

    with pytest.raises(RuntimeError):
        with store.begin_upload(SID, "y.txt") as upload:
            upload.write(b"partial")
            raise RuntimeError("client went away")
    assert entries(store.session_dir(SID)) == []


def test_empty_file_upload(store):
    info = store.save(SID, "empty.txt", b"")
    assert info.size == 0 and info.sha256 == hashlib.sha256(b"").hexdigest()


# --- pasted images -----------------------------------------------------------------------


def test_image_numbering_runs_across_formats(store):
    png = store.save_image(SID, image_bytes("PNG"))
    jpg = store.save_image(SID, image_bytes("JPEG"))
    gif = store.save_image(SID, image_bytes("GIF"))
    webp = store.save_image(SID, image_bytes("WEBP"))
    assert [png.name, jpg.name, gif.name, webp.name] == ["image_1.png", "image_2.jpg", "image_3.gif", "image_4.webp"]
    assert [png.content_type, jpg.content_type, gif.content_type] == ["image/png", "image/jpeg", "image/gif"]


def test_same_bytes_twice_return_existing_file(store):
    data = image_bytes("PNG")
    first = store.save_image(SID, data)
    other = store.save_image(SID, image_bytes("PNG", color=(1, 2, 3)))
    again = store.save_image(SID, data)
    assert again == first
    assert other.name == "image_2.png"
    assert entries(store.session_dir(SID)) == ["image_1.png", "image_2.png"]


def test_same_image_in_another_session_is_stored_separately(store):
    data = image_bytes("PNG")
    assert store.save_image(SID, data).path.parent != store.save_image(OTHER_SID, data).path.parent


def test_png_alpha_bytes_kept_exactly(store):
    data = image_bytes("PNG", mode="RGBA", color=(10, 20, 30, 0))
    info = store.save_image(SID, data)
    assert info.path.read_bytes() == data
    with Image.open(info.path) as im:
        assert im.mode == "RGBA"
        assert im.getpixel((0, 0)) == (10, 20, 30, 0)


def test_extension_comes_from_bytes_not_a_name(store):
    # A JPEG is a .jpg even if nothing else says so.
    assert store.save_image(SID, image_bytes("JPEG")).name == "image_1.jpg"
    assert image_extension(image_bytes("BMP")) == "bmp"


@pytest.mark.parametrize(
    ("fmt", "ext"),
    [("PNG", "png"), ("JPEG", "jpg"), ("GIF", "gif"), ("WEBP", "webp"), ("BMP", "bmp"), ("TIFF", "tiff")],
)
def test_image_extension_names_the_format_from_the_bytes(fmt, ext):
    assert image_extension(image_bytes(fmt)) == ext


@pytest.mark.parametrize("data", [b"hello world", b""])
def test_image_extension_refuses_what_is_not_an_image(data):
    with pytest.raises(InvalidArgument, match="images: not a readable image"):
        image_extension(data)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"definitely not an image",
        image_bytes("PNG")[:30],  # truncated: header only
        b"\x89PNG\r\n\x1a\n" + b"\x00" * 50,
        b"\x7fELF\x02\x01\x01\x00",
    ],
)
def test_unreadable_image_rejected(store, data):
    with pytest.raises(InvalidArgument) as excinfo:
        store.save_image(SID, data)
    assert excinfo.value.field == "images"
    assert entries(store.session_dir(SID)) == []


def test_oversized_image_rejected(tmp_path):
    small = FileStore(tmp_path, max_bytes=10)
    with pytest.raises(ResourceExhausted):
        small.save_image(SID, image_bytes("PNG"))


def test_image_numbering_continues_after_gaps_and_uploads(store):
    store.save_image(SID, image_bytes("PNG", color=(1, 1, 1)))
    store.save_image(SID, image_bytes("PNG", color=(2, 2, 2)))
    (store.session_dir(SID) / "image_1.png").unlink()
    store.save(SID, "notes.txt", b"x")
    assert store.save_image(SID, image_bytes("GIF")).name == "image_3.gif"


# --- reading -----------------------------------------------------------------------------


def test_open_read_and_iter_chunks(store):
    data = bytes(range(256)) * 3
    store.save(SID, "blob.dat", data)
    with store.open_read(SID, "blob.dat") as f:
        assert f.read() == data
    chunks = list(store.iter_chunks(SID, "blob.dat", chunk_size=100))
    assert b"".join(chunks) == data
    assert [len(c) for c in chunks] == [100] * 7 + [68]


def test_missing_file_is_not_found_naming_it(store):
    with pytest.raises(NotFound, match="nope.txt"):
        store.open_read(SID, "nope.txt")
    with pytest.raises(NotFound, match="nope.txt"):
        store.iter_chunks(SID, "nope.txt")  # raised at call time, not first next()


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", ".upload-abc.part", "..", "", "a\x00b"])
def test_read_rejects_names_that_cannot_be_stored(store, name):
    store.save(SID, "x", b"1")
    with pytest.raises(InvalidArgument) as excinfo:
        store.open_read(SID, name)
    assert excinfo.value.field == "filename"


def test_symlink_escaping_the_folder_is_refused(store, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    store.save(SID, "ok.txt", b"1")
    (store.session_dir(SID) / "link.txt").symlink_to(secret)
    with pytest.raises(InvalidArgument):
        store.open_read(SID, "link.txt")
    assert [f.name for f in store.list_files(SID)] == ["ok.txt"]


# --- listing, deleting, sweeping ---------------------------------------------------------


def test_list_files_sorted_with_info(store):
    store.save(SID, "b.txt", b"bb")
    store.save(SID, "a.pdf", b"%PDF-1.4")
    store.save_image(SID, image_bytes("PNG"))
    in_progress = store.begin_upload(SID, "c.txt")
    in_progress.write(b"partial")
    files = store.list_files(SID)
    assert [f.name for f in files] == ["a.pdf", "b.txt", "image_1.png"]
    assert files[0].content_type == "application/pdf"
    assert files[1].size == 2 and files[1].sha256 == hashlib.sha256(b"bb").hexdigest()
    in_progress.abort()


def test_digests_are_kept_at_upload_and_trusted_while_the_file_is_unchanged(store):
    store.save(SID, "a.txt", b"aaa")
    store.save_image(SID, image_bytes("PNG"))
    folder = store.session_dir(SID)
    # No temp file left; beside the digests, the token that changes with every write (ListFiles).
    assert sorted(os.listdir(folder / DIGEST_DIR)) == [".palimpsest-changes", "a.txt", "image_1.png"]
    kept = folder / DIGEST_DIR / "a.txt"
    assert kept.read_text().split()[0] == hashlib.sha256(b"aaa").hexdigest()
    # A listing answers from what was kept, without reading the file: a planted digest shows it.
    kept.write_text(kept.read_text().replace(hashlib.sha256(b"aaa").hexdigest(), "f" * 64))
    assert {f.name: f.sha256 for f in store.list_files(SID)}["a.txt"] == "f" * 64
    assert store.file_info(SID, "a.txt").sha256 == "f" * 64


def test_a_file_changed_after_upload_is_hashed_again(store):
    path = store.save(SID, "notes.txt", b"first").path
    path.write_bytes(b"second, longer")  # the agent's tools may rewrite files in the folder
    assert store.file_info(SID, "notes.txt").sha256 == hashlib.sha256(b"second, longer").hexdigest()
    replaced = path.with_name(".replacement")
    replaced.write_bytes(b"second, LONGER")  # the same size: the new inode tells them apart
    os.replace(replaced, path)
    assert store.list_files(SID)[0].sha256 == hashlib.sha256(b"second, LONGER").hexdigest()


def test_a_file_from_before_digests_were_kept_is_hashed_once(store):
    path = store.save(SID, "old.dat", b"old bytes").path
    (path.parent / DIGEST_DIR / "old.dat").unlink()  # as a file stored by the release before
    assert store.list_files(SID)[0].sha256 == hashlib.sha256(b"old bytes").hexdigest()
    assert (path.parent / DIGEST_DIR / "old.dat").read_text().split()[0] == hashlib.sha256(b"old bytes").hexdigest()


def test_list_files_of_unknown_session_is_empty(store):
    assert store.list_files(SID) == []


def test_delete_session(store):
    store.save(SID, "a.txt", b"a")
    store.save(OTHER_SID, "b.txt", b"b")
    assert store.delete_session(SID) is True
    assert not store.session_dir(SID).exists()
    assert store.delete_session(SID) is False
    assert [f.name for f in store.list_files(OTHER_SID)] == ["b.txt"]


def test_sweep_removes_only_missing_sessions(store):
    gone = str(uuid.uuid4())
    for sid in (SID, OTHER_SID, gone):
        store.save(sid, "f.txt", b"x")
    (store.root / "not-a-session").mkdir()
    (store.root / "README").write_text("keep me")
    assert store.sweep({SID, OTHER_SID.upper()}) == [gone]
    assert sorted(os.listdir(store.root)) == sorted([SID, OTHER_SID, "not-a-session", "README"])


def test_sweep_with_callable_gets_candidates_once(store):
    gone = str(uuid.uuid4())
    for sid in (SID, gone):
        store.save(sid, "f.txt", b"x")
    calls = []

    def existing(candidates: list[str]) -> set[str]:
        calls.append(candidates)
        return {SID}

    assert store.sweep(existing) == [gone]
    assert calls == [sorted([SID, gone])]


def test_sweep_without_root_or_sessions(tmp_path):
    store = FileStore(tmp_path / "missing")
    assert store.sweep(set()) == []
    assert store.sweep(lambda ids: pytest.fail("not called when nothing is on disk")) == []

"""What a session file is, from its first bytes and its name, and how a client can show it.

The store types every file it keeps with :func:`content_type` (``FileInfo.content_type``), and
``content_publish`` picks the inline viewer with :func:`viewer` and says with :func:`sandboxed`
whether a client must show it where no script runs. The bytes decide over the name: a
PNG saved as ``notes.txt`` is an image, and a ``.ts`` file that is not an MPEG transport stream is
TypeScript, i.e. text. Pure functions over a file's head; no file is read here.

A signature table rather than a library: the store already keeps one (the types it must tell apart
are a few dozen), Pillow needs more than a head to name some images (a JPEG's EXIF block can push
its frame header past any fixed head), and the standard library's ``mimetypes`` gives the name's
guess.
"""

from __future__ import annotations

import mimetypes

# Enough for every signature below (an MPEG-TS packet is 188 bytes; its second sync byte is at 188)
# and for an HTML or SVG prologue.
SNIFF_BYTES = 512
TS_PACKET = 188

# (offset, signature, type): the first that matches decides.
_SIGNATURES: tuple[tuple[int, bytes, str], ...] = (
    (0, b"\x89PNG\r\n\x1a\n", "image/png"),
    (0, b"\xff\xd8\xff", "image/jpeg"),
    (0, b"GIF87a", "image/gif"),
    (0, b"GIF89a", "image/gif"),
    (0, b"II*\x00", "image/tiff"),
    (0, b"MM\x00*", "image/tiff"),
    (0, b"%PDF-", "application/pdf"),
    (0, b"glTF", "model/gltf-binary"),
    (0, b"\x1a\x45\xdf\xa3", "video/webm"),  # EBML: WebM and Matroska
    (0, b"OggS", "audio/ogg"),
    (0, b"fLaC", "audio/flac"),
    (0, b"ID3", "audio/mpeg"),
)
_RIFF_FORMS = {b"WEBP": "image/webp", b"WAVE": "audio/wav", b"AVI ": "video/x-msvideo"}
# ISO base media files ("....ftyp<brand>"): the brand says what the box holds.
_FTYP_BRANDS = {
    b"M4A ": "audio/mp4",
    b"M4B ": "audio/mp4",
    b"qt  ": "video/quicktime",
    b"avif": "image/avif",
    b"avis": "image/avif",
    b"heic": "image/heic",
    b"heix": "image/heic",
    b"mif1": "image/heic",
    b"msf1": "image/heic",
}
# Types whose files are text: a text body under one of these names keeps the name's type.
_TEXT_BASED = frozenset(
    {
        "image/svg+xml",
        "application/json",
        "application/xml",
        "application/javascript",
        "application/x-javascript",
        "application/ecmascript",
        "application/x-sh",
        "application/x-python-code",
        "application/toml",
        "application/yaml",
        "application/x-yaml",
        "application/sql",
        "application/x-tex",
        "application/rtf",
        "application/xhtml+xml",
        "model/gltf+json",
        "model/stl",
        "model/obj",
    }
)
# A built-in table only: the module-level mimetypes functions also read the host's /etc/mime.types,
# which would make content types differ by machine.
_MIME = mimetypes.MimeTypes()
for _ext, _type in (
    (".stl", "model/stl"),
    (".gltf", "model/gltf+json"),
    (".glb", "model/gltf-binary"),
    (".obj", "model/obj"),
    (".ts", "video/mp2t"),
    (".md", "text/markdown"),
    (".yaml", "application/yaml"),
    (".yml", "application/yaml"),
    (".toml", "application/toml"),
    (".webm", "video/webm"),
    (".flac", "audio/flac"),
    (".opus", "audio/ogg"),
):
    _MIME.add_type(_type, _ext)


def _signature_type(head: bytes) -> str | None:
    for offset, signature, mime in _SIGNATURES:
        if head[offset : offset + len(signature)] == signature:
            return mime
    if head[:4] == b"RIFF" and head[8:12] in _RIFF_FORMS:
        return _RIFF_FORMS[head[8:12]]
    if head[4:8] == b"ftyp":
        return _FTYP_BRANDS.get(head[8:12], "video/mp4")
    if len(head) > TS_PACKET and head[0] == head[TS_PACKET] == 0x47:  # two packets' sync bytes
        return "video/mp2t"
    return None


# Control bytes that text holds: tab, newlines, form feed, and ESC (colour codes in logs).
_TEXT_CONTROLS = frozenset(b"\t\n\r\f\x1b")
# Every byte text may hold; deleting them leaves the ones it never does (in C: a listing sniffs
# every file of a workspace).
_TEXT_BYTES = bytes(b for b in range(256) if not ((b < 0x20 and b not in _TEXT_CONTROLS) or b == 0x7F))


def _text_of(head: bytes) -> str | None:
    """The head as text, or None when it is binary (a control byte text never holds, or bytes
    that are not UTF-8)."""
    if not head or head.translate(None, _TEXT_BYTES):
        return None
    for cut in range(4):  # the head may end inside a multi-byte character
        try:
            return head[: len(head) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return None


def _markup_type(text: str) -> str | None:
    start = text.lstrip("\ufeff \t\r\n").lower()
    if start.startswith(("<!doctype html", "<html")):
        return "text/html"
    if start.startswith("<svg") or (start.startswith(("<?xml", "<!doctype svg")) and "<svg" in start):
        return "image/svg+xml"
    return None


def content_type(name: str, head: bytes) -> str:
    """The MIME type of a file called ``name`` that starts with ``head`` (its first SNIFF_BYTES)."""
    signed = _signature_type(head)
    if signed is not None:
        return signed
    text = _text_of(head)
    if text is not None:
        markup = _markup_type(text)
        if markup is not None:
            return markup
    guessed, _ = _MIME.guess_type(name, strict=False)
    if text is None:
        return guessed or "application/octet-stream"
    if guessed and (guessed.startswith("text/") or guessed in _TEXT_BASED):
        return guessed
    # A text body under a binary type's name (a .ts that is TypeScript, a .png that is a note): text.
    return "text/plain"


def viewer(mime: str) -> str:
    """How a client shows this type inline: image, svg, pdf, html, video, audio, model or text;
    "" when it has no inline view (it can only be downloaded)."""
    if mime.startswith("model/"):
        return "model"
    if mime in ("text/html", "application/xhtml+xml"):
        return "html"
    if mime == "image/svg+xml":
        return "svg"
    if mime == "application/pdf":
        return "pdf"
    for family in ("image", "video", "audio"):
        if mime.startswith(family + "/"):
            return family
    if mime.startswith("text/") or mime in _TEXT_BASED:
        return "text"
    return ""


# HTML and SVG can run script (a <script>, an on* handler, a javascript: link, a foreignObject): a
# client shows every one in a sandbox, rather than trust a scan of the file to find them all.
SANDBOXED_VIEWERS = frozenset({"html", "svg"})


def sandboxed(shown_as: str) -> bool:
    """Whether a client must show this viewer's files only where no script runs and nothing is
    fetched (FileShared.sandbox)."""
    return shown_as in SANDBOXED_VIEWERS

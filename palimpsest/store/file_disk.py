"""A session folder on disk: the names its files take, the digests kept beside them (``.sha256/``),
final names claimed with links that never clobber, and the changes token a workspace mirror compares.

Synchronous like the rest of the file store (see palimpsest.store.files)."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import re
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from palimpsest.shared.content_types import SNIFF_BYTES
from palimpsest.shared.errors import (
    InvalidArgument,
    ResourceExhausted,
)
from palimpsest.shared.file_policy import (
    MAX_NAME_BYTES,
    split_extension,
)
from palimpsest.shared.workspace_paths import CHANGES_NAME, RESERVED_NAMES, RESERVED_PREFIXES

# What is buffered of an upload's start before its first write: enough to spot a program (its
# magic number) and to type the file (content_types.SNIFF_BYTES).
HEAD_BYTES = SNIFF_BYTES
TEMP_PREFIX = ".upload-"
# How many suffixes to try before concluding something is wrong with the folder.
MAX_NAME_ATTEMPTS = 10_000

# Where each stored file's digest is kept, under the file's own name.
DIGEST_DIR = ".sha256"
# The digest's third word when the file's content is the conversation's own (a tool wrote it).
OWN = "own"

# Pillow format name -> stored extension.  An allowlist: Pillow recognises
# some formats by very weak signatures, and a "pasted image" in an exotic
# format is more likely garbage than a picture.
IMAGE_EXTENSIONS = {
    "PNG": "png",
    "JPEG": "jpg",
    "MPO": "jpg",  # multi-picture JPEG (phone cameras); still a JPEG file
    "GIF": "gif",
    "WEBP": "webp",
    "BMP": "bmp",
    "TIFF": "tiff",
    "ICO": "ico",
    "AVIF": "avif",
    "HEIF": "heic",
}

SESSION_ID_PATTERN = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)
IMAGE_NAME_PATTERN = re.compile(r"image_([1-9][0-9]*)\.[a-z0-9]+")


@dataclass(frozen=True)
class FileInfo:
    name: str  # its workspace path: the name itself for a file at the top
    path: Path
    size: int
    sha256: str
    content_type: str
    outside_content: bool = True  # not known to be the conversation's own


def numbered_name(name: str, n: int) -> str:
    """Return the ``n``-th alternative for a taken ``name``: report.pdf -> report_n.pdf."""
    if n == 0:
        return name
    stem, ext = split_extension(name)
    suffix = f"_{n}"
    stem = stem[: MAX_NAME_BYTES - len(ext) - len(suffix)]
    return f"{stem}{suffix}{ext}"


def image_extension(data: bytes) -> str:
    """Return the file extension for image bytes, from the bytes alone."""
    # Imported here so that modules importing FileStore for uploads alone do
    # not pay for Pillow's plugin registry.
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            fmt = image.format
            # verify() checks structure (PNG chunk CRCs etc.) without decoding
            # pixels, so a truncated paste is refused instead of stored.
            image.verify()
    except Exception as exc:  # noqa: BLE001 -- Pillow raises many unrelated types
        raise InvalidArgument("images", f"not a readable image ({type(exc).__name__})") from exc
    ext = IMAGE_EXTENSIONS.get(fmt or "")
    if ext is None:
        raise InvalidArgument("images", f"unsupported image format {fmt}")
    return ext


def normalized_session_id(session_id: str) -> str:
    """Return the canonical (lower-case) form of a UUID session id."""
    if not isinstance(session_id, str) or not SESSION_ID_PATTERN.fullmatch(session_id):
        raise InvalidArgument("session_id", f"{session_id!r} is not a UUID")
    return session_id.lower()


def sha256_of(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def file_stamp(path: Path) -> str:
    """What must be unchanged for a kept digest to still be the file's: the agent's file tools work
    in the session folder, so a stored file may be rewritten or replaced after its upload."""
    st = path.stat()
    return f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def keep_digest(path: Path, digest: str, stamp: str, own: bool = False) -> None:
    """Keep ``digest`` beside the file (and whether its content is the conversation's own),
    replaced atomically so a reader sees the old or the new one. A failure (a full disk) costs only
    hashing the file again at the next read, which then counts it as outside content."""
    folder = path.parent / DIGEST_DIR
    temp = None
    try:
        folder.mkdir(exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=folder)  # never a stored name
        with os.fdopen(fd, "w") as f:
            f.write(f"{digest} {stamp}{' ' + OWN if own else ''}\n")
        os.replace(temp, folder / path.name)
    except OSError:
        if temp is not None:
            Path(temp).unlink(missing_ok=True)


def kept_digest(path: Path) -> tuple[str, bool] | None:
    """(digest, own) kept for the file as it is now; None when none is kept or the file changed."""
    stamp = file_stamp(path)
    try:
        digest, kept_stamp, *rest = (path.parent / DIGEST_DIR / path.name).read_text().split()
    except (OSError, ValueError):  # none kept yet (a file from before digests were kept), or torn
        return None
    return (digest, rest == [OWN]) if kept_stamp == stamp else None


def digest_of(path: Path) -> str:
    """The file's SHA-256: the kept one while the file is unchanged, else hashed (and kept)."""
    kept = kept_digest(path)
    if kept is not None:
        return kept[0]
    stamp = file_stamp(path)  # before hashing: a change during the hash makes the kept one stale, not wrong
    digest = sha256_of(path)
    keep_digest(path, digest, stamp)
    return digest


def head_of(path: Path) -> bytes:
    with path.open("rb") as f:
        return f.read(HEAD_BYTES)


def link_without_clobber(source: Path, target: Path) -> None:
    """Make ``target`` name the file at ``source``; FileExistsError if it is taken."""
    try:
        os.link(source, target)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
            raise
        # Filesystems without hard links: reserve the name exclusively, then
        # move the data over the reservation.  Readers may briefly see an
        # empty file, but nothing is ever overwritten.
        fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(fd)
        os.replace(source, target)
        return
    source.unlink()


def claim_name(temp: Path, folder: Path, candidates: Iterator[str]) -> Path:
    """Give ``temp`` the first free name from ``candidates``; return the final path."""
    for _, name in zip(range(MAX_NAME_ATTEMPTS), candidates):
        target = inside(folder, name)
        try:
            link_without_clobber(temp, target)
        except FileExistsError:
            continue  # taken, possibly by a concurrent upload a moment ago
        return target
    raise ResourceExhausted(f"no free file name left in {folder.name}")


def inside(folder: Path, name: str) -> Path:
    """Return ``folder / name`` (a workspace path), refusing anything that resolves elsewhere."""
    path = folder / name
    resolved, root = path.resolve(), folder.resolve()
    if resolved == root or not resolved.is_relative_to(root) or resolved.relative_to(root).as_posix() != name:
        # The path rules already make this impossible; this guards against a future change (or
        # a planted symlink) breaking that assumption.
        raise InvalidArgument("filename", f"{name!r} escapes the session folder")
    return path


def mark_changed(folder: Path) -> str:
    """A new changes token for ``folder``, written after each change to its files: a reader that
    read the old one before listing sees that it must list again. One write wins whole (a rename);
    two writers leave either token, both new. Kept among the top level's digests (no file may
    take its name, so no digest either)."""
    kept = folder / DIGEST_DIR
    kept.mkdir(exist_ok=True)
    temp = kept / f"{TEMP_PREFIX}{uuid.uuid4().hex}"
    token = uuid.uuid4().hex
    temp.write_text(token)
    os.replace(temp, kept / CHANGES_NAME)
    return token


def changes_token(folder: Path) -> str:
    """The folder's changes token, made on first need (a folder from before tokens were kept)."""
    try:
        return (folder / DIGEST_DIR / CHANGES_NAME).read_text().strip()
    except FileNotFoundError:
        return mark_changed(folder)


def reserved_name(name: str) -> bool:
    return name in RESERVED_NAMES or name.startswith(RESERVED_PREFIXES)

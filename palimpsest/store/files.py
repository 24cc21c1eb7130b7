"""Session file storage: one folder per session under a root directory.

Uploaded files and pasted images land in ``<root>/<session_id>/`` where the
agent's file tools can reach them.  Everything here is synchronous on purpose;
the gRPC servicer calls it through ``asyncio.to_thread`` so disk I/O never
blocks the event loop, and the tests need no event loop at all.

Naming choices:

* Uploaded names go through :func:`safe_name`; a name already taken gets a
  numeric suffix before the extension, ``report.pdf`` -> ``report_1.pdf`` ->
  ``report_2.pdf`` (an underscore rather than `` (1)`` so the result needs no
  quoting in the shell commands the agent writes).
* Pasted images are ``image_N.<ext>`` with N running across the session
  whatever the format, and the extension read from the bytes.
* In-progress uploads are hidden dot files (``.upload-*.part``); safe_name
  strips leading dots, so no stored name can ever collide with one, and
  listing and reading skip them.
* Each file's SHA-256 is computed once, while it is uploaded (or at the first
  read of a file stored before digests were kept), and kept in the hidden
  ``.sha256/`` folder beside it: listing a folder reads no file in full.
* The session folder is also the session's workspace: the Agent's tools write
  files at paths (``src/app.py``, :mod:`palimpsest.shared.workspace_paths`),
  replacing what is there atomically (a reader sees the old file or the new
  one, never half of each). Beside its digest a tool's file keeps whether its
  content is the conversation's own; anything else (an upload, a file stored
  before this was kept, one changed behind the store's back) counts as outside
  content.

Final names are claimed with ``os.link`` (fails instead of clobbering), so two
concurrent uploads of ``report.pdf`` end up as ``report.pdf`` and
``report_1.pdf`` rather than one overwriting the other.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from palimpsest.shared.content_types import SNIFF_BYTES, content_type
from palimpsest.shared.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from palimpsest.shared.file_policy import (  # noqa: F401 — the rules the store enforces, re-exported
    EXECUTABLE_EXTENSIONS,
    MAX_NAME_BYTES,
    PROGRAM_CONTENT,
    has_executable_extension,
    has_executable_magic,
    refused_as_program,
    safe_name,
    split_extension,
)
from palimpsest.shared.workspace_paths import CHANGES_NAME, RESERVED_NAMES, RESERVED_PREFIXES, is_workspace_path

DEFAULT_MAX_BYTES = 200 * 1024 * 1024
CHUNK_SIZE = 64 * 1024
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

_SESSION_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)
_IMAGE_NAME = re.compile(r"image_([1-9][0-9]*)\.[a-z0-9]+")


@dataclass(frozen=True)
class FileInfo:
    name: str  # its workspace path: the name itself for a file at the top
    path: Path
    size: int
    sha256: str
    content_type: str
    outside_content: bool = True  # not known to be the conversation's own


# --- pure helpers ----------------------------------------------------------------


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
    if not isinstance(session_id, str) or not _SESSION_ID.fullmatch(session_id):
        raise InvalidArgument("session_id", f"{session_id!r} is not a UUID")
    return session_id.lower()


def _sha256_of(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _stamp(path: Path) -> str:
    """What must be unchanged for a kept digest to still be the file's: the agent's file tools work
    in the session folder, so a stored file may be rewritten or replaced after its upload."""
    st = path.stat()
    return f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def _keep_digest(path: Path, digest: str, stamp: str, own: bool = False) -> None:
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


def _kept(path: Path) -> tuple[str, bool] | None:
    """(digest, own) kept for the file as it is now; None when none is kept or the file changed."""
    stamp = _stamp(path)
    try:
        digest, kept_stamp, *rest = (path.parent / DIGEST_DIR / path.name).read_text().split()
    except (OSError, ValueError):  # none kept yet (a file from before digests were kept), or torn
        return None
    return (digest, rest == [OWN]) if kept_stamp == stamp else None


def _digest_of(path: Path) -> str:
    """The file's SHA-256: the kept one while the file is unchanged, else hashed (and kept)."""
    kept = _kept(path)
    if kept is not None:
        return kept[0]
    stamp = _stamp(path)  # before hashing: a change during the hash makes the kept one stale, not wrong
    digest = _sha256_of(path)
    _keep_digest(path, digest, stamp)
    return digest


def _head_of(path: Path) -> bytes:
    with path.open("rb") as f:
        return f.read(HEAD_BYTES)


def _link_without_clobber(source: Path, target: Path) -> None:
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


def _claim_name(temp: Path, folder: Path, candidates: Iterator[str]) -> Path:
    """Give ``temp`` the first free name from ``candidates``; return the final path."""
    for _, name in zip(range(MAX_NAME_ATTEMPTS), candidates):
        target = _inside(folder, name)
        try:
            _link_without_clobber(temp, target)
        except FileExistsError:
            continue  # taken, possibly by a concurrent upload a moment ago
        return target
    raise ResourceExhausted(f"no free file name left in {folder.name}")


def _inside(folder: Path, name: str) -> Path:
    """Return ``folder / name`` (a workspace path), refusing anything that resolves elsewhere."""
    path = folder / name
    resolved, root = path.resolve(), folder.resolve()
    if resolved == root or not resolved.is_relative_to(root) or resolved.relative_to(root).as_posix() != name:
        # The path rules already make this impossible; this guards against a future change (or
        # a planted symlink) breaking that assumption.
        raise InvalidArgument("filename", f"{name!r} escapes the session folder")
    return path


def _mark_changed(folder: Path) -> str:
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


def _changes_token(folder: Path) -> str:
    """The folder's changes token, made on first need (a folder from before tokens were kept)."""
    try:
        return (folder / DIGEST_DIR / CHANGES_NAME).read_text().strip()
    except FileNotFoundError:
        return _mark_changed(folder)


def _reserved(name: str) -> bool:
    return name in RESERVED_NAMES or name.startswith(RESERVED_PREFIXES)


# --- uploads -----------------------------------------------------------------------


class Upload:
    """One streaming upload into a session folder: write() chunks, then commit()."""

    def __init__(
        self,
        folder: Path,
        name: str,
        max_bytes: int,
        *,
        final_names: Callable[[], Iterator[str]] | None = None,
        replace: bool = False,
        own: bool = False,
        scripts_allowed: bool = False,
    ) -> None:
        self.folder = folder
        self.name = name
        self.max_bytes = max_bytes
        # A tool's write: put at `name` whatever is there (one write wins whole), its digest kept
        # with whether the content is the conversation's own (`own`).
        self.replace = replace
        self.own = own
        self.scripts_allowed = scripts_allowed
        # Called at commit time, not now, so the free names are computed as
        # late as possible; the default numbers duplicates of `name`.
        self._final_names = final_names or self._numbered_names
        # Beside its final place: the rename that publishes it never crosses a filesystem.
        fd, temp = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=".part", dir=(folder / name).parent)
        self.temp_path = Path(temp)
        self._file: BinaryIO | None = os.fdopen(fd, "wb")
        self._size = 0
        self._sha256 = hashlib.sha256()
        self._head = b""
        self._head_checked = False

    @property
    def size(self) -> int:
        return self._size

    def write(self, chunk: bytes) -> None:
        """Append ``chunk``; reject the upload as soon as it breaks a rule."""
        file = self._open_file()
        if self._size + len(chunk) > self.max_bytes:
            # Checked before writing, so the disk never holds more than the cap.
            self.abort()
            raise ResourceExhausted(
                f"file {self.name!r} exceeds the session file limit of {self.max_bytes} bytes"
                f" ({self.max_bytes / (1024 * 1024):g} MB)"
            )
        if not self._head_checked:
            self._head += chunk[: HEAD_BYTES - len(self._head)]
            if len(self._head) >= HEAD_BYTES:
                self._check_head()
        file.write(chunk)
        self._sha256.update(chunk)
        self._size += len(chunk)

    def commit(self) -> FileInfo:
        """Finish the upload under a free name and return what was stored."""
        file = self._open_file()
        if not self._head_checked:
            self._check_head()  # files shorter than HEAD_BYTES
        try:
            file.flush()
            os.fsync(file.fileno())
            file.close()
            self._file = None
            digest = self._sha256.hexdigest()
            if self.replace:
                final = _inside(self.folder, self.name)
                # The digest first, under the new file's stamp (a rename keeps it): a crash between
                # the two leaves a digest no file matches, which only costs hashing it again.
                _keep_digest(final, digest, _stamp(self.temp_path), self.own)
                os.replace(self.temp_path, final)
            else:
                final = _claim_name(self.temp_path, self.folder, self._final_names())
                _keep_digest(final, digest, _stamp(final))
            _mark_changed(self.folder)
        except BaseException:
            self.abort()
            raise
        return FileInfo(
            name=final.relative_to(self.folder).as_posix(),
            path=final,
            size=self._size,
            sha256=digest,
            content_type=content_type(final.name, self._head),
            outside_content=not self.own,
        )

    def abort(self) -> None:
        """Drop the upload and its temp file; safe to call more than once."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self.temp_path.unlink(missing_ok=True)
        self._head_checked = True

    def __enter__(self) -> Upload:
        return self

    def __exit__(self, *exc_info: object) -> None:
        # Leaving the block without commit() (an exception, a cancelled
        # stream) must not leave a partial file behind.
        if self._file is not None:
            self.abort()

    def _open_file(self) -> BinaryIO:
        if self._file is None:
            raise FailedPrecondition(f"upload of {self.name!r} is already finished")
        return self._file

    def _check_head(self) -> None:
        self._head_checked = True
        if has_executable_magic(self._head) and not (self.scripts_allowed and self._head.startswith(b"#!")):
            self.abort()
            raise InvalidArgument("content", refused_as_program(self.name, PROGRAM_CONTENT, by_name=False))

    def _numbered_names(self) -> Iterator[str]:
        n = 0
        while True:
            yield numbered_name(self.name, n)
            n += 1


# --- the store ------------------------------------------------------------------------


class FileStore:
    """Files of every session, one folder per session id under ``root``."""

    def __init__(self, root: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes

    def session_dir(self, session_id: str) -> Path:
        """Return the folder of ``session_id`` (not created)."""
        return self.root / normalized_session_id(session_id)

    def begin_upload(self, session_id: str, filename: str) -> Upload:
        """Start a streaming upload; the name is sanitised and checked up front."""
        name = safe_name(filename)
        if has_executable_extension(name):
            raise InvalidArgument(
                "filename", refused_as_program(name, f"{split_extension(name.lower())[1]} is the extension of one")
            )
        folder = self._created_dir(session_id)
        _inside(folder, name)
        return Upload(folder, name, self.max_bytes)

    def begin_write(self, session_id: str, path: str, *, own: bool, scripts_allowed: bool) -> Upload:
        """Start a write of a workspace ``path`` (folders made as needed) that replaces what is
        there when committed. ``scripts_allowed``: the Agent's tools write source code (a script
        by name or by its #! line); native programs are refused whoever writes."""
        if not is_workspace_path(path):
            raise InvalidArgument("header.path", f"{path!r} is not a workspace path (relative, e.g. 'src/app.py')")
        if not scripts_allowed and has_executable_extension(path):
            raise InvalidArgument(
                "header.path", refused_as_program(path, f"{split_extension(path.lower())[1]} is the extension of one")
            )
        folder = self._created_dir(session_id)
        target = _inside(folder, path)
        if target.is_dir():
            raise FailedPrecondition(f"{path!r} is a folder in the workspace, not a file")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise FailedPrecondition(f"a folder of {path!r} is a file in the workspace") from None
        _inside(folder, path)  # again, now that its folders exist
        return Upload(folder, path, self.max_bytes, replace=True, own=own, scripts_allowed=scripts_allowed)

    def size_of(self, session_id: str, path: str) -> int:
        """The bytes of the file at ``path`` (0 when there is none)."""
        try:
            return self._existing_file(session_id, path).stat().st_size
        except (NotFound, InvalidArgument):
            return 0

    def delete_path(self, session_id: str, path: str) -> int:
        """Remove the file at workspace ``path`` (and folders it leaves empty); the bytes freed.
        NotFound when there is no such file."""
        folder = self.session_dir(session_id)
        target = self._existing_file(session_id, path)
        size = target.stat().st_size
        target.unlink()
        _mark_changed(folder)
        (target.parent / DIGEST_DIR / target.name).unlink(missing_ok=True)
        parent = target.parent
        while parent != folder:
            try:
                (parent / DIGEST_DIR).rmdir()
            except OSError:
                pass
            try:
                parent.rmdir()
            except OSError:
                break  # not empty: something else lives there
            parent = parent.parent
        return size

    def save(self, session_id: str, filename: str, data: bytes) -> FileInfo:
        """Store a whole file in one call (an upload with a single chunk)."""
        with self.begin_upload(session_id, filename) as upload:
            upload.write(data)
            return upload.commit()

    def save_image(self, session_id: str, data: bytes) -> FileInfo:
        """Store pasted image bytes verbatim as image_N.<ext>, reusing identical ones."""
        if not data:
            raise InvalidArgument("images", "image is empty")
        if len(data) > self.max_bytes:
            raise ResourceExhausted(f"image exceeds the session file limit of {self.max_bytes} bytes")
        ext = image_extension(data)
        folder = self._created_dir(session_id)
        existing = self._same_image(folder, data)
        if existing is not None:
            return existing
        # Never re-encoded: a PNG keeps its alpha channel, a JPEG its quality.
        names = lambda: self._image_names(folder, ext)  # noqa: E731
        with Upload(folder, f"image.{ext}", self.max_bytes, final_names=names) as upload:
            upload.write(data)
            return upload.commit()

    def open_read(self, session_id: str, name: str) -> BinaryIO:
        """Open a stored file for reading; NotFound when it does not exist."""
        path = self._existing_file(session_id, name)
        try:
            return path.open("rb")
        except FileNotFoundError:
            raise NotFound(f"file {name!r} not found in session {session_id}") from None

    def iter_chunks(self, session_id: str, name: str, chunk_size: int = CHUNK_SIZE) -> Iterator[bytes]:
        """Return an iterator over a stored file's bytes.

        The file is opened now, not at the first next(), so NotFound reaches
        the caller before it starts a response stream.
        """
        file = self.open_read(session_id, name)

        def chunks() -> Iterator[bytes]:
            with file:
                while chunk := file.read(chunk_size):
                    yield chunk

        return chunks()

    def file_info(self, session_id: str, name: str) -> FileInfo:
        """One stored file's info; NotFound when it does not exist."""
        return self._info(self._existing_file(session_id, name), name)

    def file_names(self, session_id: str) -> set[str]:
        """Workspace paths of a session's stored files, without reading them."""
        folder = self.session_dir(session_id)
        return {rel for rel, _ in self._walk(folder)} if folder.is_dir() else set()

    def session_folders(self) -> list[str]:
        """Ids of the sessions that have a folder here."""
        return self._session_folders()

    def list_files(self, session_id: str) -> list[FileInfo]:
        """Return the stored files of a session, every folder's included, sorted by path ([] if none)."""
        folder = self.session_dir(session_id)
        if not folder.is_dir():
            return []
        return [self._info(path, rel) for rel, path in sorted(self._walk(folder))]

    def list_files_unless(self, session_id: str, token: str) -> tuple[str, list[FileInfo] | None]:
        """(the workspace's changes token, its files), or (token, None) when ``token`` is still
        the current one: nothing was written or deleted since the listing that gave it. The token
        is read before the files are, so a change made while they are listed shows next time."""
        folder = self.session_dir(session_id)
        if not folder.is_dir():
            return "", []
        current = _changes_token(folder)
        if token and token == current:
            return current, None
        return current, self.list_files(session_id)

    def delete_session(self, session_id: str) -> bool:
        """Remove a session's folder; return whether there was one."""
        folder = self.session_dir(session_id)
        if not folder.exists():
            return False
        shutil.rmtree(folder, ignore_errors=False)
        return True

    def sweep(self, existing_session_ids: Callable[[list[str]], Collection[str]] | Collection[str]) -> list[str]:
        """Remove folders of sessions that no longer exist; return their ids.

        ``existing_session_ids`` is either the ids that exist, or a callable
        that receives the candidate ids found on disk and returns those of
        them that still exist (one database round trip for the batch).
        Folders whose names are not UUIDs are not ours and are left alone.
        """
        candidates = self._session_folders()
        if not candidates:
            return []
        existing = existing_session_ids(candidates) if callable(existing_session_ids) else existing_session_ids
        alive = {str(i).lower() for i in existing}
        removed = []
        for session_id in candidates:
            if session_id.lower() not in alive:
                shutil.rmtree(self.root / session_id, ignore_errors=True)
                removed.append(session_id)
        return removed

    # --- internals -------------------------------------------------------------------

    def _created_dir(self, session_id: str) -> Path:
        folder = self.session_dir(session_id)
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def _existing_file(self, session_id: str, name: str) -> Path:
        folder = self.session_dir(session_id)
        if not name or not is_workspace_path(name):
            # Only workspace paths can be stored, so anything else (temp files, "..", absolute
            # paths) is a malformed request, not a miss.
            raise InvalidArgument("filename", f"{name!r} is not a stored file name")
        path = _inside(folder, name)
        if path.is_symlink() or not path.is_file():
            raise NotFound(f"file {name!r} not found in session {session_id}")
        return path

    def _session_folders(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(
            entry.name
            for entry in os.scandir(self.root)
            if entry.is_dir(follow_symlinks=False) and _SESSION_ID.fullmatch(entry.name)
        )

    @staticmethod
    def _stored_files(folder: Path) -> Iterator[Path]:
        """The files at the top of ``folder`` (the uploads' level)."""
        for entry in os.scandir(folder):
            if not _reserved(entry.name) and entry.is_file(follow_symlinks=False):
                yield Path(entry.path)

    @staticmethod
    def _walk(folder: Path, prefix: str = "") -> Iterator[tuple[str, Path]]:
        """(workspace path, file) of every stored file under ``folder``; links are not followed."""
        for entry in os.scandir(folder):
            if _reserved(entry.name):
                continue
            rel = f"{prefix}{entry.name}"
            if entry.is_dir(follow_symlinks=False):
                yield from FileStore._walk(Path(entry.path), rel + "/")
            elif entry.is_file(follow_symlinks=False):
                yield rel, Path(entry.path)

    @staticmethod
    def _info(path: Path, name: str | None = None) -> FileInfo:
        # One stat and one read of the kept digest: a listing of a 10,000-file workspace does this
        # for every file, on every turn that uses a file tool.
        size = path.stat().st_size
        kept = _kept(path)
        return FileInfo(
            name=name or path.name,
            path=path,
            size=size,
            sha256=kept[0] if kept is not None else _digest_of(path),
            content_type=content_type(path.name, _head_of(path)),
            outside_content=not (kept is not None and kept[1]),
        )

    def _same_image(self, folder: Path, data: bytes) -> FileInfo | None:
        """The stored image_N file holding exactly ``data``, if there is one."""
        digest: str | None = None
        for path in self._stored_files(folder):
            # Size first: hashing is only needed for the rare same-size file.
            if not _IMAGE_NAME.fullmatch(path.name) or path.stat().st_size != len(data):
                continue
            digest = digest or hashlib.sha256(data).hexdigest()
            info = self._info(path)
            if info.sha256 == digest:
                return info
        return None

    def _image_names(self, folder: Path, ext: str) -> Iterator[str]:
        taken = [int(m[1]) for p in self._stored_files(folder) if (m := _IMAGE_NAME.fullmatch(p.name))]
        n = max(taken, default=0) + 1
        while True:
            yield f"image_{n}.{ext}"
            n += 1

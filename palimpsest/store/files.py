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

import hashlib
import os
import shutil
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import BinaryIO

from palimpsest.shared.content_types import content_type
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
from palimpsest.shared.workspace_paths import is_workspace_path
from palimpsest.store.file_disk import (
    DIGEST_DIR,
    IMAGE_NAME_PATTERN,
    SESSION_ID_PATTERN,
    FileInfo,
    changes_token,
    digest_of,
    head_of,
    image_extension,
    inside,
    kept_digest,
    mark_changed,
    normalized_session_id,
    reserved_name,
)
from palimpsest.store.file_uploads import Upload

DEFAULT_MAX_BYTES = 200 * 1024 * 1024
CHUNK_SIZE = 64 * 1024


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
        inside(folder, name)
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
        target = inside(folder, path)
        if target.is_dir():
            raise FailedPrecondition(f"{path!r} is a folder in the workspace, not a file")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise FailedPrecondition(f"a folder of {path!r} is a file in the workspace") from None
        inside(folder, path)  # again, now that its folders exist
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
        mark_changed(folder)
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
        current = changes_token(folder)
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
        path = inside(folder, name)
        if path.is_symlink() or not path.is_file():
            raise NotFound(f"file {name!r} not found in session {session_id}")
        return path

    def _session_folders(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(
            entry.name
            for entry in os.scandir(self.root)
            if entry.is_dir(follow_symlinks=False) and SESSION_ID_PATTERN.fullmatch(entry.name)
        )

    @staticmethod
    def _stored_files(folder: Path) -> Iterator[Path]:
        """The files at the top of ``folder`` (the uploads' level)."""
        for entry in os.scandir(folder):
            if not reserved_name(entry.name) and entry.is_file(follow_symlinks=False):
                yield Path(entry.path)

    @staticmethod
    def _walk(folder: Path, prefix: str = "") -> Iterator[tuple[str, Path]]:
        """(workspace path, file) of every stored file under ``folder``; links are not followed."""
        for entry in os.scandir(folder):
            if reserved_name(entry.name):
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
        kept = kept_digest(path)
        return FileInfo(
            name=name or path.name,
            path=path,
            size=size,
            sha256=kept[0] if kept is not None else digest_of(path),
            content_type=content_type(path.name, head_of(path)),
            outside_content=not (kept is not None and kept[1]),
        )

    def _same_image(self, folder: Path, data: bytes) -> FileInfo | None:
        """The stored image_N file holding exactly ``data``, if there is one."""
        digest: str | None = None
        for path in self._stored_files(folder):
            # Size first: hashing is only needed for the rare same-size file.
            if not IMAGE_NAME_PATTERN.fullmatch(path.name) or path.stat().st_size != len(data):
                continue
            digest = digest or hashlib.sha256(data).hexdigest()
            info = self._info(path)
            if info.sha256 == digest:
                return info
        return None

    def _image_names(self, folder: Path, ext: str) -> Iterator[str]:
        taken = [int(m[1]) for p in self._stored_files(folder) if (m := IMAGE_NAME_PATTERN.fullmatch(p.name))]
        n = max(taken, default=0) + 1
        while True:
            yield f"image_{n}.{ext}"
            n += 1

"""One streaming upload into a session folder: written to a hidden temp file, its head checked for
programs, then linked under its final name (see palimpsest.store.files)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from palimpsest.shared.content_types import content_type
from palimpsest.shared.errors import (
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
)
from palimpsest.shared.file_policy import (
    PROGRAM_CONTENT,
    has_executable_magic,
    refused_as_program,
)
from palimpsest.store.file_disk import (
    HEAD_BYTES,
    TEMP_PREFIX,
    FileInfo,
    claim_name,
    file_stamp,
    inside,
    keep_digest,
    mark_changed,
    numbered_name,
)


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
                final = inside(self.folder, self.name)
                # The digest first, under the new file's stamp (a rename keeps it): a crash between
                # the two leaves a digest no file matches, which only costs hashing it again.
                keep_digest(final, digest, file_stamp(self.temp_path), self.own)
                os.replace(self.temp_path, final)
            else:
                final = claim_name(self.temp_path, self.folder, self._final_names())
                keep_digest(final, digest, file_stamp(final))
            mark_changed(self.folder)
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

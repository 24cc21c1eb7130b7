"""Reading a file of the Agent's own host for share_file, as an attacker would not like.

A model's arguments are untrusted input (a prompt injection can ask for any path). A path must be
absolute and hold no `..`; its real path must lie under one of the allowed roots and name a regular
file, not a symbolic link, folder, device, pipe or socket — all judged before anything is opened,
since opening a device can act. The file is then opened without following a final link and judged
again by what was opened (the name may have been swapped meanwhile): a regular file with one name
only (a hard link can bring a file from anywhere into a folder), really under a root, within the
size cap. The copy is checked against the size and modification time seen at the open, so a file
that changes while copied is refused, not shared half-written. Blocking calls: the tool runs them
in a thread.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

CHUNK = 1 << 20
# Open flags: never follow a link at the last step, never block on a FIFO, never become a tty's.
_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


class Refused(Exception):
    """A file that may not be shared; the message says why, for the model to read."""


@dataclass
class OpenedFile:
    fd: int
    real_path: str
    size: int
    mtime_ns: int

    def close(self) -> None:
        os.close(self.fd)


def _real_path(fd: int, path: str) -> str:
    """Where the opened file really is: the kernel's answer when it gives one (Linux)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.path.realpath(path)


def _inside(real: str, roots: Sequence[Path]) -> bool:
    for root in roots:
        base = os.path.realpath(root)
        if real == base or real.startswith(base.rstrip(os.sep) + os.sep):
            return True
    return False


def _check_kind(raw: str, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise Refused(f"{raw} is a symbolic link: share the file it points to, by its own path")
    if stat.S_ISDIR(st.st_mode):
        raise Refused(f"{raw} is a folder: share its files one by one, or an archive of it")
    if not stat.S_ISREG(st.st_mode):
        raise Refused(f"{raw} is not a regular file (a device, pipe or socket)")


def open_shareable(raw: str, roots: Sequence[Path], max_bytes: int) -> OpenedFile:
    """The file at `raw`, opened for reading, or Refused saying why it may not be shared."""
    if "\x00" in raw:
        raise Refused("the path holds a NUL character")
    if not raw.startswith("/"):
        raise Refused(f"{raw!r} is not an absolute path: give the whole path, starting with /")
    if ".." in PurePosixPath(raw).parts:
        raise Refused(f"{raw!r} goes up with '..': give the file's own absolute path")
    allowed = ", ".join(str(r) for r in roots) or "none configured"

    def outside(real: str) -> Refused:
        where = f" (it resolves to {real})" if real != os.path.normpath(raw) else ""
        return Refused(
            f"{raw}{where} is outside the folders files may be shared from: {allowed} (PALIMPSEST_SHARE_FILE_ROOTS)"
        )

    # Judged by name before anything is opened: opening a device can act (rewind a tape, arm a watchdog).
    if not _inside(os.path.realpath(raw), roots):
        raise outside(os.path.realpath(raw))
    try:
        named = os.lstat(raw)
    except FileNotFoundError:
        raise Refused(f"{raw} does not exist") from None
    except OSError as exc:
        raise Refused(f"{raw} cannot be read ({exc.strerror or exc})") from None
    _check_kind(raw, named)
    try:
        fd = os.open(raw, _OPEN_FLAGS)
    except FileNotFoundError:
        raise Refused(f"{raw} does not exist") from None
    except PermissionError:
        raise Refused(f"{raw} cannot be read (permission denied)") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refused(f"{raw} is a symbolic link: share the file it points to, by its own path") from None
        raise Refused(f"{raw} cannot be opened ({exc.strerror or exc})") from None
    try:
        # Judged again by what was opened: the name may have been swapped since.
        st = os.fstat(fd)
        _check_kind(raw, st)
        real = _real_path(fd, raw)
        if not _inside(real, roots):
            raise outside(real)
        if st.st_nlink > 1:
            raise Refused(f"{raw} has {st.st_nlink} names (hard links): copy it to a file of its own first")
        if st.st_size > max_bytes:
            raise Refused(
                f"{raw} is {st.st_size / 2**20:.1f} MB; share_file copies at most "
                f"{max_bytes / 2**20:g} MB (PALIMPSEST_SHARE_FILE_MAX_MB)"
            )
        return OpenedFile(fd, real, st.st_size, st.st_mtime_ns)
    except BaseException:
        os.close(fd)
        raise


def read_chunk(opened: OpenedFile, copied: int) -> bytes:
    """The next piece of the file; b"" at its end. Refused when it is no longer the file that was
    opened (longer, shorter, or modified since)."""
    chunk = os.read(opened.fd, CHUNK)
    if copied + len(chunk) > opened.size:
        raise Refused("the file grew while it was being copied: share it once it is finished")
    if not chunk:
        st = os.fstat(opened.fd)
        if copied != opened.size or st.st_size != opened.size or st.st_mtime_ns != opened.mtime_ns:
            raise Refused("the file changed while it was being copied: share it once it is finished")
    return chunk

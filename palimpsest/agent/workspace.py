"""A session's workspace as the Agent's tools see it: a local mirror of the files the SessionStore
keeps for the session. The store is the source of truth — a turn on another Agent replica sees what a
tool wrote here, and an Agent restart loses nothing — and the mirror is a cache: synced from the store
when a turn first needs it, written through on every tool write, and compared with what it was after
a command so that what the command changed goes back to the store.

Paths are workspace paths (palimpsest.shared.workspace_paths), resolved before they reach here. The
mirror holds regular files and folders only: whatever else a command leaves (a symbolic link, a
pipe) is not kept, and is removed, so reading the mirror never follows a link out of it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import stat
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from palimpsest.shared.auth import vouching_metadata
from palimpsest.shared.errors import PalimpsestError
from palimpsest.shared.settings import Settings
from palimpsest.shared.stubs import AsyncStoreStub
from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as store_pb

log = logging.getLogger("palimpsest.agent.workspace")

CHUNK = 256 * 1024
# What one command may hand back to the store: past these, the rest is not kept (and said so).
WRITE_BACK_MAX_FILES = 2_000
# Uploads of a command's changes in flight at once.
WRITE_BACK_CONCURRENCY = 8
# Downloads from the store in flight at once while a mirror syncs.
SYNC_CONCURRENCY = 8


@dataclass
class Entry:
    """A file as the store has it, and the mirror's copy as it was left (to spot a command's changes)."""

    sha256: str
    size: int
    outside: bool  # the store does not know its content to be the conversation's own
    stamp: tuple[int, int, int]  # inode, size, mtime of the mirror's copy


@dataclass
class WriteBack:
    """What a command changed, as the store now has it."""

    kept: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (path, why)

    def summary(self) -> str:
        parts = []
        if self.kept:
            parts.append(f"written to the workspace: {_listed(self.kept)}")
        if self.deleted:
            parts.append(f"deleted from it: {_listed(self.deleted)}")
        if self.refused:
            parts.append(
                "not kept: "
                + "; ".join(f"{path} ({why})" for path, why in self.refused[:20])
                + (f"; and {len(self.refused) - 20} more" if len(self.refused) > 20 else "")
            )
        return "\n".join(parts)


def _listed(paths: list[str], limit: int = 30) -> str:
    more = f", and {len(paths) - limit} more" if len(paths) > limit else ""
    return ", ".join(paths[:limit]) + more


def _stamp(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_ino, st.st_size, st.st_mtime_ns


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class Workspace:
    """One session's mirror. Tools of a turn and of its sub-agents share it, one at a time."""

    def __init__(self, store: AsyncStoreStub, settings: Settings, session_id: str, folder: Path) -> None:
        self.store = store
        self.settings = settings
        self.session_id = session_id
        self.folder = folder
        self.files: dict[str, Entry] = {}
        self.lock = asyncio.Lock()
        self._synced_for = ""  # the turn the mirror was last synced for
        # The store's changes token the mirror was last synced whole at: a turn on a workspace
        # nobody changed since costs one small call, not a listing of every file.
        self._token = ""

    @property
    def _vouch(self) -> tuple[tuple[str, str], ...]:
        # A tool's write: the store lets the services keep source code and content of the conversation's own.
        return vouching_metadata(self.settings.auth_enabled, self.settings.jwt_secret)

    # -- reading the store into the mirror ---------------------------------------------------------
    async def ready(self, turn: str) -> None:
        """The mirror as the store has the workspace, synced once per turn (the turn's own writes
        keep it current after that)."""
        if self._synced_for == turn:
            return
        await self.sync()
        self._synced_for = turn

    async def sync(self) -> None:
        """One ListFiles, one thread hop to stat the whole mirror, downloads of what differs (a few
        at once): a turn on a large workspace that changed little pays for little more than the listing."""
        reply = await self.store.ListFiles(
            store_pb.ListFilesRequest(session_id=self.session_id, unless_token=self._token)
        )
        if reply.unchanged:  # nothing written or deleted since the mirror was last synced whole
            return
        self._token = ""  # until this sync has completed
        listed = reply.files
        remote = {f.name: f for f in listed}
        first = not self._synced_for
        await asyncio.to_thread(self.folder.mkdir, parents=True, exist_ok=True)
        gone = [p for p in self.files if p not in remote]
        for path in gone:
            self.files.pop(path)
        stale = await asyncio.to_thread(self._stale, listed)
        gate = asyncio.Semaphore(SYNC_CONCURRENCY)

        async def download(info: common_pb2.FileInfo) -> None:
            async with gate:
                await self._download(info)

        await asyncio.gather(*(download(info) for info in stale))
        if first or gone or stale:  # leftovers of an earlier process, files the store no longer has
            await asyncio.to_thread(self._prune)
        self._token = reply.token

    def _stale(self, listed: Iterable[common_pb2.FileInfo]) -> list[common_pb2.FileInfo]:
        """The store's files whose mirror copy is missing or not the one the store has."""
        stale = []
        for info in listed:
            known = self.files.get(info.name)
            if known is None or known.sha256 != info.sha256 or not self._same(info.name, known):
                stale.append(info)
        return stale

    def _same(self, path: str, entry: Entry) -> bool:
        try:
            st = os.lstat(self.folder / path)
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and _stamp(st) == entry.stamp

    async def _download(self, info: common_pb2.FileInfo) -> None:
        target = self.folder / info.name
        await asyncio.to_thread(self._clear_way, info.name)
        temp = target.parent / f".palimpsest-{os.getpid()}-{id(info)}.part"
        with temp.open("wb") as out:
            async for part in self.store.GetFile(store_pb.GetFileRequest(session_id=self.session_id, name=info.name)):
                if part.chunk:
                    await asyncio.to_thread(out.write, part.chunk)
        os.replace(temp, target)
        self.files[info.name] = Entry(info.sha256, info.size, info.outside_content, _stamp(os.lstat(target)))

    def _clear_way(self, path: str) -> None:
        """Folders up to ``path`` exist as folders, and nothing but a file is at ``path``."""
        parent = self.folder
        for part in path.split("/")[:-1]:
            parent = parent / part
            if parent.is_symlink() or (parent.exists() and not parent.is_dir()):
                parent.unlink()
            parent.mkdir(exist_ok=True)
        target = self.folder / path
        if target.is_symlink() or target.is_file():
            return
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():  # a pipe, a socket
            target.unlink()

    def _prune(self) -> None:
        """Remove from the mirror what the store does not have (a command's leftovers)."""
        for root, dirs, names in os.walk(self.folder, topdown=False):
            for name in names:
                path = Path(root) / name
                rel = path.relative_to(self.folder).as_posix()
                if rel not in self.files or not stat.S_ISREG(os.lstat(path).st_mode):
                    path.unlink(missing_ok=True)
            for name in dirs:
                path = Path(root) / name
                if path.is_symlink():
                    path.unlink()
                else:
                    try:
                        path.rmdir()  # only when empty: the store keeps no empty folders
                    except OSError:
                        pass

    # -- reading the mirror --------------------------------------------------------------------------
    def entry(self, path: str) -> Entry | None:
        return self.files.get(path)

    def is_folder(self, path: str) -> bool:
        prefix = path.rstrip("/") + "/"
        return not path or any(p.startswith(prefix) for p in self.files)

    def read_bytes(self, path: str, limit: int | None = None) -> bytes:
        """The mirror's copy, opened without following a link (the mirror holds none; this makes sure)."""
        fd = os.open(self.folder / path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            return f.read() if limit is None else f.read(limit)

    # -- writing through -------------------------------------------------------------------------------
    async def write(self, path: str, data: bytes, *, outside: bool = False) -> common_pb2.FileInfo:
        """Store ``data`` at ``path`` (replacing any file there), then mirror it. A refusal of the
        store (its caps, the owner's quota, the program policy) raises its PalimpsestError."""
        header = store_pb.PutFileHeader(session_id=self.session_id, path=path, from_tool=True, outside_content=outside)

        async def parts() -> AsyncIterator[store_pb.PutFileRequest]:
            yield store_pb.PutFileRequest(header=header)
            for start in range(0, len(data), CHUNK):
                yield store_pb.PutFileRequest(chunk=data[start : start + CHUNK])

        info = (await self.store.PutFile(parts(), metadata=self._vouch)).file
        await asyncio.to_thread(self._mirror, path, data, info)
        return info

    def _mirror(self, path: str, data: bytes, info: common_pb2.FileInfo) -> None:
        self._clear_way(path)
        target = self.folder / path
        temp = target.parent / f".palimpsest-{os.getpid()}.part"
        temp.write_bytes(data)
        os.replace(temp, target)
        self.files[path] = Entry(info.sha256, info.size, info.outside_content, _stamp(os.lstat(target)))

    # -- what a command changed ------------------------------------------------------------------------
    def changes(self) -> tuple[dict[str, Path], list[str], list[tuple[str, str]]]:
        """(files new or changed, paths removed, things not kept) in the mirror since it was left."""
        changed: dict[str, Path] = {}
        odd: list[tuple[str, str]] = []
        seen: set[str] = set()
        for root, dirs, names in os.walk(self.folder):
            for name in [*names, *(d for d in dirs if os.path.islink(os.path.join(root, d)))]:
                path = Path(root) / name
                rel = path.relative_to(self.folder).as_posix()
                st = os.lstat(path)
                if not stat.S_ISREG(st.st_mode):
                    odd.append((rel, "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"))
                    continue
                seen.add(rel)
                known = self.files.get(rel)
                if known is None or _stamp(st) != known.stamp:
                    if known is None or _sha256(path) != known.sha256:
                        changed[rel] = path
                    else:
                        known.stamp = _stamp(st)  # touched, not changed
        removed = [p for p in self.files if p not in seen]
        return changed, removed, odd

    async def write_back(self, *, outside: bool) -> WriteBack:
        """Hand a command's changes to the store: new and changed files written (``outside``: the
        command had the network, so their content came from outside), removed ones deleted. What the
        store refuses, and what is not a regular file, is not kept and leaves the mirror too."""
        from palimpsest.shared.workspace_paths import BadPath, workspace_path

        changed, removed, odd = await asyncio.to_thread(self.changes)
        result = WriteBack(refused=list(odd))
        for path in sorted(changed)[WRITE_BACK_MAX_FILES:]:
            result.refused.append((path, f"past the {WRITE_BACK_MAX_FILES:,} files one command may keep"))
            changed.pop(path)
        gate = asyncio.Semaphore(WRITE_BACK_CONCURRENCY)

        async def keep(path: str, local: Path) -> None:
            async with gate:
                try:
                    if workspace_path(path) != path:
                        raise BadPath("not a plain workspace path")
                    data = await asyncio.to_thread(local.read_bytes)
                    await self.write(path, data, outside=outside)
                    result.kept.append(path)
                except BadPath as exc:
                    result.refused.append((path, str(exc)))
                except PalimpsestError as exc:
                    result.refused.append((path, str(exc)))
                    self.files.pop(path, None)

        async def delete(path: str) -> None:
            async with gate:
                try:
                    await self.store.DeleteFile(store_pb.DeleteFileRequest(session_id=self.session_id, name=path))
                except PalimpsestError as exc:
                    if exc.code.name != "NOT_FOUND":
                        result.refused.append((path, f"could not be deleted: {exc}"))
                        return
                self.files.pop(path, None)
                result.deleted.append(path)

        await asyncio.gather(*(keep(p, f) for p, f in changed.items()), *(delete(p) for p in removed))
        await asyncio.to_thread(self._prune)
        result.kept.sort()
        result.deleted.sort()
        return result


class Workspaces:
    """The mirrors of this Agent, one folder per session under ``root``, the least recently used
    ones dropped past ``keep`` sessions (the store keeps everything; a dropped mirror is synced
    again when needed)."""

    def __init__(self, store: AsyncStoreStub, settings: Settings, root: Path, keep: int = 64) -> None:
        self.store = store
        self.settings = settings
        self.root = root
        self.keep = keep
        self._open: OrderedDict[str, Workspace] = OrderedDict()

    def get(self, session_id: str) -> Workspace:
        workspace = self._open.get(session_id)
        if workspace is None:
            workspace = Workspace(self.store, self.settings, session_id, self.root / session_id)
            self._open[session_id] = workspace
            while len(self._open) > self.keep:
                _, dropped = self._open.popitem(last=False)
                if not dropped.lock.locked():
                    shutil.rmtree(dropped.folder, ignore_errors=True)
        self._open.move_to_end(session_id)
        return workspace

"""Files sent to a session: streamed with SessionStore.PutFile in pieces (the store enforces its size
cap while receiving), then named in the turn's `attachments`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from palimpsest.cli.app import App
from palimpsest.cli.errors import CliError
from palimpsest.v1 import agent_pb2, common_pb2
from palimpsest.v1 import session_store_pb2 as pb

UPLOAD_CHUNK = 256 * 1024


def _pieces(header: pb.PutFileHeader, file: BinaryIO) -> Iterator[pb.PutFileRequest]:
    yield pb.PutFileRequest(header=header)
    with file:
        while chunk := file.read(UPLOAD_CHUNK):
            yield pb.PutFileRequest(chunk=chunk)


def local_file(raw: str) -> tuple[Path, BinaryIO]:
    """The file at `raw` (a path as typed: quotes and ~ allowed), open for reading: a missing file
    or a folder fails here, before any call is made."""
    path = Path(raw.strip().strip("'\"")).expanduser()
    try:
        file = path.open("rb")
    except OSError as err:
        raise CliError(f"cannot read {path}: {err.strerror or err}") from None
    if not path.is_file():
        file.close()
        raise CliError(f"cannot read {path}: not a regular file")
    return path, file


def upload(app: App, session_id: str, local: tuple[Path, BinaryIO]) -> common_pb2.FileInfo:
    """Stream an opened local file to the session; what the store kept, under the name it gave it
    (a taken name gets a number: report_1.pdf)."""
    path, file = local
    header = pb.PutFileHeader(session_id=session_id, filename=path.name)
    return app.conn.store().PutFile(_pieces(header, file)).file


def new_session(app: App, profile_id: str = "") -> str:
    """A session made now, for files that must be uploaded before its first message."""
    profile = profile_id or app.conn.agent().ListProfiles(agent_pb2.ListProfilesRequest()).default_profile_id
    return app.conn.store().CreateSession(pb.CreateSessionRequest(profile_id=profile or "default")).session.id

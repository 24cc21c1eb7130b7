"""Files a turn carries: names of files already uploaded to the session (SessionStore.PutFile) and
small files sent inline with the request.

The whole request is checked before anything is created or written (`check_request`: the upload
policy), the inline files are stored before the turn starts, so a refusal is a plain status and
never half a turn, and the model is told where the files are (`uploads_notice`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from palimpsest.shared.errors import InvalidArgument, NotFound, ResourceExhausted
from palimpsest.shared.file_policy import (
    PROGRAM_CONTENT,
    has_executable_magic,
    refused_as_program,
    safe_name,
    upload_name_problem,
)
from palimpsest.shared.stubs import AsyncStoreStub
from palimpsest.v1 import agent_pb2
from palimpsest.v1 import session_store_pb2 as store_pb

# A turn names at most this many files: more is a folder, better zipped or uploaded and listed.
MAX_ATTACHMENTS = 20
# Inline files travel in the request (within the 64 MB gRPC message); bigger ones stream with PutFile.
INLINE_MAX_BYTES = 16 * 1024 * 1024
UPLOAD_CHUNK = 1 << 20


def check_request(request: agent_pb2.RunStreamRequest | agent_pb2.RunRequest) -> None:
    """Refuse a turn's files that break the upload policy, naming the field; changes nothing."""
    names, inline = list(request.attachments), list(request.inline_attachments)
    if not names and not inline:
        return
    if request.hidden:
        raise InvalidArgument("attachments", "hidden turns carry machine payloads, not files")
    if len(names) + len(inline) > MAX_ATTACHMENTS:
        raise ResourceExhausted(
            f"attachments: {len(names) + len(inline)} files in one turn; at most "
            f"{MAX_ATTACHMENTS} (attachments and inline_attachments together)"
        )
    if names and not request.session_id:
        raise InvalidArgument(
            "attachments",
            "a new session has no files yet: send them in inline_attachments, "
            "or create the session and upload them with PutFile first",
        )
    for i, name in enumerate(names):
        if not _is_stored_name(name):
            raise InvalidArgument(
                f"attachments[{i}]",
                f"{name[:300]!r} is not a stored file name: give FileInfo.name as PutFile or ListFiles returned it",
            )
    total = sum(len(f.data) for f in inline)
    if total > INLINE_MAX_BYTES:
        raise ResourceExhausted(
            f"inline_attachments: {total / 2**20:.1f} MB together; a turn carries at most "
            f"{INLINE_MAX_BYTES // 2**20} MB inline: upload bigger files with "
            "SessionStore.PutFile and name them in attachments"
        )
    for i, f in enumerate(inline):
        problem = upload_name_problem(f.filename)
        if problem:
            raise InvalidArgument(f"inline_attachments[{i}].filename", problem)
        if has_executable_magic(f.data[:8]):
            raise InvalidArgument(
                f"inline_attachments[{i}].data", refused_as_program(f.filename, PROGRAM_CONTENT, by_name=False)
            )


def _is_stored_name(name: str) -> bool:
    if not name or "\x00" in name:
        return False
    try:
        return safe_name(name) == name
    except InvalidArgument:
        return False


async def store_attachments(
    store: AsyncStoreStub, session_id: str, request: agent_pb2.RunStreamRequest | agent_pb2.RunRequest
) -> list[str]:
    """The stored names of the turn's files, in the request's order (each once): the named ones
    checked to exist, then the inline ones stored (a name taken gets a number: report_1.pdf)."""
    names = list(dict.fromkeys(request.attachments))
    if names:
        listed = await store.ListFiles(store_pb.ListFilesRequest(session_id=session_id))
        stored = {f.name for f in listed.files}
        for i, name in enumerate(request.attachments):
            if name not in stored:
                raise NotFound(
                    f"attachments[{i}]: session {session_id} has no file {name!r}; upload it with "
                    "PutFile first (ListFiles lists what it has)"
                )
    for f in request.inline_attachments:
        header = store_pb.PutFileHeader(session_id=session_id, filename=f.filename)
        reply = await store.PutFile(upload_requests(header, f.data))
        if reply.file.name not in names:
            names.append(reply.file.name)
    return names


async def upload_requests(header: store_pb.PutFileHeader, data: bytes) -> AsyncIterator[store_pb.PutFileRequest]:
    """Bytes held in memory as PutFile's stream: the header, then pieces of UPLOAD_CHUNK."""
    yield store_pb.PutFileRequest(header=header)
    for start in range(0, len(data), UPLOAD_CHUNK):
        yield store_pb.PutFileRequest(chunk=data[start : start + UPLOAD_CHUNK])


def uploads_notice(session_id: str, names: Sequence[str]) -> str:
    """Where the turn's files are, appended to the message the model sees: their workspace paths,
    which the file tools take as they are."""
    if not names:
        return ""
    lines = "\n".join(f"- {name}" for name in names)
    return f"[Files for this message, in the workspace:\n{lines}]"

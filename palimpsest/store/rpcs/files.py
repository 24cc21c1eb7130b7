"""A session's files: upload (streamed), read, list and delete."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable

import grpc

from palimpsest.shared.auth import Identity, caller, vouched_by_services
from palimpsest.shared.errors import InvalidArgument, ResourceExhausted
from palimpsest.shared.file_policy import unseen_character_problem
from palimpsest.shared.validation import first_nul, first_out_of_range
from palimpsest.store.file_disk import FileInfo
from palimpsest.store.file_uploads import Upload
from palimpsest.store.repository.access import parse_session_id
from palimpsest.store.rpcs.base import StoreRpcs
from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as pb

FILE_CHUNK = 64 * 1024


class FileRpcs(StoreRpcs):
    """A session's files: upload (streamed), read, list and delete."""

    async def PutFile(
        self,
        request_iterator: AsyncIterator[pb.PutFileRequest],
        context: grpc.aio.ServicerContext[pb.PutFileRequest, pb.PutFileResponse],
    ) -> pb.PutFileResponse:
        identity = caller()
        first = await anext(aiter(request_iterator), None)
        if first is None or not first.HasField("header"):
            raise InvalidArgument("header", "the first message of a PutFile stream must carry the header")
        header = first.header
        field = first_nul(header, deep=True, prefix="header.")
        if field:
            raise InvalidArgument(field, "must not contain NUL characters")
        out_of_range = first_out_of_range(header, "header.")  # (a streamed request: the interceptor checks none)
        if out_of_range:
            raise InvalidArgument(*out_of_range)
        session_id = parse_session_id(header.session_id, "header.session_id")
        session = await self.repo.sessions.get_session(identity, session_id)
        from_tool = header.from_tool and (
            identity.is_service
            or vouched_by_services(
                context.invocation_metadata(), enabled=self.settings.auth_enabled, secret=self.settings.jwt_secret
            )
        )
        if header.path:
            return await self._write_path(identity, session_id, header, request_iterator, from_tool=from_tool)
        reply = await self._put_file(identity, session_id, header, request_iterator)
        if not (session["untrusted_ingested"] or from_tool):
            # An upload or a pasted image is content from outside, as a tool's output is: the
            # session's sub-agents are clamped, what is recalled from it is fenced, and tools with
            # effects outside the conversation are refused from now on.
            await self.repo.sessions.mark_untrusted(session_id)
        return reply

    async def _put_file(
        self,
        identity: Identity,
        session_id: uuid.UUID,
        header: pb.PutFileHeader,
        request_iterator: AsyncIterator[pb.PutFileRequest],
    ) -> pb.PutFileResponse:
        if header.kind == pb.FILE_KIND_IMAGE:
            data = bytearray()
            async for part in request_iterator:
                data.extend(part.chunk)
                if len(data) > self.files.max_bytes:
                    raise ResourceExhausted(f"image exceeds the {self.files.max_bytes}-byte file limit")
            before = await asyncio.to_thread(self.files.file_names, str(session_id))
            await self.repo.usage.reserve_file_bytes(identity, session_id, len(data))
            info = await asyncio.to_thread(self.files.save_image, str(session_id), bytes(data))
            deduplicated = info.name in before
            if not deduplicated:
                await self.repo.usage.add_file_bytes(session_id, info.size)
            return pb.PutFileResponse(file=file_info(info), deduplicated=deduplicated)
        if not header.filename:
            raise InvalidArgument("header.filename", "required")
        if problem := unseen_character_problem(header.filename):  # refused, not renamed quietly
            raise InvalidArgument("header.filename", problem)
        upload = await begun(asyncio.to_thread(self.files.begin_upload, str(session_id), header.filename))
        written = 0
        try:
            async for part in request_iterator:
                if part.HasField("header"):
                    raise InvalidArgument("header", "only the first message may carry a header")
                await asyncio.to_thread(upload.write, part.chunk)
                written += len(part.chunk)
            await self.repo.usage.reserve_file_bytes(identity, session_id, written)
            info = await asyncio.to_thread(upload.commit)
        except BaseException:
            await asyncio.to_thread(upload.abort)
            raise
        await self.repo.usage.add_file_bytes(session_id, info.size)
        return pb.PutFileResponse(file=file_info(info))

    async def _write_path(
        self,
        identity: Identity,
        session_id: uuid.UUID,
        header: pb.PutFileHeader,
        request_iterator: AsyncIterator[pb.PutFileRequest],
        *,
        from_tool: bool,
    ) -> pb.PutFileResponse:
        """A workspace write: the file at ``header.path`` replaced whole. Only the services' tool
        writes may keep source code, or count as the conversation's own content; a write by anyone
        else is an upload (it taints the session)."""
        if header.filename or header.kind != pb.FILE_KIND_UNSPECIFIED:
            raise InvalidArgument("header.path", "a write at a path takes neither filename nor kind")
        sid = str(session_id)
        upload = await begun(
            asyncio.to_thread(
                self.files.begin_write,
                sid,
                header.path,
                own=from_tool and not header.outside_content,
                scripts_allowed=from_tool,
            )
        )
        try:
            async for part in request_iterator:
                if part.HasField("header"):
                    raise InvalidArgument("header", "only the first message may carry a header")
                await asyncio.to_thread(upload.write, part.chunk)
            replaced = await asyncio.to_thread(self.files.size_of, sid, header.path)
            await self.repo.usage.reserve_file_bytes(identity, session_id, max(0, upload.size - replaced))
            info = await asyncio.to_thread(upload.commit)
        except BaseException:
            await asyncio.to_thread(upload.abort)
            raise
        await self.repo.usage.add_file_bytes(session_id, info.size - replaced)
        if not from_tool:
            await self.repo.sessions.mark_untrusted(session_id)  # (a no-op once marked)
        return pb.PutFileResponse(file=file_info(info))

    async def DeleteFile(
        self,
        request: pb.DeleteFileRequest,
        context: grpc.aio.ServicerContext[pb.DeleteFileRequest, pb.DeleteFileResponse],
    ) -> pb.DeleteFileResponse:
        identity = caller()
        session_id = parse_session_id(request.session_id)
        if not request.name:
            raise InvalidArgument("name", "required")
        await self.repo.sessions.get_session(identity, session_id)
        freed = await asyncio.to_thread(self.files.delete_path, str(session_id), request.name)
        await self.repo.usage.add_file_bytes(session_id, -freed)
        return pb.DeleteFileResponse(freed=freed)

    async def GetFile(
        self, request: pb.GetFileRequest, context: grpc.aio.ServicerContext[pb.GetFileRequest, pb.GetFileResponse]
    ) -> AsyncIterator[pb.GetFileResponse]:
        identity = caller()
        session_id = parse_session_id(request.session_id)
        if not request.name:
            raise InvalidArgument("name", "required")
        await self.repo.sessions.get_session(identity, session_id)
        info = await asyncio.to_thread(self.files.file_info, str(session_id), request.name)
        chunks = await asyncio.to_thread(self.files.iter_chunks, str(session_id), request.name, FILE_CHUNK)
        yield pb.GetFileResponse(info=file_info(info))
        while True:
            chunk = await asyncio.to_thread(next, chunks, None)
            if chunk is None:
                break
            yield pb.GetFileResponse(chunk=chunk)

    async def ListFiles(
        self, request: pb.ListFilesRequest, context: grpc.aio.ServicerContext[pb.ListFilesRequest, pb.ListFilesResponse]
    ) -> pb.ListFilesResponse:
        identity = caller()
        session_id = parse_session_id(request.session_id)
        await self.repo.sessions.get_session(identity, session_id)
        token, files = await asyncio.to_thread(self.files.list_files_unless, str(session_id), request.unless_token)
        if files is None:
            return pb.ListFilesResponse(token=token, unchanged=True)
        return pb.ListFilesResponse(files=[file_info(f) for f in files], token=token)


async def begun(starting: Awaitable[Upload]) -> Upload:
    """An upload whose temp file a thread is creating: if the call is cancelled meanwhile, the thread
    still finishes, and the upload it made is dropped then instead of left behind on disk."""
    task = asyncio.ensure_future(starting)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:

        def drop(done: asyncio.Future) -> None:
            if not done.cancelled() and done.exception() is None:
                done.result().abort()

        task.add_done_callback(drop)
        raise


def file_info(info: FileInfo) -> common_pb2.FileInfo:
    # The path is the name within the session's folder: where the store keeps its files is its
    # own business (and the absolute path named the session id to anyone shown it).
    return common_pb2.FileInfo(
        name=info.name,
        path=info.name,
        size=info.size,
        sha256=info.sha256,
        content_type=info.content_type,
        outside_content=info.outside_content,
    )

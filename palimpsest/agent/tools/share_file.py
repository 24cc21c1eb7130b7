"""share_file: copy a file of the Agent's host into the session's files and give the user its link."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import PurePosixPath
from typing import Any

from palimpsest.agent.local_files import OpenedFile, Refused, open_shareable, read_chunk
from palimpsest.agent.tools.base import Reach, ToolContext, ToolResult
from palimpsest.agent.tools.common import ToolInputError, error, text_arg
from palimpsest.shared.auth import vouching_metadata
from palimpsest.shared.errors import PalimpsestError
from palimpsest.shared.file_policy import file_link
from palimpsest.v1 import agent_pb2, common_pb2
from palimpsest.v1 import session_store_pb2 as store_pb


async def copy_to_session(ctx: ToolContext, opened: OpenedFile, name: str) -> common_pb2.FileInfo:
    """Stream the opened file into the session with PutFile. A file that changes on the way cancels
    the upload (the store keeps nothing of it) and is Refused."""
    changed: list[Refused] = []

    async def parts() -> AsyncIterator[store_pb.PutFileRequest]:
        yield store_pb.PutFileRequest(
            header=store_pb.PutFileHeader(session_id=ctx.session_id, filename=name, from_tool=True)
        )
        copied = 0
        while True:
            try:
                chunk = await asyncio.to_thread(read_chunk, opened, copied)
            except Refused as exc:
                changed.append(exc)
                raise  # gRPC cancels a call whose request stream fails: never half a file
            if not chunk:
                return
            copied += len(chunk)
            yield store_pb.PutFileRequest(chunk=chunk)

    try:
        # The services' vouch: the copy's content reaches the model only through a later tool result
        # (which taints then), so storing it leaves the conversation as trusted as it was.
        return (
            await ctx.store.PutFile(
                parts(), metadata=vouching_metadata(ctx.settings.auth_enabled, ctx.settings.jwt_secret)
            )
        ).file
    except (asyncio.CancelledError, PalimpsestError):
        if changed:  # our own cancellation, not a Stop
            raise changed[0] from None
        raise


class ShareFileTool:
    name = "share_file"
    reach = Reach.OUTSIDE  # a file of the Agent's host, made downloadable
    description = (
        "Give the user a file from this machine: copies it into this session's files and returns a "
        "download link. `source` must be an absolute path to a regular file in a folder files may be "
        "shared from; `name` optionally renames it in the session."
    )
    parameters = {
        "type": "object",
        "properties": {
            "source": {"type": "string", "description": "Absolute path of the file, e.g. /work/out/report.pdf"},
            "name": {"type": "string", "description": "Its name in the session (default: the file's own)."},
        },
        "required": ["source"],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            source = text_arg(args, "source", required=True)
            name = text_arg(args, "name", default=PurePosixPath(source).name)
        except ToolInputError as exc:
            return error(f"share_file: {exc}")
        if not ctx.session_id:
            return error("share_file: this run has no stored session to share files in.")
        settings = ctx.settings
        try:
            opened = await asyncio.to_thread(
                open_shareable, source, settings.share_file_roots, settings.share_file_max_bytes
            )
        except Refused as exc:
            return error(f"share_file: {exc}")
        try:
            info = await copy_to_session(ctx, opened, name)
        except Refused as exc:
            return error(f"share_file: {source}: {exc}")
        finally:
            await asyncio.to_thread(opened.close)
        link = file_link(ctx.session_id, info.name)
        ctx.events.file_shared(
            agent_pb2.FileShared(name=info.name, link=link, content_type=info.content_type, size=info.size)
        )
        # Our own words about the file, not its content: nothing untrusted reaches the context.
        return ToolResult(
            content=f"Shared {source} as {info.name} ({info.size:,} bytes, {info.content_type}). "
            f"The user can download it at {link}",
            untrusted=False,
            files=[info.name],
            metadata={"name": info.name, "link": link, "size": info.size, "sha256": info.sha256},
        )

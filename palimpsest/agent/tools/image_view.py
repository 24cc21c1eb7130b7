"""image_view: look at an image stored with this session (a pasted image, or one a tool saved)."""

from __future__ import annotations

import asyncio
from typing import Any

from palimpsest.agent.tools.base import Reach, ToolContext, ToolResult
from palimpsest.agent.tools.common import ToolInputError, error, file_name, text_arg
from palimpsest.shared.errors import InvalidArgument, NotFound, PalimpsestError
from palimpsest.shared.image_tokens import image_size
from palimpsest.v1 import session_store_pb2 as store_pb


async def _download(ctx: ToolContext, name: str) -> tuple[str, bytes]:
    content_type, data = "", bytearray()
    async for part in ctx.store.GetFile(store_pb.GetFileRequest(session_id=ctx.session_id, name=name)):
        if part.HasField("info"):
            content_type = part.info.content_type
        else:
            data.extend(part.chunk)
    return content_type, bytes(data)


async def _image_names(ctx: ToolContext) -> list[str]:
    try:
        listed = await ctx.store.ListFiles(store_pb.ListFilesRequest(session_id=ctx.session_id))
    except PalimpsestError:
        return []
    return [f.name for f in listed.files if f.content_type.startswith("image/")]


class ImageViewTool:
    name = "image_view"
    reach = Reach.SESSION  # its own session and the model only: a clamped sub-agent keeps it
    description = (
        "Look at an image stored with this session, e.g. one the user pasted earlier. Give its name "
        "(image_2.png) or the path from a notice; the image is attached to the result for you to see."
    )
    parameters = {
        "type": "object",
        "properties": {"path": {"type": "string", "description": "The image's name or path."}},
        "required": ["path"],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            name = file_name(text_arg(args, "path", required=True), ctx.session_id, ctx.cwd)
        except ToolInputError as exc:
            return error(f"image_view: {exc}")
        if not ctx.session_id:
            return error("image_view: this run has no stored session, so it has no files.")
        facts = await ctx.ollama.model_facts(ctx.profile.model)
        if not facts.vision:
            return error(
                f"image_view: the model {ctx.profile.model} cannot see images; "
                "describe what you need from the user instead."
            )
        try:
            content_type, data = await _download(ctx, name)
        except (NotFound, InvalidArgument):
            images = await _image_names(ctx)
            known = f"Images in this session: {', '.join(images)}." if images else "This session has no images."
            return error(f"image_view: no file named {name!r} in this session. {known}")
        size = await asyncio.to_thread(image_size, data)  # Pillow parses the header: off the event loop
        if size is None or (content_type and not content_type.startswith("image/")):
            return error(f"image_view: {name} is not an image ({content_type or 'unknown type'}).")
        width, height = size
        # The bytes come from the store, but what they show came from outside the engine.
        return ToolResult(
            content=f"Image {name} ({width}×{height}) is attached.",
            images=[data],
            untrusted=True,
            metadata={"name": name, "width": width, "height": height},
        )

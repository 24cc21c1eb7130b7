"""content_publish: show a file already in the session's files to the user inline (a card with a
viewer), without copying it. The store types the file from its bytes, then its name."""

from __future__ import annotations

from typing import Any

from palimpsest.agent.tools.base import Reach, ToolContext, ToolResult
from palimpsest.agent.tools.common import ToolInputError, error, file_name, shorten, text_arg
from palimpsest.shared.content_types import sandboxed, viewer
from palimpsest.shared.file_policy import file_link
from palimpsest.v1 import agent_pb2
from palimpsest.v1 import session_store_pb2 as store_pb

MAX_TITLE = 200


class ContentPublishTool:
    name = "content_publish"
    reach = Reach.OUTSIDE  # shown to whoever views the conversation
    description = (
        "Show the user a file that is already among this session's files, inline in the conversation: "
        "images, SVG, PDF, HTML pages, video, audio, 3D models (STL, glTF) and text or source files. "
        "It does not copy anything: save or share the file into the session first."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {
                "type": "string",
                "description": "The file's name in the session (report.html), its session_files path or link.",
            },
            "title": {"type": "string", "description": "A short caption for the card."},
        },
        "required": ["path"],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            name = file_name(text_arg(args, "path", required=True), ctx.session_id, ctx.cwd)
            title = text_arg(args, "title")
        except ToolInputError as exc:
            return error(f"content_publish: {exc}")
        if not ctx.session_id:
            return error("content_publish: this run has no stored session, so it has no files.")
        if len(title) > MAX_TITLE:
            return error(f"content_publish: 'title' is {len(title)} characters; at most {MAX_TITLE}")
        listed = await ctx.store.ListFiles(store_pb.ListFilesRequest(session_id=ctx.session_id))
        info = next((f for f in listed.files if f.name == name), None)
        if info is None:
            names = ", ".join(f.name for f in listed.files)
            known = f"Its files: {shorten(names, 1_000)}." if names else "It has no files yet."
            return error(
                f"content_publish: this session has no file {name!r}. {known} "
                "A file from elsewhere goes in with share_file first."
            )
        link = file_link(ctx.session_id, name)
        shown_as = viewer(info.content_type)
        if not shown_as:
            return error(
                f"content_publish: {name} is {info.content_type}, which has no inline view; "
                f"the user can download it at {link}"
            )
        sandbox = sandboxed(shown_as)
        ctx.events.file_shared(
            agent_pb2.FileShared(
                name=name,
                link=link,
                content_type=info.content_type,
                size=info.size,
                viewer=shown_as,
                title=title,
                sandbox=sandbox,
            )
        )
        where = " in a sandbox (scripts in it do not run)" if sandbox else ""
        return ToolResult(
            content=f"Published {name} ({info.content_type}, {info.size:,} bytes): the user sees it "
            f"inline as {shown_as}{where}. Link: {link}",
            untrusted=False,
            files=[name],
            metadata={
                "name": name,
                "link": link,
                "viewer": shown_as,
                "title": title,
                "content_type": info.content_type,
                "sandbox": sandbox,
            },
        )

"""memory_search: verbatim passages of this session that compression took out of the context.

Trust: the passages are the session's own raw history. Anything untrusted in them (a tool result,
a file) already flagged the session when it first arrived, and that flag is sticky, so the result
is exactly as trusted as the session: ToolResult.untrusted = ctx.untrusted, and in a tainted
session each passage is fenced as untrusted content. Marking it always untrusted would taint
sessions whose history never held outside content.
"""

from __future__ import annotations

from typing import Any

from palimpsest.agent.tools.base import Reach, ToolContext, ToolResult
from palimpsest.agent.tools.common import ToolInputError, error, int_arg, shorten, text_arg, when
from palimpsest.agent.untrusted import fence
from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as store_pb

DEFAULT_LIMIT = 5
MAX_LIMIT = 10
# Below this word similarity a passage shares little more than stop words with the query.
MIN_SIMILARITY = 0.15
PASSAGE_CHARS = 4_000


def render_chunk(n: int, chunk: common_pb2.RawChunk, untrusted: bool = False) -> str:
    where = f"messages {chunk.turn_range.first}–{chunk.turn_range.last}" if chunk.turn_range.last else "messages ?"
    span = f" · {when(chunk.first_at)} → {when(chunk.last_at)}" if chunk.HasField("first_at") else ""
    head = f"[{n}] {where}{span} · relevance {chunk.score:.2f}"
    lines = [head]
    if chunk.breadcrumbs:
        lines.append(f"    topics: {', '.join(chunk.breadcrumbs)}")
    passage = shorten(chunk.content.strip(), PASSAGE_CHARS)
    lines.append(fence(passage, "memory_search") if untrusted else passage)
    return "\n".join(lines)


def render_chunks(query: str, chunks: list[common_pb2.RawChunk], untrusted: bool = False) -> str:
    if not chunks:
        return (
            f"No matches for {query!r} in this session's compressed history. "
            "Try other words, or the earlier details may never have been compressed out of the context."
        )
    parts = [
        f"{len(chunks)} passage{'s' if len(chunks) != 1 else ''} from earlier in this session "
        f"(verbatim, compressed out of the context), best first:"
    ]
    parts += [render_chunk(n, c, untrusted) for n, c in enumerate(chunks, 1)]
    return "\n\n".join(parts)


class MemorySearchTool:
    name = "memory_search"
    reach = Reach.SESSION  # its own session and the model only: a clamped sub-agent keeps it
    description = (
        "Search this conversation's earlier history that was compressed out of your context, and get the "
        "original passages back verbatim. Use it when a summary mentions something you need in detail."
    )
    parameters = {
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "description": "What the passage you need says: its words, or the same thing in other words.",
            },
            "limit": {"type": "integer", "description": f"Passages to return, 1 to {MAX_LIMIT} (default 5)."},
        },
        "required": ["query"],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            query = text_arg(args, "query", required=True)
            limit = int_arg(args, "limit", default=DEFAULT_LIMIT, low=1, high=MAX_LIMIT)
        except ToolInputError as exc:
            return error(f"memory_search: {exc}")
        if not ctx.session_id:
            return error("memory_search: this run has no stored session, so there is no earlier history to search.")
        reply = await ctx.store.SearchMemory(
            store_pb.SearchMemoryRequest(
                session_id=ctx.session_id,
                query=query,
                limit=limit,
                min_similarity=MIN_SIMILARITY,
                embed_model=ctx.profile.embed_model,
            )
        )
        chunks = list(reply.chunks)
        return ToolResult(
            content=render_chunks(query, chunks, ctx.untrusted),
            untrusted=ctx.untrusted,
            metadata={"matches": len(chunks)},
        )

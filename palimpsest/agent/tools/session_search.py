"""session_search: browse, search and read the caller's other sessions.

Only the caller's sessions are reachable: every call carries the caller's credentials and the
SessionStore enforces ownership. Results are untrusted: other sessions hold tool output, files and
text from anywhere. What comes from a session that has taken in outside content (its messages, a
search's snippet of them) is fenced as untrusted content besides.
"""

from __future__ import annotations

from typing import Any

from palimpsest.agent.tools.base import Reach, ToolContext, ToolResult
from palimpsest.agent.tools.common import ToolInputError, error, int_arg, shorten, text_arg, when
from palimpsest.agent.untrusted import fence
from palimpsest.shared.errors import InvalidArgument, NotFound, PermissionDenied
from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as store_pb

ACTIONS = ("list", "search", "get", "find")
DEFAULT_LIMIT = 20
MAX_LIMIT = 50
# `find` filters summaries by name and task, so it reads a wider page than it shows.
FIND_SCAN = 200
GET_CHARS = 20_000
MESSAGE_CHARS = 2_000
TOOL_RESULT_CHARS = 800
_NOT_READABLE = (NotFound, InvalidArgument, PermissionDenied)


def session_line(s: common_pb2.SessionSummary, current: str = "") -> str:
    title = s.name or shorten(s.preview, 80) or "(untitled)"
    mark = " (this session)" if s.id == current else ""
    taint = " · has taken in outside content" if s.untrusted_ingested else ""
    return (
        f"- {s.id}{mark} · {title} · {s.display_message_count} messages · "
        f"last active {when(s.last_active)} · model {s.model or '?'}{taint}"
    )


def render_message(index: int, m: common_pb2.Message) -> str:
    if m.is_compression:
        return f"[{index}] (context compressed here)"
    if m.role == "tool":
        return f"[{index}] tool {m.name or '?'} → {shorten(m.content.strip(), TOOL_RESULT_CHARS)}"
    text = shorten(m.content.strip(), MESSAGE_CHARS)
    calls = "".join(f"\n    calls {c.name}({shorten(c.arguments_json, 200)})" for c in m.tool_calls)
    plan = " (plan)" if m.is_plan else ""
    files = f" [files: {', '.join(m.files)}]" if m.files else ""
    return f"[{index}] {m.role}{plan}: {text}{files}{calls}"


def render_history(session: common_pb2.Session, start: int = 0, budget: int = GET_CHARS) -> str:
    """The display history from `start`, compact, within `budget` chars, saying where it stopped."""
    total = len(session.messages)
    head = (
        f"Session {session.id} · {session.name or '(untitled)'} · {total} messages · "
        f"created {when(session.created_at)} · last active {when(session.last_active)} · "
        f"model {session.model or '?'}"
    )
    lines, used = [head], len(head)
    shown_to = start
    for index in range(start, total):
        line = render_message(index, session.messages[index])
        if used + len(line) > budget and index > start:
            break
        lines.append(line)
        used += len(line) + 1
        shown_to = index + 1
    if shown_to < total:
        lines.append(
            f"[… {total - shown_to} later messages not shown (about {budget:,} chars per call); "
            f"call get again with start={shown_to} to read on]"
        )
    elif start >= total and total:
        lines.append(f"(start={start} is past the last message; the history has {total} messages)")
    return "\n".join(lines)


class SessionSearchTool:
    name = "session_search"
    reach = Reach.ENGINE  # other sessions of the owner: nothing outside Palimpsest
    description = (
        "Recall the user's past sessions. action=list: recent sessions. action=search with `query`: sessions "
        "whose messages hold it or two or more of its words, or are about it in other words, best match first, "
        "with a snippet. action=find with `query`: sessions whose name or task matches. action=get with "
        "`session_id`: read that session's conversation (use it after search/find)."
    )
    parameters = {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": list(ACTIONS)},
            "query": {"type": "string", "description": "For search and find: the words to look for."},
            "session_id": {"type": "string", "description": "For get: the session to read."},
            "start": {"type": "integer", "description": "For get: the first message index to show (default 0)."},
            "limit": {"type": "integer", "description": "For list/search/find: at most this many (default 20)."},
        },
        "required": ["action"],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            action = text_arg(args, "action", required=True)
            if action not in ACTIONS:
                raise ToolInputError(f"unknown action {action!r}: use {', '.join(ACTIONS)}")
            limit = int_arg(args, "limit", default=DEFAULT_LIMIT, low=1, high=MAX_LIMIT)
            if action == "list":
                text = await self._list(ctx, limit)
            elif action == "search":
                text = await self._search(ctx, text_arg(args, "query", required=True), limit)
            elif action == "find":
                text = await self._find(ctx, text_arg(args, "query", required=True), limit)
            else:
                start = int_arg(args, "start", default=0, low=0, high=10_000_000)
                text = await self._get(ctx, text_arg(args, "session_id", required=True), start)
        except ToolInputError as exc:
            return error(f"session_search: {exc}")
        return ToolResult(content=text, untrusted=True)

    @staticmethod
    async def _summaries(
        ctx: ToolContext, query: str, page_size: int, sort_by: store_pb.SortBy = store_pb.SORT_BY_LAST_ACTIVE
    ) -> store_pb.ListSessionsResponse:
        return await ctx.store.ListSessions(
            store_pb.ListSessionsRequest(
                query=query, sort_by=sort_by, page_size=page_size, embed_model=ctx.profile.embed_model
            )
        )

    async def _list(self, ctx: ToolContext, limit: int) -> str:
        reply = await self._summaries(ctx, "", limit)
        if not reply.sessions:
            return "There are no sessions yet."
        lines = [f"{len(reply.sessions)} most recent of {reply.total} sessions:"]
        lines += [session_line(s, ctx.session_id) for s in reply.sessions]
        return "\n".join(lines)

    async def _search(self, ctx: ToolContext, query: str, limit: int) -> str:
        # Best match first: the words a session holds and how near it is in meaning, together.
        reply = await self._summaries(ctx, query, limit, store_pb.SORT_BY_RELEVANCE)
        if not reply.sessions:
            return f"No session mentions {query!r} or its words, or is about it."
        matches = await ctx.store.SearchMatches(
            store_pb.SearchMatchesRequest(session_ids=[s.id for s in reply.sessions], query=query)
        )
        found = {m.session_id: m for m in matches.matches}
        lines = [
            f"{reply.total} session{'s' if reply.total != 1 else ''} match {query!r}, best first"
            + (f" (showing {len(reply.sessions)})" if reply.total > len(reply.sessions) else "")
            + ":"
        ]
        for s in reply.sessions:
            lines.append(session_line(s, ctx.session_id))
            match = found.get(s.id)
            if match is not None:
                positions = ", ".join(str(i) for i in match.display_indices[:10])
                more = "…" if len(match.display_indices) > 10 else ""
                snippet = shorten(match.snippet.strip(), 300)
                if s.untrusted_ingested:
                    snippet = fence(snippet, f"session {s.id}")
                lines.append(f"    {len(match.display_indices)} matching messages (at {positions}{more}): {snippet}")
            elif any(word in s.name.casefold() for word in query.casefold().split()):
                lines.append("    (matched by its name)")
            else:  # the store's semantic tier: a message or summary of it is near the query, in other words
                lines.append("    (matched by meaning: it is about this, in other words)")
        lines.append("Read one with action=get and its session_id.")
        return "\n".join(lines)

    async def _find(self, ctx: ToolContext, query: str, limit: int) -> str:
        reply = await self._summaries(ctx, query, FIND_SCAN)
        needle = query.casefold()
        hits = [s for s in reply.sessions if needle in s.name.casefold() or needle in s.preview.casefold()]
        if not hits:
            return f"No session's name or task contains {query!r} (try action=search for its messages)."
        lines = [f"{len(hits)} session{'s' if len(hits) != 1 else ''} named or tasked with {query!r}:"]
        lines += [session_line(s, ctx.session_id) for s in hits[:limit]]
        if len(hits) > limit:
            lines.append(f"(and {len(hits) - limit} more)")
        return "\n".join(lines)

    @staticmethod
    async def _get(ctx: ToolContext, session_id: str, start: int) -> str:
        try:
            reply = await ctx.store.GetSession(
                store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_DISPLAY)
            )
        except _NOT_READABLE:
            raise ToolInputError(
                f"no session {session_id!r} that you can read (use list, search or find for valid ids)"
            ) from None
        history = render_history(reply.session, start)
        return fence(history, f"session {session_id}") if reply.session.untrusted_ingested else history

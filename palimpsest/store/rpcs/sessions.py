"""Sessions: create, read, list and search, change, compress, trim, delete and share."""

from __future__ import annotations

import asyncio

import grpc

from palimpsest.shared.auth import caller
from palimpsest.shared.errors import InvalidArgument
from palimpsest.shared.external_refs import merge_refs
from palimpsest.shared.structs import from_struct
from palimpsest.store import convert
from palimpsest.store.repository.access import parse_session_id
from palimpsest.store.rpcs.base import StoreRpcs
from palimpsest.store.rpcs.checks import (
    MAX_PAGE,
    check_message,
    check_struct,
    checked_model,
    expected_revision,
    page_size,
    refs_from_json,
    request_refs,
    view_budgets,
)
from palimpsest.store.shared_view import scrubbed, shared_message
from palimpsest.v1 import session_store_pb2 as pb

# A century: past it an interval overflows PostgreSQL's timestamp arithmetic.
MAX_CLEANUP_DAYS = 36_500
SORT_NAMES = {
    pb.SORT_BY_UNSPECIFIED: "last_active",
    pb.SORT_BY_LAST_ACTIVE: "last_active",
    pb.SORT_BY_CREATED_AT: "created_at",
    pb.SORT_BY_NAME: "name",
    pb.SORT_BY_MESSAGE_COUNT: "message_count",
    pb.SORT_BY_RELEVANCE: "relevance",
}


class SessionRpcs(StoreRpcs):
    """Sessions: create, read, list and search, change, compress, trim, delete and share."""

    async def CreateSession(
        self,
        request: pb.CreateSessionRequest,
        context: grpc.aio.ServicerContext[pb.CreateSessionRequest, pb.CreateSessionResponse],
    ) -> pb.CreateSessionResponse:
        identity = caller()
        if not request.profile_id.strip():
            raise InvalidArgument("profile_id", "required")
        check_struct(request.metadata, "metadata")
        refs = merge_refs([], request_refs(request.external_refs))
        row = await self.repo.sessions.create_session(
            identity,
            profile_id=request.profile_id.strip(),
            name=request.name.strip(),
            provider=request.provider,
            model=request.model,
            external_refs=[convert.external_ref_to_json(r) for r in refs],
            metadata=from_struct(request.metadata),
        )
        return pb.CreateSessionResponse(session=convert.session_from_row(row))

    async def GetSession(
        self,
        request: pb.GetSessionRequest,
        context: grpc.aio.ServicerContext[pb.GetSessionRequest, pb.GetSessionResponse],
    ) -> pb.GetSessionResponse:
        identity = caller()
        session_id = parse_session_id(request.session_id)
        if request.view not in pb.SessionView.values():
            raise InvalidArgument("view", f"unknown view {request.view}")
        if request.context_offset < 0:
            raise InvalidArgument("context_offset", "must not be negative")
        display, context_ = view_budgets(request.view, self.settings.read_budget_bytes)
        read = await self.repo.sessions.read_session(
            identity, session_id, display_budget=display, context_budget=context_, context_offset=request.context_offset
        )
        response = pb.GetSessionResponse(session=convert.session_from_row(read.row))
        if read.display is not None:
            response.session.messages.extend(read.display.messages)
            response.has_more_messages = read.display.has_more
        if read.context is not None:
            response.session.context.extend(read.context.messages)
            response.has_more_context = read.context.has_more
        return response

    async def ListSessions(
        self,
        request: pb.ListSessionsRequest,
        context: grpc.aio.ServicerContext[pb.ListSessionsRequest, pb.ListSessionsResponse],
    ) -> pb.ListSessionsResponse:
        identity = caller()
        if request.sort_by not in SORT_NAMES:
            raise InvalidArgument("sort_by", f"unknown sort {request.sort_by}")
        if request.offset < 0:
            raise InvalidArgument("offset", "must not be negative")
        limit = page_size(request.page_size, "page_size")
        query = request.query.strip()
        embed_model = checked_model(request.embed_model)
        meaning = (
            await self.memory_index.sessions_query(query, embed_model)
            if query and self.memory_index is not None
            else None
        )
        rows, total = await self.repo.sessions.list_sessions(
            identity,
            profile_id=request.profile_id,
            query=query,
            sort_by=SORT_NAMES[request.sort_by],
            descending=request.descending if request.HasField("descending") else True,
            limit=limit,
            offset=request.offset,
            meaning=meaning,
        )
        return pb.ListSessionsResponse(
            sessions=[convert.summary_from_row(r) for r in rows],
            total=total,
            has_more=request.offset + len(rows) < total,
            semantic=meaning is not None,
        )

    async def SearchMatches(
        self,
        request: pb.SearchMatchesRequest,
        context: grpc.aio.ServicerContext[pb.SearchMatchesRequest, pb.SearchMatchesResponse],
    ) -> pb.SearchMatchesResponse:
        identity = caller()
        if not request.query.strip():
            raise InvalidArgument("query", "required")
        if len(request.session_ids) > MAX_PAGE:
            raise InvalidArgument("session_ids", f"at most {MAX_PAGE} sessions per call")
        ids = [parse_session_id(s, f"session_ids[{i}]") for i, s in enumerate(request.session_ids)]
        found = await self.repo.sessions.search_matches(identity, ids, request.query.strip())
        return pb.SearchMatchesResponse(
            matches=[pb.SessionMatch(session_id=s, display_indices=idx, snippet=snip) for s, idx, snip in found]
        )

    async def UpdateSession(
        self,
        request: pb.UpdateSessionRequest,
        context: grpc.aio.ServicerContext[pb.UpdateSessionRequest, pb.UpdateSessionResponse],
    ) -> pb.UpdateSessionResponse:
        identity = caller()
        session_id = parse_session_id(request.session_id)
        changes: dict = {}
        for field in ("name", "pinned", "profile_id", "context_token_count", "provider", "model"):
            if request.HasField(field):
                changes[field] = getattr(request, field)
        if "profile_id" in changes and not changes["profile_id"].strip():
            raise InvalidArgument("profile_id", "must not be empty")
        if changes.get("context_token_count", 0) < 0:
            raise InvalidArgument("context_token_count", "must not be negative")
        if request.HasField("metadata"):
            check_struct(request.metadata, "metadata")
            changes["metadata"] = from_struct(request.metadata)
        if request.add_external_refs:
            new = request_refs(request.add_external_refs, "add_external_refs")
            changes["external_refs"] = lambda current: [  # (merged under the session's lock)
                convert.external_ref_to_json(r)
                for r in merge_refs(refs_from_json(current), new, field="add_external_refs")
            ]
        if request.mark_untrusted_ingested:
            changes["untrusted_ingested"] = True
        if request.mark_episode_untrusted:
            changes["episode_untrusted"] = True
        if request.mark_sandboxed:
            changes["sandboxed"] = True
        if request.HasField("planning_log"):
            check_struct(request.planning_log, "planning_log")
            changes["planning_log"] = from_struct(request.planning_log)
        row = await self.repo.sessions.update_session(identity, session_id, changes, expected_revision(request))
        return pb.UpdateSessionResponse(session=convert.session_from_row(row))

    async def SetContextFlag(
        self,
        request: pb.SetContextFlagRequest,
        context: grpc.aio.ServicerContext[pb.SetContextFlagRequest, pb.SetContextFlagResponse],
    ) -> pb.SetContextFlagResponse:
        identity = caller()
        session_id = parse_session_id(request.session_id)
        if not request.seqs:
            raise InvalidArgument("seqs", "at least one seq is required")
        updated, revision = await self.repo.sessions.set_context_flag(
            identity, session_id, list(request.seqs), request.is_context, expected_revision(request)
        )
        return pb.SetContextFlagResponse(updated=updated, revision=revision)

    async def CommitCompression(
        self,
        request: pb.CommitCompressionRequest,
        context: grpc.aio.ServicerContext[pb.CommitCompressionRequest, pb.CommitCompressionResponse],
    ) -> pb.CommitCompressionResponse:
        identity = caller()
        session_id = parse_session_id(request.session_id)
        if not request.demote_seqs and not request.HasField("summary"):
            raise InvalidArgument("demote_seqs", "a compression must demote messages or add a summary")
        if request.context_token_count < 0:
            raise InvalidArgument("context_token_count", "must not be negative")
        for field in ("summary", "marker"):
            if request.HasField(field):
                check_message(getattr(request, field), field, self.settings.message_max_bytes)
        for i, chunk in enumerate(request.chunks):
            if not chunk.content:
                raise InvalidArgument(f"chunks[{i}].content", "required")
        demoted = set(request.demote_seqs)
        for i, replacement in enumerate(request.replacements):
            check_message(replacement, f"replacements[{i}]", self.settings.message_max_bytes)
            stands_for = replacement.replaces
            if stands_for.first != stands_for.last or stands_for.first not in demoted:
                raise InvalidArgument(f"replacements[{i}].replaces", "must name one demoted row (first = last)")
        result = await self.repo.sessions.commit_compression(
            identity,
            session_id,
            demote_seqs=list(request.demote_seqs),
            replacements=list(request.replacements),
            summary=request.summary if request.HasField("summary") else None,
            marker=request.marker if request.HasField("marker") else None,
            context_token_count=request.context_token_count,
            chunks=request.chunks,
            expected_revision=expected_revision(request),
            archive=request.archive,
        )
        if result.get("chunks_indexed") or result.get("summary_seq"):
            self._chunks_committed()
        return pb.CommitCompressionResponse(**result)

    async def ArchiveOldMessages(
        self,
        request: pb.ArchiveOldMessagesRequest,
        context: grpc.aio.ServicerContext[pb.ArchiveOldMessagesRequest, pb.ArchiveOldMessagesResponse],
    ) -> pb.ArchiveOldMessagesResponse:
        identity = caller()
        session_id = parse_session_id(request.session_id)
        if request.below_seq <= 0:
            raise InvalidArgument("below_seq", "must be positive")
        return pb.ArchiveOldMessagesResponse(
            archived=await self.repo.sessions.archive_old_messages(identity, session_id, request.below_seq)
        )

    async def TrimSession(
        self,
        request: pb.TrimSessionRequest,
        context: grpc.aio.ServicerContext[pb.TrimSessionRequest, pb.TrimSessionResponse],
    ) -> pb.TrimSessionResponse:
        identity = caller()
        session_id = parse_session_id(request.session_id)
        if request.keep < 1:
            raise InvalidArgument("keep", f"must be at least 1, got {request.keep}")
        before, after = await self.repo.sessions.trim_session(identity, session_id, request.keep)
        return pb.TrimSessionResponse(before=before, after=after, dropped=before - after)

    async def CleanupSessions(
        self,
        request: pb.CleanupSessionsRequest,
        context: grpc.aio.ServicerContext[pb.CleanupSessionsRequest, pb.CleanupSessionsResponse],
    ) -> pb.CleanupSessionsResponse:
        identity = caller()
        if not request.HasField("older_than_days"):
            raise InvalidArgument("older_than_days", "required (0 deletes every session you can see)")
        if not 0 <= request.older_than_days <= MAX_CLEANUP_DAYS:
            raise InvalidArgument(
                "older_than_days", f"must be between 0 (deletes every session) and {MAX_CLEANUP_DAYS}"
            )
        ids = await self.repo.sessions.cleanup_sessions(identity, request.older_than_days)
        for session_id in ids:
            await asyncio.to_thread(self.files.delete_session, session_id)
        return pb.CleanupSessionsResponse(deleted=len(ids), session_ids=ids)

    async def DeleteSession(
        self,
        request: pb.DeleteSessionRequest,
        context: grpc.aio.ServicerContext[pb.DeleteSessionRequest, pb.DeleteSessionResponse],
    ) -> pb.DeleteSessionResponse:
        identity = caller()
        session_id = parse_session_id(request.session_id)
        await self.repo.sessions.delete_session(identity, session_id)
        await asyncio.to_thread(self.files.delete_session, str(session_id))
        return pb.DeleteSessionResponse(deleted=True)

    # -- shares ----------------------------------------------------------------------------
    async def CreateShare(
        self,
        request: pb.CreateShareRequest,
        context: grpc.aio.ServicerContext[pb.CreateShareRequest, pb.CreateShareResponse],
    ) -> pb.CreateShareResponse:
        identity = caller()
        session_id = parse_session_id(request.session_id)
        token, created_at = await self.repo.shares.create_share(identity, session_id)
        response = pb.CreateShareResponse(token=token)
        response.created_at.CopyFrom(convert.timestamp(created_at))
        return response

    async def GetShared(
        self, request: pb.GetSharedRequest, context: grpc.aio.ServicerContext[pb.GetSharedRequest, pb.GetSharedResponse]
    ) -> pb.GetSharedResponse:
        if not request.token:
            raise InvalidArgument("token", "required")
        if request.before_seq < 0:
            raise InvalidArgument("before_seq", "must not be negative")
        limit = page_size(request.limit, "limit")
        shared = await self.repo.shares.shared_session(request.token)
        page = await self.repo.sessions.history_page(
            None, shared["id"], request.before_seq, limit, archive_only=False, budget=self.settings.read_budget_bytes
        )
        session_id = str(shared["id"])
        # A page may hold 32 MB of text to scrub: off the event loop.
        messages = await asyncio.to_thread(lambda: [shared_message(m, session_id) for m in page.messages])
        response = pb.GetSharedResponse(
            name=scrubbed(shared["name"], session_id),
            profile_id=shared["profile_id"],
            messages=messages,
            has_more=page.has_more,
        )
        response.created_at.CopyFrom(convert.timestamp(shared["created_at"]))
        response.last_active.CopyFrom(convert.timestamp(shared["last_active"]))
        return response

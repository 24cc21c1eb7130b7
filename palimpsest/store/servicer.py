"""The SessionStore gRPC servicer: validates requests, resolves the caller, calls the repository."""

from __future__ import annotations

import asyncio
import logging
import math
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace

import grpc

from palimpsest.shared import metrics
from palimpsest.shared.auth import Identity, caller, vouched_by_services
from palimpsest.shared.errors import InvalidArgument, PermissionDenied, ResourceExhausted, Unavailable
from palimpsest.shared.external_refs import ExternalRef, merge_refs, refs_from_proto
from palimpsest.shared.file_policy import unseen_character_problem
from palimpsest.shared.settings import Settings
from palimpsest.shared.stopping import Stopping
from palimpsest.shared.structs import from_struct
from palimpsest.shared.validation import first_nul, first_out_of_range
from palimpsest.store import convert
from palimpsest.store.files import FileStore
from palimpsest.store.redaction import redact_uri
from palimpsest.store.repository import SessionRepository
from palimpsest.store.repository.access import parse_session_id
from palimpsest.store.repository.calibration import EXACT_FIELDS, EXACT_OBSERVATIONS
from palimpsest.store.repository.owner_memory import MemoryEdit, checked_text
from palimpsest.store.repository.sessions import Report
from palimpsest.store.semantic import MemoryIndex
from palimpsest.store.session_bus import MAX_PAYLOAD_BYTES, ListenerGone, SessionBus
from palimpsest.store.shared_view import scrubbed, shared_message
from palimpsest.v1 import common_pb2, session_store_pb2_grpc
from palimpsest.v1 import session_store_pb2 as pb

log = logging.getLogger("palimpsest.store")

MAX_PAGE = 500
DEFAULT_PAGE = 50
FILE_CHUNK = 64 * 1024
# Ollama's model names ("nomic-embed-text", "hf.co/org/repo:Q4_K_M") are far shorter.
MAX_MODEL_NAME = 200
# A tool's name, a turn's or a tool call's id (Ollama's are short; custom tools' names are identifiers).
MAX_TOOL_NAME = 200
MAX_BUS_MESSAGES = 1000  # one PublishSessionMessages
# How long a new ListenSessionMessages waits for this replica's listen connection (reconnecting).
LISTEN_READY_S = 5.0
APPEND_MESSAGES = "/palimpsest.v1.SessionStore/AppendMessages"
# A stopping replica ends the append streams waiting for their writer's next append: the writer
# sends it again on another (each append carries its idempotency key).
STOPPING_APPENDS = "this store replica is stopping: append on another"

_SORT_NAMES = {
    pb.SORT_BY_UNSPECIFIED: "last_active",
    pb.SORT_BY_LAST_ACTIVE: "last_active",
    pb.SORT_BY_CREATED_AT: "created_at",
    pb.SORT_BY_NAME: "name",
    pb.SORT_BY_MESSAGE_COUNT: "message_count",
    pb.SORT_BY_RELEVANCE: "relevance",
}


def page_size(value: int, field: str, default: int = DEFAULT_PAGE, maximum: int = MAX_PAGE) -> int:
    if value == 0:
        return default
    if value < 0 or value > maximum:
        raise InvalidArgument(field, f"must be between 1 and {maximum}, got {value}")
    return value


def _refs_from_proto(refs, field: str = "external_refs") -> list[ExternalRef]:
    """A request's refs validated, as stored: URIs redacted."""
    return [replace(ref, uri=redact_uri(ref.uri)) for ref in refs_from_proto(refs, field=field)]


def _refs_from_json(items) -> list[ExternalRef]:
    from datetime import datetime

    return [
        ExternalRef(
            r["kind"],
            r["uri"],
            r["created_by"],
            bool(r.get("read_only")),
            datetime.fromisoformat(r["created_at"]) if r.get("created_at") else None,
        )
        for r in items
    ]


def view_budgets(view: int, budget: int) -> tuple[int, int]:
    """(display, context) bytes of a GetSession response by view; 0: that part is not read."""
    if view == pb.SESSION_VIEW_FULL:
        return budget // 2, budget // 2
    return (budget if view == pb.SESSION_VIEW_DISPLAY else 0), (budget if view == pb.SESSION_VIEW_CONTEXT else 0)


def check_message_size(message: common_pb2.Message, field: str, limit: int) -> None:
    """One message must fit in any read of it; its encoded size is what a read will carry."""
    size = message.ByteSize()
    if size > limit:
        raise ResourceExhausted(
            f"{field} is {size:,} bytes; one message may hold at most {limit:,} "
            "(PALIMPSEST_MESSAGE_MAX_MB): store large content as a file (PutFile)"
        )


def _checked_observation(obs: pb.Observation, field: str) -> tuple[str, int, int, dict[str, int]]:
    """(model, chars, tokens, exact shape) of a valid observation, for the calibration table."""
    if not obs.model:
        raise InvalidArgument(f"{field}.model", "required")
    exact = {name: getattr(obs.exact, name) for name in EXACT_FIELDS}
    if obs.tokens <= 0 or (obs.chars <= 0 and obs.exact.content_tokens <= 0):
        raise InvalidArgument(field, "tokens and either chars or exact.content_tokens must be positive")
    if any(value < 0 for value in exact.values()):
        raise InvalidArgument(f"{field}.exact", "counts must not be negative")
    # An exact shape replaces chars; a calibrated one (characters by class) goes beside them.
    return obs.model, 0 if obs.exact.content_tokens else obs.chars, obs.tokens, exact


def _check_token_counts(digest: str, counts, prefix: str, field: str = "token_counts") -> None:
    if counts and not digest:
        raise InvalidArgument(f"{prefix}token_digest", "required: a count means nothing without its tokenizer")
    if any(c.seq <= 0 or c.tokens < 0 for c in counts):
        raise InvalidArgument(f"{prefix}{field}", "seq must be positive and tokens not negative")
    if any(not re.fullmatch(r"[0-9a-f]{32}", c.content_md5) for c in counts):
        raise InvalidArgument(
            f"{prefix}{field}", "content_md5 must be the md5 (32 lowercase hex) of the counted content"
        )


def _validate_messages(messages, max_bytes: int) -> None:
    if not messages:
        raise InvalidArgument("messages", "at least one message is required")
    for i, m in enumerate(messages):
        if m.seq:
            raise InvalidArgument(f"messages[{i}].seq", "is assigned by the store; leave it 0")
        check_message(m, f"messages[{i}]", max_bytes)


def check_message(m: common_pb2.Message, field: str, max_bytes: int) -> None:
    """A message the store is to write (an append's, a compression's): what PostgreSQL could not
    hold or a chat template could not read is refused, naming it (its times are the interceptor's:
    validation.first_out_of_range)."""
    check_message_size(m, field, max_bytes)
    if m.role not in convert.VALID_ROLES:
        raise InvalidArgument(f"{field}.role", f"must be one of system, user, assistant, tool; got {m.role!r}")
    if "\x00" in m.content:
        raise InvalidArgument(f"{field}.content", "must not contain NUL characters")
    if not math.isfinite(m.elapsed_seconds):
        raise InvalidArgument(f"{field}.elapsed_seconds", "must be a finite number")
    if m.HasField("metadata"):
        check_struct(m.metadata, f"{field}.metadata")


def check_struct(struct, field: str) -> None:
    """JSON can hold neither NaN nor infinities; PostgreSQL's jsonb refuses them."""

    def walk(value) -> None:
        kind = value.WhichOneof("kind")
        if kind == "number_value" and not math.isfinite(value.number_value):
            raise InvalidArgument(field, "numbers must be finite (no NaN or infinity)")
        if kind == "struct_value":
            for v in value.struct_value.fields.values():
                walk(v)
        if kind == "list_value":
            for v in value.list_value.values:
                walk(v)

    for v in struct.fields.values():
        walk(v)


def _expected(request) -> int | None:
    return request.expected_revision if request.HasField("expected_revision") else None


async def _begun(starting):
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


class SessionStoreServicer(session_store_pb2_grpc.SessionStoreServicer):
    def __init__(
        self,
        repo: SessionRepository,
        files: FileStore,
        settings: Settings,
        memory_index: MemoryIndex | None = None,
        bus: SessionBus | None = None,
    ) -> None:
        self.repo = repo
        self.bus = bus  # messages between Agent replicas (None: a store without a listen connection)
        self.files = files
        self.settings = settings
        # The semantic tier of memory search; None (or not enabled): lexical only.
        self.memory_index = memory_index
        self.stopping = Stopping()  # set by the server's drain: append streams waiting on their writer end

    def _chunks_committed(self) -> None:
        """New chunks (or a summary) are stored: the indexer embeds them in the background, after
        the commit, so an embedder that is down or slow never fails or slows the write."""
        if self.memory_index is not None:
            self.memory_index.poke()

    # -- sessions --------------------------------------------------------------------------
    async def CreateSession(
        self,
        request: pb.CreateSessionRequest,
        context: grpc.aio.ServicerContext[pb.CreateSessionRequest, pb.CreateSessionResponse],
    ) -> pb.CreateSessionResponse:
        identity = caller()
        if not request.profile_id.strip():
            raise InvalidArgument("profile_id", "required")
        check_struct(request.metadata, "metadata")
        refs = merge_refs([], _refs_from_proto(request.external_refs))
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
        if request.sort_by not in _SORT_NAMES:
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
            sort_by=_SORT_NAMES[request.sort_by],
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

    async def GetHistoryPage(
        self,
        request: pb.GetHistoryPageRequest,
        context: grpc.aio.ServicerContext[pb.GetHistoryPageRequest, pb.GetHistoryPageResponse],
    ) -> pb.GetHistoryPageResponse:
        return pb.GetHistoryPageResponse(**await self._page(request, context, archive_only=False))

    async def GetArchivedMessages(
        self,
        request: pb.GetArchivedMessagesRequest,
        context: grpc.aio.ServicerContext[pb.GetArchivedMessagesRequest, pb.GetArchivedMessagesResponse],
    ) -> pb.GetArchivedMessagesResponse:
        return pb.GetArchivedMessagesResponse(**await self._page(request, context, archive_only=True))

    async def _page(self, request, context, *, archive_only: bool) -> dict:
        identity = caller()
        session_id = parse_session_id(request.session_id)
        if request.before_seq < 0:
            raise InvalidArgument("before_seq", "must not be negative")
        limit = page_size(request.limit, "limit")
        page = await self.repo.sessions.history_page(
            identity,
            session_id,
            request.before_seq,
            limit,
            archive_only=archive_only,
            budget=self.settings.read_budget_bytes,
        )
        return {"messages": page.messages, "has_more": page.has_more}

    async def AppendMessages(
        self,
        request: pb.AppendMessagesRequest,
        context: grpc.aio.ServicerContext[pb.AppendMessagesRequest, pb.AppendMessagesResponse],
    ) -> pb.AppendMessagesResponse:
        identity = caller()
        session_id = parse_session_id(request.session_id)
        if request.messages or not request.tool_runs:  # (tool runs alone: the audit log only)
            _validate_messages(request.messages, self.settings.message_max_bytes)
        elif request.HasField("report"):
            raise InvalidArgument("report", "a report goes with the messages it answers")
        report = self._report(request.report, identity, context) if request.HasField("report") else None
        tool_runs = self._tool_runs(request.tool_runs, identity, context)
        if request.HasField("expected_next_seq") and request.expected_next_seq < 1:
            raise InvalidArgument("expected_next_seq", "a seq is at least 1")
        result = await self.repo.sessions.append_messages(
            identity,
            session_id,
            request.messages,
            _expected(request),
            request.idempotency_key,
            report,
            request.expected_next_seq if request.HasField("expected_next_seq") else None,
            tool_runs,
        )
        if request.messages and self.memory_index is not None:
            self.memory_index.poke(messages_only=True)  # embedded for session search
        return pb.AppendMessagesResponse(
            seqs=result.seqs,
            revision=result.revision,
            context_truncated=result.context_truncated,
            session_changed=result.session_changed,
        )

    async def AppendStream(
        self,
        request_iterator: AsyncIterator[pb.AppendMessagesRequest],
        context: grpc.aio.ServicerContext[pb.AppendMessagesRequest, pb.AppendMessagesResponse],
    ) -> AsyncIterator[pb.AppendMessagesResponse]:
        async for request in self.stopping.until(aiter(request_iterator), STOPPING_APPENDS):
            with metrics.timed_as(APPEND_MESSAGES):  # each append as the call it stands for
                answer = await self.AppendMessages(request, context)
            yield answer

    async def ClaimTurn(
        self, request: pb.ClaimTurnRequest, context: grpc.aio.ServicerContext[pb.ClaimTurnRequest, pb.ClaimTurnResponse]
    ) -> pb.ClaimTurnResponse:
        identity = caller()
        session_id = parse_session_id(request.session_id)
        if not request.holder.strip() or len(request.holder) > 128:
            raise InvalidArgument("holder", "required, at most 128 characters")
        if not request.release and not 1 <= request.ttl_seconds <= 3600:
            raise InvalidArgument("ttl_seconds", f"must be 1–3600 seconds, got {request.ttl_seconds}")
        granted, holder, left = await self.repo.sessions.claim_turn(
            identity, session_id, request.holder, request.ttl_seconds, request.release
        )
        return pb.ClaimTurnResponse(granted=granted, holder=holder, expires_in_seconds=left)

    def _report(self, report: pb.ModelReport, identity: Identity, context) -> Report:
        """A model report to write with an append, checked as the calls it stands for check theirs."""
        if report.HasField("context_token_count") and report.context_token_count < 0:
            raise InvalidArgument("report.context_token_count", "must not be negative")
        learns = (
            report.HasField("baseline")
            or report.prompt_cut
            or report.HasField("observation")
            or bool(report.token_counts)
        )
        if learns and not (
            identity.is_service
            or vouched_by_services(
                context.invocation_metadata(), enabled=self.settings.auth_enabled, secret=self.settings.jwt_secret
            )
        ):
            raise PermissionDenied(
                "a model report (baseline, observation, token counts) is written by the Palimpsest services only"
            )
        b = report.baseline
        if b.tokens < 0 or b.through_seq < 0:
            raise InvalidArgument("report.baseline", "tokens and through_seq must not be negative")
        observation = None
        if report.HasField("observation"):
            observation = _checked_observation(report.observation, "report.observation")
        _check_token_counts(report.token_digest, report.token_counts, "report.")
        return Report(
            baseline={"tokens": b.tokens, "through_seq": b.through_seq, "model": b.model, "context_truncated": False}
            if report.HasField("baseline")
            else None,
            prompt_cut=report.prompt_cut,
            observation=observation,
            context_token_count=report.context_token_count if report.HasField("context_token_count") else None,
            token_digest=report.token_digest,
            token_counts=[(c.seq, c.tokens, c.content_md5) for c in report.token_counts],
        )

    def _tool_runs(self, runs, identity: Identity, context) -> list[dict]:
        """Audit records to write with an append, as the log keeps them: only from the services (a
        user must not write their own trail), each checked field by field."""
        if not runs:
            return []
        if not (
            identity.is_service
            or vouched_by_services(
                context.invocation_metadata(), enabled=self.settings.auth_enabled, secret=self.settings.jwt_secret
            )
        ):
            raise PermissionDenied("tool runs (the session's audit log) are written by the Palimpsest services only")
        for i, run in enumerate(runs):
            field = f"tool_runs[{i}]"
            if not run.tool.strip():
                raise InvalidArgument(f"{field}.tool", "required")
            for name in ("tool", "turn_id", "call_id"):
                if len(getattr(run, name)) > MAX_TOOL_NAME:
                    raise InvalidArgument(f"{field}.{name}", f"at most {MAX_TOOL_NAME} characters")
            if run.outcome not in convert.OUTCOME_NAMES:
                raise InvalidArgument(f"{field}.outcome", "must be OK, ERROR, REFUSED or STOPPED")
            if not (math.isfinite(run.duration_seconds) and run.duration_seconds >= 0):
                raise InvalidArgument(f"{field}.duration_seconds", "must be a finite number of seconds, not negative")
            if run.bytes_in < 0 or run.bytes_out < 0:
                raise InvalidArgument(f"{field}.bytes_in", "bytes_in and bytes_out must not be negative")
            if run.call_seq < 0 or (run.call_seq and run.arguments_json):
                raise InvalidArgument(f"{field}.call_seq", "a stored message's seq, with no arguments_json beside it")
            if not run.HasField("started_at"):  # (its range is checked with every time of the request)
                raise InvalidArgument(f"{field}.started_at", "required")
        return [convert.tool_run_row(run) for run in runs]

    async def ListToolRuns(
        self,
        request: pb.ListToolRunsRequest,
        context: grpc.aio.ServicerContext[pb.ListToolRunsRequest, pb.ListToolRunsResponse],
    ) -> pb.ListToolRunsResponse:
        identity = caller()
        session_id = parse_session_id(request.session_id)
        if request.before_seq < 0:
            raise InvalidArgument("before_seq", "must not be negative")
        after = request.after_seq if request.HasField("after_seq") else None
        if after is not None and (after < 0 or request.before_seq):
            raise InvalidArgument("after_seq", "must not be negative, and not with before_seq (one direction a page)")
        limit = page_size(request.limit, "limit")
        rows, has_more = await self.repo.tool_runs.list_runs(
            identity, session_id, before_seq=request.before_seq, after_seq=after, limit=limit
        )
        return pb.ListToolRunsResponse(runs=[convert.tool_run_from_row(r) for r in rows], has_more=has_more)

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
            new = _refs_from_proto(request.add_external_refs, "add_external_refs")
            changes["external_refs"] = lambda current: [  # (merged under the session's lock)
                convert.external_ref_to_json(r)
                for r in merge_refs(_refs_from_json(current), new, field="add_external_refs")
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
        row = await self.repo.sessions.update_session(identity, session_id, changes, _expected(request))
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
            identity, session_id, list(request.seqs), request.is_context, _expected(request)
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
            expected_revision=_expected(request),
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

    # -- raw chunks ------------------------------------------------------------------------
    async def SearchMemory(
        self,
        request: pb.SearchMemoryRequest,
        context: grpc.aio.ServicerContext[pb.SearchMemoryRequest, pb.SearchMemoryResponse],
    ) -> pb.SearchMemoryResponse:
        identity = caller()
        session_id = parse_session_id(request.session_id)
        if not request.query.strip():
            raise InvalidArgument("query", "required")
        limit = page_size(request.limit, "limit", default=5, maximum=50)
        if not 0 <= request.min_similarity <= 1:
            raise InvalidArgument("min_similarity", "must be between 0 and 1")
        embed_model = checked_model(request.embed_model)
        rows, semantic = await self.repo.memory.search_memory(
            identity, session_id, request.query.strip(), limit, request.min_similarity, self.memory_index, embed_model
        )
        return pb.SearchMemoryResponse(chunks=[convert.chunk_from_row(r) for r in rows], semantic=semantic)

    async def IndexChunks(
        self,
        request: pb.IndexChunksRequest,
        context: grpc.aio.ServicerContext[pb.IndexChunksRequest, pb.IndexChunksResponse],
    ) -> pb.IndexChunksResponse:
        identity = caller()
        session_id = parse_session_id(request.session_id)
        for i, chunk in enumerate(request.chunks):
            if not chunk.content:
                raise InvalidArgument(f"chunks[{i}].content", "required")
        indexed = await self.repo.memory.index_chunks(identity, session_id, request.chunks)
        if indexed:
            self._chunks_committed()
        return pb.IndexChunksResponse(indexed=indexed)

    # -- messages between Agent replicas ---------------------------------------------------
    def _bus(self, context) -> SessionBus:
        if not caller().is_service:
            raise PermissionDenied("the session bus carries every session's events: the Palimpsest services only")
        if self.bus is None:
            raise Unavailable("this store replica has no session bus")
        return self.bus

    async def PublishSessionMessages(
        self,
        request: pb.PublishSessionMessagesRequest,
        context: grpc.aio.ServicerContext[pb.PublishSessionMessagesRequest, pb.PublishSessionMessagesResponse],
    ) -> pb.PublishSessionMessagesResponse:
        bus = self._bus(context)
        if not 1 <= len(request.messages) <= MAX_BUS_MESSAGES:
            raise InvalidArgument("messages", f"1–{MAX_BUS_MESSAGES} messages, got {len(request.messages)}")
        for i, message in enumerate(request.messages):
            parse_session_id(message.session_id, f"messages[{i}].session_id")
            if not message.origin.strip() or len(message.origin) > 128:
                raise InvalidArgument(f"messages[{i}].origin", "required, at most 128 characters")
            if len(message.payload) > MAX_PAYLOAD_BYTES:
                raise ResourceExhausted(
                    f"messages[{i}].payload: {len(message.payload):,} bytes, at most {MAX_PAYLOAD_BYTES:,}"
                )
        await bus.publish(list(request.messages))
        return pb.PublishSessionMessagesResponse()

    async def ListenSessionMessages(
        self,
        request: pb.ListenSessionMessagesRequest,
        context: grpc.aio.ServicerContext[pb.ListenSessionMessagesRequest, pb.ListenSessionMessagesResponse],
    ) -> AsyncIterator[pb.ListenSessionMessagesResponse]:
        bus = self._bus(context)
        try:
            listener = await bus.listen(LISTEN_READY_S)
        except asyncio.TimeoutError:
            raise Unavailable("this store replica is not listening to PostgreSQL yet: listen again") from None
        try:
            yield pb.ListenSessionMessagesResponse()  # in place: nothing published from now on is missed
            while True:
                yield pb.ListenSessionMessagesResponse(messages=await listener.next_batch())
        except ListenerGone as gone:
            raise Unavailable(f"{gone}: listen again") from None
        finally:
            bus.leave(listener)

    # -- calibration and baselines -----------------------------------------------------------
    async def RecordObservation(
        self,
        request: pb.RecordObservationRequest,
        context: grpc.aio.ServicerContext[pb.RecordObservationRequest, pb.RecordObservationResponse],
    ) -> pb.RecordObservationResponse:
        caller().require_service("calibration")
        await self.repo.calibration.record_observation(*_checked_observation(request.observation, "observation"))
        return pb.RecordObservationResponse()

    async def ListObservations(
        self,
        request: pb.ListObservationsRequest,
        context: grpc.aio.ServicerContext[pb.ListObservationsRequest, pb.ListObservationsResponse],
    ) -> pb.ListObservationsResponse:
        if not caller().is_service:
            raise PermissionDenied(OBSERVATIONS_FOR_SERVICES)
        if not request.model:
            raise InvalidArgument("model", "required")
        limit = page_size(request.limit, "limit", default=8, maximum=100)
        rows = await self.repo.calibration.list_observations(request.model, limit, max(limit, EXACT_OBSERVATIONS))
        return pb.ListObservationsResponse(observations=[_observation(r) for r in rows])

    async def SetBaseline(
        self,
        request: pb.SetBaselineRequest,
        context: grpc.aio.ServicerContext[pb.SetBaselineRequest, pb.SetBaselineResponse],
    ) -> pb.SetBaselineResponse:
        identity = caller()
        identity.require_service("a baseline")
        session_id = parse_session_id(request.session_id)
        baseline = None
        if request.HasField("baseline"):
            b = request.baseline
            if b.tokens < 0 or b.through_seq < 0:
                raise InvalidArgument("baseline", "tokens and through_seq must not be negative")
            baseline = {
                "tokens": b.tokens,
                "through_seq": b.through_seq,
                "model": b.model,
                "context_truncated": b.context_truncated,
            }
        elif request.only_truncated_flag:
            raise InvalidArgument("baseline", "required with only_truncated_flag")
        await self.repo.calibration.set_baseline(identity, session_id, baseline, request.only_truncated_flag)
        return pb.SetBaselineResponse()

    async def GetBaseline(
        self,
        request: pb.GetBaselineRequest,
        context: grpc.aio.ServicerContext[pb.GetBaselineRequest, pb.GetBaselineResponse],
    ) -> pb.GetBaselineResponse:
        identity = caller()
        session_id = parse_session_id(request.session_id)
        if request.view_budget < 0:
            raise InvalidArgument("view_budget", "must not be negative")
        if request.model and not (
            identity.is_service
            or vouched_by_services(
                context.invocation_metadata(), enabled=self.settings.auth_enabled, secret=self.settings.jwt_secret
            )
        ):
            raise PermissionDenied(f"model: {OBSERVATIONS_FOR_SERVICES}; leave it empty for the session's baseline")
        row, observations, tokens = await self.repo.calibration.get_baseline(
            identity, session_id, request.model, request.token_digest, request.view_budget, request.with_counts
        )
        response = pb.GetBaselineResponse(observations=[_observation(r) for r in observations])
        if tokens is not None:
            response.context_tokens.CopyFrom(pb.ContextTokens(**tokens))
        if row is not None:
            response.baseline.CopyFrom(
                pb.Baseline(
                    tokens=row["tokens"],
                    through_seq=row["through_seq"],
                    model=row["model"],
                    context_truncated=row["context_truncated"],
                )
            )
            response.baseline.recorded_at.CopyFrom(convert.timestamp(row["recorded_at"]))
        return response

    async def SetTokenCounts(
        self,
        request: pb.SetTokenCountsRequest,
        context: grpc.aio.ServicerContext[pb.SetTokenCountsRequest, pb.SetTokenCountsResponse],
    ) -> pb.SetTokenCountsResponse:
        identity = caller()
        identity.require_service("a token count")
        session_id = parse_session_id(request.session_id)
        if not request.token_digest:
            raise InvalidArgument("token_digest", "required: a count means nothing without its tokenizer")
        _check_token_counts(request.token_digest, request.counts, "", field="counts")
        updated = await self.repo.sessions.set_token_counts(
            identity,
            session_id,
            request.token_digest,
            [c.seq for c in request.counts],
            [c.tokens for c in request.counts],
            [c.content_md5 for c in request.counts],
        )
        return pb.SetTokenCountsResponse(updated=updated)

    # -- files -----------------------------------------------------------------------------
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
            return pb.PutFileResponse(file=_file_info(info), deduplicated=deduplicated)
        if not header.filename:
            raise InvalidArgument("header.filename", "required")
        if problem := unseen_character_problem(header.filename):  # refused, not renamed quietly
            raise InvalidArgument("header.filename", problem)
        upload = await _begun(asyncio.to_thread(self.files.begin_upload, str(session_id), header.filename))
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
        return pb.PutFileResponse(file=_file_info(info))

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
        upload = await _begun(
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
        return pb.PutFileResponse(file=_file_info(info))

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
        yield pb.GetFileResponse(info=_file_info(info))
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
        return pb.ListFilesResponse(files=[_file_info(f) for f in files], token=token)

    # -- what the agent remembers about the caller -------------------------------------------
    async def GetMemory(
        self, request: pb.GetMemoryRequest, context: grpc.aio.ServicerContext[pb.GetMemoryRequest, pb.GetMemoryResponse]
    ) -> pb.GetMemoryResponse:
        owner = caller().sub
        memory = await self.repo.owner_memory.read(owner)
        caps = self.repo.owner_memory.caps
        return pb.GetMemoryResponse(
            revision=memory.revision,
            entries=[convert.memory_entry(r) for r in memory.entries],
            pending=[convert.pending_memory_write(r) for r in memory.pending],
            max_entries=caps.max_entries,
            max_chars=caps.max_chars,
            chars=sum(len(r["text"]) for r in memory.entries),
        )

    async def EditMemory(
        self,
        request: pb.EditMemoryRequest,
        context: grpc.aio.ServicerContext[pb.EditMemoryRequest, pb.EditMemoryResponse],
    ) -> pb.EditMemoryResponse:
        identity = caller()
        action = MEMORY_ACTIONS.get(request.action)
        if action is None:
            raise InvalidArgument("action", "MEMORY_ACTION_ADD, MEMORY_ACTION_REPLACE or MEMORY_ACTION_REMOVE")
        text = checked_text(request.text) if action != "remove" else ""
        if action != "add" and request.entry_id < 0:
            raise InvalidArgument("entry_id", "must not be negative")
        session_id, hold = None, request.hold
        if request.session_id:
            session_id = parse_session_id(request.session_id)
            # A write from a conversation that has taken in outside content waits for the owner,
            # whoever asks for it: an order planted in that content reads like the user's own.
            hold = hold or (await self.repo.sessions.get_session(identity, session_id))["untrusted_ingested"]
        result = await self.repo.owner_memory.edit(
            identity.sub,
            MemoryEdit(action, text, request.entry_id, request.old_text),
            expected_revision=_expected(request),
            session_id=session_id,
            hold=hold,
        )
        response = pb.EditMemoryResponse(revision=result.revision)
        if result.entry is not None:
            response.entry.CopyFrom(convert.memory_entry(result.entry))
        if result.held is not None:
            response.held.CopyFrom(convert.pending_memory_write(result.held))
        return response

    async def ApproveMemoryWrite(
        self,
        request: pb.ApproveMemoryWriteRequest,
        context: grpc.aio.ServicerContext[pb.ApproveMemoryWriteRequest, pb.ApproveMemoryWriteResponse],
    ) -> pb.ApproveMemoryWriteResponse:
        owner = caller().sub
        result = await self.repo.owner_memory.approve(owner, _held_id(request.id), _expected(request))
        response = pb.ApproveMemoryWriteResponse(revision=result.revision)
        if result.entry is not None:
            response.entry.CopyFrom(convert.memory_entry(result.entry))
        return response

    async def RejectMemoryWrite(
        self,
        request: pb.RejectMemoryWriteRequest,
        context: grpc.aio.ServicerContext[pb.RejectMemoryWriteRequest, pb.RejectMemoryWriteResponse],
    ) -> pb.RejectMemoryWriteResponse:
        owner = caller().sub
        await self.repo.owner_memory.reject(owner, _held_id(request.id))
        return pb.RejectMemoryWriteResponse()


MEMORY_ACTIONS = {pb.MEMORY_ACTION_ADD: "add", pb.MEMORY_ACTION_REPLACE: "replace", pb.MEMORY_ACTION_REMOVE: "remove"}


def _held_id(value: int) -> int:
    if value <= 0:
        raise InvalidArgument("id", "required: the held write's id (GetMemory lists them under pending)")
    return value


def checked_model(raw: str) -> str:
    """An `embed_model` field: empty (the store's), or an Ollama model name."""
    model = raw.strip()
    if len(model) > MAX_MODEL_NAME or any(c.isspace() or not c.isprintable() for c in model):
        raise InvalidArgument(
            "embed_model", f"must be an Ollama model name (at most {MAX_MODEL_NAME} characters, no spaces)"
        )
    return model


# Every user's prompt sizes and character mixes, by model: what the Compressor calibrates with.
OBSERVATIONS_FOR_SERVICES = (
    "calibration observations (every user's prompt sizes) are read by the Palimpsest services only"
)
# A century: past it an interval overflows PostgreSQL's timestamp arithmetic.
MAX_CLEANUP_DAYS = 36_500


def _observation(row) -> pb.Observation:
    observation = pb.Observation(model=row["model"], chars=row["chars"], tokens=row["tokens"])
    shape = {name: row[name] for name in EXACT_FIELDS}
    if any(shape.values()):  # an exact shape, or a calibrated one's characters by class
        observation.exact.CopyFrom(common_pb2.PromptShape(**shape))
    observation.observed_at.CopyFrom(convert.timestamp(row["observed_at"]))
    return observation


def _file_info(info) -> common_pb2.FileInfo:
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

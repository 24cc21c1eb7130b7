"""A session's messages: history pages, appends (one call or a stream), claimed turns and tool runs."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from palimpsest.shared import metrics
from palimpsest.shared.auth import Identity, caller, vouched_by_services
from palimpsest.shared.errors import InvalidArgument, PermissionDenied
from palimpsest.store import convert
from palimpsest.store.repository.access import parse_session_id
from palimpsest.store.repository.sessions import Report
from palimpsest.store.rpcs.base import StoreRpcs
from palimpsest.store.rpcs.checks import (
    MAX_TOOL_NAME,
    check_token_counts,
    checked_observation,
    expected_revision,
    page_size,
    validate_messages,
)
from palimpsest.v1 import session_store_pb2 as pb

APPEND_MESSAGES = "/palimpsest.v1.SessionStore/AppendMessages"
# A stopping replica ends the append streams waiting for their writer's next append: the writer
# sends it again on another (each append carries its idempotency key).
STOPPING_APPENDS = "this store replica is stopping: append on another"


class MessageRpcs(StoreRpcs):
    """A session's messages: history pages, appends (one call or a stream), claimed turns and tool runs."""

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

    async def _page(
        self,
        request: pb.GetHistoryPageRequest | pb.GetArchivedMessagesRequest,
        context: grpc.aio.ServicerContext[Any, Any],
        *,
        archive_only: bool,
    ) -> dict[str, Any]:
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
            validate_messages(request.messages, self.settings.message_max_bytes)
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
            expected_revision(request),
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

    def _report(
        self, report: pb.ModelReport, identity: Identity, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Report:
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
            observation = checked_observation(report.observation, "report.observation")
        check_token_counts(report.token_digest, report.token_counts, "report.")
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

    def _tool_runs(
        self, runs: Sequence[pb.ToolRun], identity: Identity, context: grpc.aio.ServicerContext[Any, Any]
    ) -> list[dict[str, Any]]:
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

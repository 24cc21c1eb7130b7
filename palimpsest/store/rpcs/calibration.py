"""Calibration: the models' prompt observations, a session's baseline and its stored token counts."""

from __future__ import annotations

import asyncpg
import grpc

from palimpsest.shared.auth import caller, vouched_by_services
from palimpsest.shared.errors import InvalidArgument, PermissionDenied
from palimpsest.store import convert
from palimpsest.store.repository.access import parse_session_id
from palimpsest.store.repository.calibration import EXACT_FIELDS, EXACT_OBSERVATIONS
from palimpsest.store.rpcs.base import StoreRpcs
from palimpsest.store.rpcs.checks import (
    check_token_counts,
    checked_observation,
    page_size,
)
from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as pb

# Every user's prompt sizes and character mixes, by model: what the Compressor calibrates with.
OBSERVATIONS_FOR_SERVICES = (
    "calibration observations (every user's prompt sizes) are read by the Palimpsest services only"
)


class CalibrationRpcs(StoreRpcs):
    """Calibration: the models' prompt observations, a session's baseline and its stored token counts."""

    async def RecordObservation(
        self,
        request: pb.RecordObservationRequest,
        context: grpc.aio.ServicerContext[pb.RecordObservationRequest, pb.RecordObservationResponse],
    ) -> pb.RecordObservationResponse:
        caller().require_service("calibration")
        await self.repo.calibration.record_observation(*checked_observation(request.observation, "observation"))
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
        return pb.ListObservationsResponse(observations=[observation_proto(r) for r in rows])

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
        response = pb.GetBaselineResponse(observations=[observation_proto(r) for r in observations])
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
        check_token_counts(request.token_digest, request.counts, "", field="counts")
        updated = await self.repo.sessions.set_token_counts(
            identity,
            session_id,
            request.token_digest,
            list(request.counts),
        )
        return pb.SetTokenCountsResponse(updated=updated)


def observation_proto(row: asyncpg.Record) -> pb.Observation:
    observation = pb.Observation(model=row["model"], chars=row["chars"], tokens=row["tokens"])
    shape = {name: row[name] for name in EXACT_FIELDS}
    if any(shape.values()):  # an exact shape, or a calibrated one's characters by class
        observation.exact.CopyFrom(common_pb2.PromptShape(**shape))
    observation.observed_at.CopyFrom(convert.timestamp(row["observed_at"]))
    return observation

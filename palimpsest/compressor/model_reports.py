"""A model's report of a prompt it evaluated (RecordBaseline), judged: a proven cut flags the session,
an honest count becomes its baseline and teaches the model's calibration, a doubtful one is dropped."""

from __future__ import annotations

import logging

from palimpsest.shared import metrics
from palimpsest.shared.auth import as_service
from palimpsest.shared.errors import InvalidArgument
from palimpsest.shared.reports import judge
from palimpsest.shared.stubs import AsyncStoreStub
from palimpsest.v1 import compressor_pb2 as pb
from palimpsest.v1 import session_store_pb2 as store_pb

log = logging.getLogger("palimpsest.compressor")
# The largest num_ctx a report may name.
MAX_WINDOW = 10_000_000


async def record_report(store: AsyncStoreStub, request: pb.RecordBaselineRequest) -> pb.RecordBaselineResponse:
    if not request.model:
        raise InvalidArgument("model", "required")
    if request.prompt_eval_count <= 0:
        raise InvalidArgument("prompt_eval_count", "must be positive")
    for name in ("sent_tokens", "sent_chars", "through_seq", "window"):
        if getattr(request, name) < 0:
            raise InvalidArgument(name, "must not be negative")
    shape = request.shape
    if any(getattr(shape, f.name) < 0 for f in shape.DESCRIPTOR.fields):
        raise InvalidArgument("shape", "counts must not be negative")
    exact = request.method == pb.ESTIMATE_METHOD_EXACT and shape.content_tokens > 0
    if exact and not 0 < request.window <= MAX_WINDOW:
        raise InvalidArgument("window", "the num_ctx the prompt was sent with is required with an exact shape")
    verdict = judge(
        request.prompt_eval_count,
        model=request.model,
        method=request.method,
        shape=shape,
        window=request.window,
        sent_chars=request.sent_chars,
        had_images=request.had_images,
    )
    metrics.model_report(
        verdict, method=request.method, counted=request.sent_tokens, reported=request.prompt_eval_count
    )
    if verdict.problem:
        field, _, why = verdict.problem.partition(": ")
        raise InvalidArgument(field, why)
    if verdict.prompt_cut:
        # Ollama evaluated fewer tokens than the content alone has, by the model's own count:
        # it cut the prompt. Keep the previous honest baseline and flag the session for the
        # post-turn pass. An estimate never raises this alarm (it cannot prove anything).
        if request.session_id:
            with as_service():
                await store.SetBaseline(
                    store_pb.SetBaselineRequest(
                        session_id=request.session_id,
                        only_truncated_flag=True,
                        baseline=store_pb.Baseline(context_truncated=True),
                    )
                )
        log.warning(
            "cut prompt: Ollama reported %d tokens, the content alone is %d (session %s)",
            request.prompt_eval_count,
            request.shape.content_tokens,
            request.session_id or "-",
        )
        return pb.RecordBaselineResponse(recorded=False, truncated=True)
    if not verdict.learned:
        log.info(
            "report of %d tokens is about half of num_ctx %d: not learned from",
            request.prompt_eval_count,
            request.window,
        )
        return pb.RecordBaselineResponse(recorded=False, truncated=False)
    with as_service():
        if request.session_id:
            await store.SetBaseline(
                store_pb.SetBaselineRequest(
                    session_id=request.session_id,
                    baseline=store_pb.Baseline(
                        tokens=request.prompt_eval_count, through_seq=request.through_seq, model=request.model
                    ),
                )
            )
        if verdict.observation is not None:
            await store.RecordObservation(store_pb.RecordObservationRequest(observation=verdict.observation))
    return pb.RecordBaselineResponse(recorded=True, truncated=False)

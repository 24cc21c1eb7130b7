"""What a model call's report is worth: judged for the store (a baseline, a cut prompt, nothing),
and the context meter the client gets after each call."""

from __future__ import annotations

import logging

from palimpsest.agent.events import EventSink
from palimpsest.shared import metrics
from palimpsest.shared.auth import as_service
from palimpsest.shared.context_view import view_chars
from palimpsest.shared.errors import PalimpsestError
from palimpsest.shared.ollama import ChatResult
from palimpsest.shared.reports import counted_exactly, judge
from palimpsest.shared.stubs import AsyncCompressorStub
from palimpsest.v1 import common_pb2
from palimpsest.v1 import compressor_pb2 as cpb
from palimpsest.v1 import session_store_pb2 as store_pb

log = logging.getLogger("palimpsest.agent")

Message = common_pb2.Message
# How a count was made, as usage events name it.
COUNT_METHODS = {
    cpb.ESTIMATE_METHOD_EXACT: "exact",
    cpb.ESTIMATE_METHOD_CALIBRATED: "calibrated",
    cpb.ESTIMATE_METHOD_BASELINE_DELTA: "calibrated",
    cpb.ESTIMATE_METHOD_FALLBACK: "heuristic",
}


def model_report(
    reply: ChatResult,
    check: cpb.CheckContextSizeResponse,
    built: list[Message],
    through_seq: int,
    *,
    model: str,
    window: int,
    stored: bool,
    session_id: str,
) -> tuple[store_pb.ModelReport, bool]:
    """The call's report as the append of its answer carries it (one write before stream_end):
    judged by the rules the Compressor's RecordBaseline applies, with the counts its size check
    made and the context's size for the meter; and whether it proves the prompt cut."""
    report = store_pb.ModelReport(
        context_token_count=check.tokens,
        token_digest=check.token_digest,
        token_counts=check.new_counts,
    )
    if not reply.prompt_eval_count or not stored:
        # (a sub-agent's report goes to RecordBaseline, which judges it: record_usage)
        return report, False
    # The prompt's characters only for a report of a prompt not counted exactly: summed over the
    # whole prompt they stood between the model's last token and stream_end for nothing.
    sent_chars, had_images = (
        (0, False) if counted_exactly(check.method, check.shape) else (view_chars(built), any(m.images for m in built))
    )
    verdict = judge(
        reply.prompt_eval_count,
        model=model,
        method=check.method,
        shape=check.shape,
        window=window,
        sent_chars=sent_chars,
        had_images=had_images,
    )
    metrics.model_report(verdict, method=check.method, counted=check.tokens, reported=reply.prompt_eval_count)
    if verdict.problem:
        log.warning("the model's report for %s is not kept: %s", session_id or "-", verdict.problem)
    elif verdict.prompt_cut:
        # Ollama evaluated fewer tokens than the content alone has: it cut the prompt. The
        # session is flagged for the post-turn pass; the meter keeps our own count.
        report.prompt_cut = True
        log.warning(
            "cut prompt: Ollama reported %d tokens, the content alone is %d (session %s)",
            reply.prompt_eval_count,
            check.shape.content_tokens,
            session_id or "-",
        )
        return report, True
    elif verdict.learned:
        report.baseline.CopyFrom(
            store_pb.Baseline(tokens=reply.prompt_eval_count, through_seq=through_seq, model=model)
        )
        if verdict.observation is not None:
            report.observation.CopyFrom(verdict.observation)
        report.context_token_count = reply.prompt_eval_count
    return report, False


async def record_usage(
    reply: ChatResult,
    check: cpb.CheckContextSizeResponse,
    built: list[Message],
    report: store_pb.ModelReport,
    *,
    compressor: AsyncCompressorStub,
    sink: EventSink,
    model: str,
    window: int,
    stored: bool,
    parent_session_id: str,
) -> int:
    """The meter after a call, and the prompt's tokens it shows. A stored session's report goes
    with the append of the answer; a sub-agent's (nothing stored) still teaches the model's
    calibration through RecordBaseline."""
    reported = report.HasField("baseline")
    if not stored and reply.prompt_eval_count:
        try:
            # A model report teaches every session of the model: the services' own.
            with as_service():
                recorded = await compressor.RecordBaseline(
                    cpb.RecordBaselineRequest(
                        model=model,
                        prompt_eval_count=reply.prompt_eval_count,
                        sent_tokens=check.tokens,
                        sent_chars=view_chars(built),
                        had_images=any(m.images for m in built),
                        window=window,
                        shape=check.shape,
                        method=check.method,
                    )
                )
            reported = recorded.recorded
        except PalimpsestError as exc:  # the answer is there; a lost report only costs precision
            log.warning("could not record the report of a sub-agent of %s: %s", parent_session_id, exc)
    tokens = reply.prompt_eval_count if reported and reply.prompt_eval_count else check.tokens
    metrics.model_call(reply.prompt_eval_count or 0, reply.eval_count or 0)
    sink.usage(
        tokens,
        window,
        reply.prompt_eval_count or 0,
        reply.eval_count or 0,
        "reported" if reported else COUNT_METHODS.get(check.method, "heuristic"),
    )
    return tokens

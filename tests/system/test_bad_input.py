"""Bad input gets INVALID_ARGUMENT naming the field, never INTERNAL, and changes nothing."""

from __future__ import annotations

import math

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from palimpsest.agent.conversation import storable
from palimpsest.shared.validation import MAX_ERROR_CHARS
from palimpsest.v1 import agent_pb2
from palimpsest.v1 import compressor_pb2 as cpb
from palimpsest.v1 import session_store_pb2 as pb
from palimpsest.v1.common_pb2 import ExternalRef, Message, RawChunk, ToolCall


async def refused(call, request, field: str) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await call(request)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value.details()
    assert error.value.details().startswith(field), error.value.details()
    return error.value.details()


async def new_session(store, profile: str) -> str:
    session = (await store.CreateSession(pb.CreateSessionRequest(profile_id=profile))).session
    await store.AppendMessages(
        pb.AppendMessagesRequest(session_id=session.id, messages=[Message(role="user", content="hello")])
    )
    return session.id


async def test_a_nul_character_anywhere_in_a_store_request_is_refused_naming_it(store, profile):
    session_id = await new_session(store, profile)
    before = (await store.GetSession(pb.GetSessionRequest(session_id=session_id, view=pb.SESSION_VIEW_FULL))).session
    await refused(store.CreateSession, pb.CreateSessionRequest(profile_id=profile, name="a\x00b"), "name")
    await refused(store.ListSessions, pb.ListSessionsRequest(query="x\x00"), "query")
    await refused(
        store.AppendMessages,
        pb.AppendMessagesRequest(
            session_id=session_id,
            messages=[Message(role="user", content="fine"), Message(role="assistant", content="bad\x00")],
        ),
        "messages[1].content",
    )
    await refused(
        store.AppendMessages,
        pb.AppendMessagesRequest(
            session_id=session_id,
            messages=[Message(role="assistant", tool_calls=[ToolCall(name="t", arguments_json='{"a": "\x00"}')])],
        ),
        "messages[0].tool_calls[0].arguments_json",
    )
    bad_meta = Message(role="user", content="ok")
    bad_meta.metadata.update({"note": "a\x00"})
    await refused(
        store.AppendMessages,
        pb.AppendMessagesRequest(session_id=session_id, messages=[bad_meta]),
        "messages[0].metadata",
    )
    await refused(
        store.IndexChunks,
        pb.IndexChunksRequest(session_id=session_id, chunks=[RawChunk(content="chunk\x00")]),
        "chunks[0].content",
    )
    after = (await store.GetSession(pb.GetSessionRequest(session_id=session_id, view=pb.SESSION_VIEW_FULL))).session
    assert after.revision == before.revision and len(after.messages) == len(before.messages)
    names = [s.name for s in (await store.ListSessions(pb.ListSessionsRequest(profile_id=profile))).sessions]
    assert names == [""]  # no session named "a\x00b" was made


async def test_the_compressor_and_the_agent_refuse_nul_in_their_own_fields(compressor, agent):
    await refused(compressor.EstimateTokens, cpb.EstimateTokensRequest(model="qwen\x003.6"), "model")
    await refused(
        compressor.CheckContextSize,
        cpb.CheckContextSizeRequest(model="m\x00", messages=[Message(role="user", content="hi")]),
        "model",
    )
    stream = agent.RunStream(agent_pb2.RunStreamRequest(text="hi\x00there"))
    with pytest.raises(grpc.aio.AioRpcError) as error:
        async for _ in stream:
            pass
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and error.value.details().startswith("text")


async def test_cleanup_far_in_the_past_is_refused_not_an_overflow(store):
    details = await refused(
        store.CleanupSessions, pb.CleanupSessionsRequest(older_than_days=2_147_483_647), "older_than_days"
    )
    assert "36500" in details


async def test_an_error_never_quotes_a_huge_value_back(store):
    details = await refused(store.GetSession, pb.GetSessionRequest(session_id="x" * 100_000), "session_id")
    assert len(details) < MAX_ERROR_CHARS + 100


async def test_each_bad_size_is_named_for_itself(compressor, agent):
    for field in ("sent_chars", "through_seq", "window"):
        request = cpb.RecordBaselineRequest(model="m", prompt_eval_count=10)
        setattr(request, field, -1)
        await refused(compressor.RecordBaseline, request, field)
    for timeout in (-1.0, math.nan, math.inf):
        await refused(
            agent.RunEphemeral, agent_pb2.RunEphemeralRequest(text="go", timeout_seconds=timeout), "timeout_seconds"
        )


def test_the_agent_stores_its_own_nul_output_as_a_replacement_character():
    message = Message(role="tool", content="bin\x00ary", tool_calls=[ToolCall(arguments_json='{"a": "\x00"}')])
    stored = storable(message)
    assert stored.content == "bin\ufffdary" and stored.tool_calls[0].arguments_json == '{"a": "\ufffd"}'
    assert message.content == "bin\x00ary"  # the caller's message is not changed
    clean = Message(role="tool", content="plain")
    assert storable(clean) is clean


async def test_a_second_server_on_a_taken_port_is_a_one_line_error(base_settings, store_server):
    from palimpsest.shared.server import start_server

    with pytest.raises(SystemExit) as stopped:
        await start_server(lambda server: None, [], settings=base_settings, port=store_server.port)
    assert f"127.0.0.1:{store_server.port}" in str(stopped.value) and "taken" in str(stopped.value)


async def test_names_and_ids_have_documented_limits(store, profile):
    await refused(store.CreateSession, pb.CreateSessionRequest(profile_id="p" * 129), "profile_id")
    await refused(store.CreateSession, pb.CreateSessionRequest(profile_id=profile, name="n" * 501), "name")
    await refused(store.ListSessions, pb.ListSessionsRequest(query="q" * 2001), "query")
    await refused(store.GetSession, pb.GetSessionRequest(session_id="x" * 100_000), "session_id")
    names = [s.name for s in (await store.ListSessions(pb.ListSessionsRequest(profile_id=profile))).sessions]
    assert names == []  # nothing was created


# -- times and enums ----------------------------------------------------------------------------
YEAR_1, FAR_FUTURE = -62135596800, 2**40  # what the probe sent: 0001-01-01, and seconds past year 9999


async def refused_stream(call, request, field: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        async for _ in call(request):
            pass
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value.details()
    assert error.value.details().startswith(field), error.value.details()


@pytest.mark.parametrize("seconds, nanos", [(YEAR_1, 0), (FAR_FUTURE, 0), (-1, 0), (1_700_000_000, -1)])
async def test_a_time_out_of_range_is_refused_naming_it_wherever_a_request_carries_one(
    store, compressor, agent, profile, seconds, nanos
):
    session_id = await new_session(store, profile)
    before = (await store.GetSession(pb.GetSessionRequest(session_id=session_id, view=pb.SESSION_VIEW_FULL))).session
    bad = Timestamp(seconds=seconds, nanos=nanos)
    ok_ref = ExternalRef(kind="ci-run", uri="https://ci.example.test/runs/1", created_by="ci")
    bad_ref = ExternalRef(kind="ci-run", uri="https://ci.example.test/runs/2", created_by="ci", created_at=bad)
    await refused(
        store.CreateSession,
        pb.CreateSessionRequest(profile_id=profile, external_refs=[bad_ref]),
        "external_refs[0].created_at",
    )
    await refused(
        store.UpdateSession,
        pb.UpdateSessionRequest(session_id=session_id, add_external_refs=[ok_ref, bad_ref]),
        "add_external_refs[1].created_at",
    )
    await refused(
        store.AppendMessages,
        pb.AppendMessagesRequest(
            session_id=session_id,
            messages=[Message(role="user", content="fine"), Message(role="assistant", content="then", created_at=bad)],
        ),
        "messages[1].created_at",
    )
    await refused(
        store.CommitCompression,
        pb.CommitCompressionRequest(
            session_id=session_id, demote_seqs=[1], summary=Message(role="user", content="summary", created_at=bad)
        ),
        "summary.created_at",
    )
    await refused(
        store.CommitCompression,
        pb.CommitCompressionRequest(
            session_id=session_id,
            demote_seqs=[1],
            chunks=[RawChunk(content="dropped", first_at=Timestamp(seconds=1_700_000_000), last_at=bad)],
        ),
        "chunks[0].last_at",
    )
    await refused(
        store.IndexChunks,
        pb.IndexChunksRequest(session_id=session_id, chunks=[RawChunk(content="dropped", first_at=bad)]),
        "chunks[0].first_at",
    )
    await refused(
        store.SetBaseline,
        pb.SetBaselineRequest(session_id=session_id, baseline=pb.Baseline(tokens=10, recorded_at=bad)),
        "baseline.recorded_at",
    )
    await refused(
        store.RecordObservation,
        pb.RecordObservationRequest(observation=pb.Observation(model="m", chars=10, tokens=3, observed_at=bad)),
        "observation.observed_at",
    )
    await refused(
        compressor.CheckContextSize,
        cpb.CheckContextSizeRequest(model="m", messages=[Message(role="user", content="hi", created_at=bad)]),
        "messages[0].created_at",
    )
    await refused(agent.Run, agent_pb2.RunRequest(text="hi", external_refs=[bad_ref]), "external_refs[0].created_at")
    await refused_stream(
        agent.RunStream,
        agent_pb2.RunStreamRequest(session_id=session_id, text="hi", external_refs=[ok_ref, bad_ref]),
        "external_refs[1].created_at",
    )
    after = (await store.GetSession(pb.GetSessionRequest(session_id=session_id, view=pb.SESSION_VIEW_FULL))).session
    assert after == before  # nothing written: no message, summary, ref or revision
    assert (await store.ListSessions(pb.ListSessionsRequest(profile_id=profile))).total == 1


async def test_a_zero_time_means_unset_and_is_stamped_with_the_write(store, profile):
    session_id = await new_session(store, profile)
    zero = Timestamp()  # set, and the epoch: what a client that means "unset" often sends
    written = await store.AppendMessages(
        pb.AppendMessagesRequest(
            session_id=session_id, messages=[Message(role="assistant", content="answer", created_at=zero)]
        )
    )
    committed = await store.CommitCompression(
        pb.CommitCompressionRequest(  # once a NotNullViolation (INTERNAL)
            session_id=session_id,
            demote_seqs=[1],
            summary=Message(role="user", content="summary", created_at=zero),
            chunks=[RawChunk(content="hello", first_at=zero, last_at=zero)],
        )
    )
    session = (await store.GetSession(pb.GetSessionRequest(session_id=session_id, view=pb.SESSION_VIEW_FULL))).session
    stamped = {m.seq: m.created_at.seconds for m in [*session.messages, *session.context]}
    assert stamped[written.seqs[0]] > 1_700_000_000 and stamped[committed.summary_seq] > 1_700_000_000


async def test_a_compression_that_postgresql_could_not_store_is_refused_and_writes_nothing(store, profile):
    session_id = await new_session(store, profile)
    before = (await store.GetSession(pb.GetSessionRequest(session_id=session_id, view=pb.SESSION_VIEW_FULL))).session
    marker = Message(role="system", content="compressed")
    marker.metadata.update({"ratio": math.nan})
    await refused(
        store.CommitCompression,
        pb.CommitCompressionRequest(session_id=session_id, demote_seqs=[1], marker=marker),
        "marker.metadata",
    )
    await refused(
        store.CommitCompression,
        pb.CommitCompressionRequest(
            session_id=session_id, demote_seqs=[1], summary=Message(role="narrator", content="s")
        ),
        "summary.role",
    )
    await refused(
        store.CommitCompression,
        pb.CommitCompressionRequest(
            session_id=session_id, demote_seqs=[1], summary=Message(role="user", content="s", elapsed_seconds=math.inf)
        ),
        "summary.elapsed_seconds",
    )
    after = (await store.GetSession(pb.GetSessionRequest(session_id=session_id, view=pb.SESSION_VIEW_FULL))).session
    assert after == before


async def test_an_enum_value_the_proto_does_not_define_is_refused_naming_it(store, compressor, profile):
    session_id = await new_session(store, profile)

    async def upload(kind: int):
        yield pb.PutFileRequest(header=pb.PutFileHeader(session_id=session_id, filename="notes.txt", kind=kind))
        yield pb.PutFileRequest(chunk=b"some notes")

    await refused(store.PutFile, upload(99), "header.kind")
    await refused(
        compressor.RecordBaseline, cpb.RecordBaselineRequest(model="m", prompt_eval_count=10, method=99), "method"
    )
    await refused(store.GetSession, pb.GetSessionRequest(session_id=session_id, view=42), "view")
    assert not (await store.ListFiles(pb.ListFilesRequest(session_id=session_id))).files
    session = (await store.GetSession(pb.GetSessionRequest(session_id=session_id))).session
    assert not session.untrusted_ingested  # the refused upload did not count as content taken in

"""Bad input gets INVALID_ARGUMENT naming the field, never INTERNAL, and changes nothing."""

from __future__ import annotations

import math

import grpc
import pytest

from palimpsest.v1 import agent_pb2, compressor_pb2 as cpb, session_store_pb2 as pb
from palimpsest.v1.common_pb2 import Message, RawChunk, ToolCall
from services.agent.conversation import storable
from services.shared.validation import MAX_ERROR_CHARS


async def refused(call, request, field: str) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await call(request)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value.details()
    assert error.value.details().startswith(field), error.value.details()
    return error.value.details()


async def new_session(store, profile: str) -> str:
    session = (await store.CreateSession(pb.CreateSessionRequest(profile_id=profile))).session
    await store.AppendMessages(pb.AppendMessagesRequest(session_id=session.id, messages=[
        Message(role="user", content="hello")]))
    return session.id


async def test_a_nul_character_anywhere_in_a_store_request_is_refused_naming_it(store, profile):
    session_id = await new_session(store, profile)
    before = (await store.GetSession(pb.GetSessionRequest(session_id=session_id, view=pb.SESSION_VIEW_FULL))).session
    await refused(store.CreateSession, pb.CreateSessionRequest(profile_id=profile, name="a\x00b"), "name")
    await refused(store.ListSessions, pb.ListSessionsRequest(query="x\x00"), "query")
    await refused(store.AppendMessages, pb.AppendMessagesRequest(session_id=session_id, messages=[
        Message(role="user", content="fine"), Message(role="assistant", content="bad\x00")]), "messages[1].content")
    await refused(store.AppendMessages, pb.AppendMessagesRequest(session_id=session_id, messages=[
        Message(role="assistant", tool_calls=[ToolCall(name="t", arguments_json='{"a": "\x00"}')])]),
        "messages[0].tool_calls[0].arguments_json")
    bad_meta = Message(role="user", content="ok")
    bad_meta.metadata.update({"note": "a\x00"})
    await refused(store.AppendMessages, pb.AppendMessagesRequest(session_id=session_id, messages=[bad_meta]),
                  "messages[0].metadata")
    await refused(store.IndexChunks, pb.IndexChunksRequest(session_id=session_id, chunks=[
        RawChunk(content="chunk\x00")]), "chunks[0].content")
    after = (await store.GetSession(pb.GetSessionRequest(session_id=session_id, view=pb.SESSION_VIEW_FULL))).session
    assert after.revision == before.revision and len(after.messages) == len(before.messages)
    names = [s.name for s in (await store.ListSessions(pb.ListSessionsRequest(profile_id=profile))).sessions]
    assert names == [""]  # no session named "a\x00b" was made


async def test_the_compressor_and_the_agent_refuse_nul_in_their_own_fields(compressor, agent):
    await refused(compressor.EstimateTokens, cpb.EstimateTokensRequest(model="qwen\x003.6"), "model")
    await refused(compressor.CheckContextSize, cpb.CheckContextSizeRequest(
        model="m\x00", messages=[Message(role="user", content="hi")]), "model")
    stream = agent.RunStream(agent_pb2.RunStreamRequest(text="hi\x00there"))
    with pytest.raises(grpc.aio.AioRpcError) as error:
        async for _ in stream:
            pass
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and error.value.details().startswith("text")


async def test_cleanup_far_in_the_past_is_refused_not_an_overflow(store):
    details = await refused(store.CleanupSessions, pb.CleanupSessionsRequest(older_than_days=2_147_483_647),
                            "older_than_days")
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
        await refused(agent.RunEphemeral, agent_pb2.RunEphemeralRequest(text="go", timeout_seconds=timeout),
                      "timeout_seconds")


def test_the_agent_stores_its_own_nul_output_as_a_replacement_character():
    message = Message(role="tool", content="bin\x00ary", tool_calls=[ToolCall(arguments_json='{"a": "\x00"}')])
    stored = storable(message)
    assert stored.content == "bin\ufffdary" and stored.tool_calls[0].arguments_json == '{"a": "\ufffd"}'
    assert message.content == "bin\x00ary"  # the caller's message is not changed
    clean = Message(role="tool", content="plain")
    assert storable(clean) is clean


async def test_a_second_server_on_a_taken_port_is_a_one_line_error(base_settings, store_server):
    from services.shared.server import start_server

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

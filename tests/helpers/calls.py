"""Helpers the test modules share for calling the services: sessions and messages on the store,
turns on the Agent, files both ways. (Test modules import from here, never from each other.)"""

from __future__ import annotations

import io

import grpc
import pytest
from PIL import Image

from palimpsest.v1 import agent_pb2, common_pb2
from palimpsest.v1 import session_store_pb2 as store_pb

Message = common_pb2.Message
END = agent_pb2.StreamEndReason


# -- the store ------------------------------------------------------------------------------------
async def new_session(store, profile, **kw) -> common_pb2.Session:
    return (await store.CreateSession(store_pb.CreateSessionRequest(profile_id=profile, **kw))).session


async def append(store, session_id, *messages, **kw) -> store_pb.AppendMessagesResponse:
    return await store.AppendMessages(store_pb.AppendMessagesRequest(session_id=session_id, messages=messages, **kw))


async def full(store, session_id) -> common_pb2.Session:
    return (
        await store.GetSession(store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_FULL))
    ).session


async def expect_status(call, code: grpc.StatusCode, *words: str) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    assert err.value.code() == code, err.value.details()
    for word in words:
        assert word in err.value.details()
    return err.value.details()


def shown(message: Message) -> bytes:
    """A display row as the user sees it: everything but its context membership."""
    copy = Message()
    copy.CopyFrom(message)
    copy.is_context = False
    return copy.SerializeToString()


def conversation(turns: int) -> list[Message]:
    out = []
    for i in range(turns):
        out += [Message(role="user", content=f"question {i}"), Message(role="assistant", content=f"answer {i}")]
    return out


# -- turns on the Agent ---------------------------------------------------------------------------
async def run(agent, text="hello", **kw) -> list[agent_pb2.AgentEvent]:
    return [e async for e in agent.RunStream(agent_pb2.RunStreamRequest(text=text, **kw))]


def kinds(events) -> list[str]:
    return [e.WhichOneof("event") for e in events]


def end_of(events) -> agent_pb2.StreamEnd:
    ends = [e.stream_end for e in events if e.HasField("stream_end") and not e.is_subagent]
    assert len(ends) == 1, kinds(events)
    return ends[0]


def text_of(events) -> str:
    return "".join(e.text_delta.text for e in events if e.HasField("text_delta") and not e.is_subagent)


async def session_due_for_a_post_turn_compression(store):
    """Six turns of history whose last prompt came back cut: the next turn's post-turn pass
    compresses whatever the threshold says."""
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="small"))).session
    history = []
    for i in range(6):
        history += [
            Message(role="user", content=f"question {i} " + "words " * 60),
            Message(role="assistant", content=f"answer {i} " + "words " * 60),
        ]
    await store.AppendMessages(store_pb.AppendMessagesRequest(session_id=session.id, messages=history))
    await store.SetBaseline(
        store_pb.SetBaselineRequest(
            session_id=session.id, only_truncated_flag=True, baseline=store_pb.Baseline(context_truncated=True)
        )
    )
    return session


# -- files ----------------------------------------------------------------------------------------
def inline(name: str, data: bytes) -> agent_pb2.InlineAttachment:
    return agent_pb2.InlineAttachment(filename=name, data=data)


async def put_file(store, session_id: str, name: str, data: bytes) -> str:
    async def parts():
        yield store_pb.PutFileRequest(header=store_pb.PutFileHeader(session_id=session_id, filename=name))
        yield store_pb.PutFileRequest(chunk=data)

    return (await store.PutFile(parts())).file.name


async def file_bytes(store, session_id: str, name: str) -> bytes:
    data = b""
    async for part in store.GetFile(store_pb.GetFileRequest(session_id=session_id, name=name)):
        data += part.chunk
    return data


def png_bytes() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(out, "PNG")
    return out.getvalue()

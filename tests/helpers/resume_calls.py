"""A turn as the resume tests run it, events and end together."""

from __future__ import annotations

from palimpsest.v1 import agent_pb2 as pb

END = pb.StreamEndReason


async def turn(agent, text="hello", **kw) -> list[pb.AgentEvent]:
    events = [e async for e in agent.RunStream(pb.RunStreamRequest(text=text, **kw))]
    ends = [e.stream_end for e in events if e.HasField("stream_end") and not e.is_subagent]
    assert [end.reason for end in ends] == [END.STREAM_END_REASON_COMPLETED], events
    return events

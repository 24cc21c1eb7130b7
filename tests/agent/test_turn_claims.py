"""Turns on one session across Agent replicas: the store says whose turn it is (ClaimTurn), so two
Agents on one PostgreSQL never run two turns of one session at once, and a dead replica's claim
runs out on its own."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest

from ollama_sim import Reply
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import session_store_pb2 as store_pb
from tests.helpers.calls import expect_status, full
from tests.helpers.replica_agents import two_agents


async def turn(agent, session_id: str, text: str, first_text: asyncio.Event | None = None) -> list:
    events = []
    async for event in agent.RunStream(pb.RunStreamRequest(session_id=session_id, text=text)):
        events.append(event)
        if first_text is not None and event.HasField("text_delta"):
            first_text.set()
    return events


async def interleaving(agents, store, ollama_sim) -> tuple[list[str], list[int]]:
    """A turn on one Agent, and while it streams a turn on the same session on the other: the
    session's messages as stored, and how the two turns ended."""
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="small"))).session
    ollama_sim.script(Reply(text="one two three four five six", chunk_delay=0.15), Reply(text="second answer"))
    streaming = asyncio.Event()
    first = asyncio.create_task(turn(agents[0], session.id, "first question", streaming))
    await streaming.wait()
    second = await turn(agents[1], session.id, "second question")
    done = await first
    stored = [f"{m.role}:{m.content}" for m in (await full(store, session.id)).messages if not m.is_compression]
    return stored, [done[-1].stream_end.reason, second[-1].stream_end.reason]


async def test_two_agents_never_run_two_turns_of_one_session_at_once(
    base_settings, store_server, compressor_server, ollama_sim, profiles_file, store
):
    async with two_agents(base_settings, store_server, compressor_server, ollama_sim, profiles_file, True) as agents:
        stored, ends = await interleaving(agents, store, ollama_sim)
    assert ends == [pb.STREAM_END_REASON_COMPLETED] * 2
    assert stored == [
        "user:first question",
        "assistant:one two three four five six",
        "user:second question",
        "assistant:second answer",
    ]


async def test_without_claims_two_agents_interleave_one_sessions_turns(
    base_settings, store_server, compressor_server, ollama_sim, profiles_file, store
):
    """What the claims prevent (and what this suite would miss if they did nothing)."""
    async with two_agents(base_settings, store_server, compressor_server, ollama_sim, profiles_file, False) as agents:
        stored, ends = await interleaving(agents, store, ollama_sim)
    # The second turn's message lands mid-answer, and the first answer then loses to its revision.
    assert stored[:2] == ["user:first question", "user:second question"]
    assert ends[0] == pb.STREAM_END_REASON_ERROR


async def test_a_dead_replicas_claim_runs_out_and_the_next_turn_takes_the_session(
    base_settings, store_server, compressor_server, ollama_sim, profiles_file, store
):
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="small"))).session
    taken = await store.ClaimTurn(store_pb.ClaimTurnRequest(session_id=session.id, holder="dead/1", ttl_seconds=1))
    assert taken.granted
    async with two_agents(base_settings, store_server, compressor_server, ollama_sim, profiles_file, True) as agents:
        ollama_sim.script(Reply(text="after the claim ran out"))
        events = await asyncio.wait_for(turn(agents[0], session.id, "anyone there?"), timeout=30)
    assert events[-1].stream_end.text == "after the claim ran out"
    # Released after the turn: another holder gets it at once.
    assert (
        await store.ClaimTurn(store_pb.ClaimTurnRequest(session_id=session.id, holder="next/1", ttl_seconds=5))
    ).granted


async def test_a_claim_is_granted_renewed_refused_and_released(store):
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="p"))).session

    async def claim(holder: str, ttl: int = 30, release: bool = False) -> store_pb.ClaimTurnResponse:
        return await store.ClaimTurn(
            store_pb.ClaimTurnRequest(session_id=session.id, holder=holder, ttl_seconds=ttl, release=release)
        )

    assert (await claim("a/1")).granted
    assert (await claim("a/1")).granted  # renewed by its holder
    refused = await claim("b/1")
    assert not refused.granted and refused.holder == "a/1" and 0 < refused.expires_in_seconds <= 30
    assert (await claim("b/1", release=True)).granted  # releasing what one does not hold changes nothing
    assert not (await claim("b/1")).granted
    assert (await claim("a/1", release=True)).granted
    assert (await claim("b/1")).granted
    before = (await store.GetSession(store_pb.GetSessionRequest(session_id=session.id))).session.revision
    assert before == session.revision  # a claim is not a change to the session


@pytest.mark.parametrize(
    "holder, ttl, field",
    [("", 30, "holder"), ("x" * 129, 30, "holder"), ("a/1", 0, "ttl_seconds"), ("a/1", 3601, "ttl_seconds")],
)
async def test_a_bad_claim_is_refused_naming_its_field(store, holder, ttl, field):
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="p"))).session
    await expect_status(
        store.ClaimTurn(store_pb.ClaimTurnRequest(session_id=session.id, holder=holder, ttl_seconds=ttl)),
        grpc.StatusCode.INVALID_ARGUMENT,
        field,
    )
    await expect_status(
        store.ClaimTurn(store_pb.ClaimTurnRequest(session_id=str(uuid.uuid4()), holder="a/1", ttl_seconds=5)),
        grpc.StatusCode.NOT_FOUND,
    )

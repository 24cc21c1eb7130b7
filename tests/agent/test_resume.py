"""Sessions remember what ran them: the provider and model a session last ran on (restored when it
continues, moved by a profile asked for or by switch_profile) and the external refs its turns
brought, against the Agent end to end: real gRPC servers, the store on PostgreSQL, the Ollama
simulator over HTTP."""

from __future__ import annotations

import socket
import uuid

import grpc
import pytest

from ollama_sim import Reply
from palimpsest.agent.profiles import PROVIDER, Profile, ProfileRegistry
from palimpsest.shared.errors import FailedPrecondition
from palimpsest.shared.external_refs import MAX_REFS_PER_REQUEST, MAX_REFS_PER_SESSION
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as store_pb
from tests.helpers.calls import expect_status, full
from tests.helpers.resume_calls import turn

# Each test starts from the simulator's deterministic echo.
pytestmark = pytest.mark.usefixtures("fresh_sim")


def models_called(ollama_sim) -> list[str]:
    return [body["model"] for body in ollama_sim.bodies()]


async def ran_on(store, session_id) -> tuple[str, str, str]:
    session = await full(store, session_id)
    return session.profile_id, session.provider, session.model


# -- the pure part -------------------------------------------------------------------------------
def test_resumed_keeps_the_profile_and_takes_the_model_the_session_last_ran_on():
    registry = ProfileRegistry({"writer": Profile(id="writer", model="qwen3.6", max_iterations=7)}, "writer")
    resumed = registry.resumed("writer", PROVIDER, "tiny")
    assert (resumed.id, resumed.model, resumed.max_iterations) == ("writer", "tiny", 7)
    assert registry.profiles["writer"].model == "qwen3.6"  # the configured profile is untouched
    assert registry.resumed("writer", "", "").model == "qwen3.6"  # never recorded: the profile's own
    assert registry.resumed("gone", PROVIDER, "tiny").id == "writer"  # a removed profile: the default's
    with pytest.raises(FailedPrecondition, match="provider: the session last ran on 'openai'"):
        registry.resumed("writer", "openai", "gpt-4o")


# -- end to end ----------------------------------------------------------------------------------
async def test_a_new_session_records_the_provider_and_model_it_runs_on(agent, store, ollama_sim):
    events = await turn(agent, "hi", profile_id="tiny")
    assert models_called(ollama_sim) == ["tiny"]
    assert await ran_on(store, events[0].session_id) == ("tiny", PROVIDER, "tiny")


async def test_continue_runs_on_the_model_the_session_last_ran_on(agent, store, ollama_sim):
    """The profile's model changed since the session last ran (the file edited, here: stored on
    another): continuing without a profile stays on the session's model."""
    session = (
        await store.CreateSession(store_pb.CreateSessionRequest(profile_id="small", provider=PROVIDER, model="tiny"))
    ).session
    events = await turn(agent, "go on", session_id=session.id)
    assert models_called(ollama_sim) == ["tiny"]
    assert [e.model_info.model for e in events if e.HasField("model_info")] == ["tiny"]
    assert await ran_on(store, session.id) == ("small", PROVIDER, "tiny")


async def test_a_profile_asked_for_moves_the_session_to_its_model_from_then_on(agent, store, ollama_sim):
    session = (
        await store.CreateSession(store_pb.CreateSessionRequest(profile_id="small", provider=PROVIDER, model="tiny"))
    ).session
    await turn(agent, "use the profile's own model", session_id=session.id, profile_id="small")
    assert await ran_on(store, session.id) == ("small", PROVIDER, "qwen3.6")
    await turn(agent, "and again", session_id=session.id)
    assert models_called(ollama_sim) == ["qwen3.6", "qwen3.6"]


async def test_switch_profile_records_the_model_and_the_next_turn_resumes_on_it(agent, store, ollama_sim):
    ollama_sim.script(
        Reply(tool_calls=[("switch_profile", {"profile_id": "tiny"})]),
        Reply(text="switched"),
        Reply(text="still quick"),
    )
    events = await turn(agent, "switch to the tiny profile", profile_id="small")
    session_id = events[0].session_id
    assert await ran_on(store, session_id) == ("tiny", PROVIDER, "tiny")
    await turn(agent, "next", session_id=session_id)
    assert models_called(ollama_sim) == ["qwen3.6", "tiny", "tiny"]


async def test_a_session_never_recorded_runs_on_its_profile_and_records_it(agent, store, ollama_sim):
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="tiny"))).session
    assert (session.provider, session.model) == ("", "")
    await turn(agent, "hello", session_id=session.id)
    assert models_called(ollama_sim) == ["tiny"]
    assert await ran_on(store, session.id) == ("tiny", PROVIDER, "tiny")


async def test_a_session_of_another_provider_is_refused_unless_a_profile_is_asked_for(agent, store, ollama_sim):
    session = (
        await store.CreateSession(store_pb.CreateSessionRequest(profile_id="small", provider="openai", model="gpt-4o"))
    ).session
    calls = agent.RunStream(pb.RunStreamRequest(session_id=session.id, text="hello"))
    await expect_status(_drain(calls), grpc.StatusCode.FAILED_PRECONDITION, "provider", "'openai'", "profile_id")
    assert not (await full(store, session.id)).messages and not ollama_sim.bodies()
    await turn(agent, "hello", session_id=session.id, profile_id="small")
    assert await ran_on(store, session.id) == ("small", PROVIDER, "qwen3.6")


async def _drain(call) -> None:
    async for _ in call:
        pass


# -- external refs -------------------------------------------------------------------------------
def ref(kind: str, uri: str, created_by: str = "ci", **kw) -> common_pb2.ExternalRef:
    return common_pb2.ExternalRef(kind=kind, uri=uri, created_by=created_by, **kw)


def refs_of(session) -> list[tuple[str, str, str, bool]]:
    return [(r.kind, r.uri, r.created_by, r.read_only) for r in session.external_refs]


async def test_a_turn_stores_its_refs_and_a_continue_adds_without_removing(agent, store, ollama_sim):
    run = ref("ci-run", "https://ci.example.test/runs/4821?token=s3cret", read_only=True)
    events = await turn(agent, "summarize the failing tests", external_refs=[run])
    session_id = events[0].session_id
    stored = await full(store, session_id)
    assert refs_of(stored) == [("ci-run", "https://ci.example.test/runs/4821?token=[REDACTED]", "ci", True)]
    assert stored.external_refs[0].created_at.seconds > 0  # stamped when it came without one

    dash = ref("dashboard", "https://grafana.example.test/d/abc", "ops")
    await turn(agent, "and the dashboard?", session_id=session_id, external_refs=[dash, run])
    await turn(agent, "no refs this time", session_id=session_id)
    assert [r[0] for r in refs_of(await full(store, session_id))] == ["ci-run", "dashboard"]


async def test_the_unary_run_stores_refs_too(agent, store):
    reply = await agent.Run(pb.RunRequest(text="hello", external_refs=[ref("ticket", "https://t.test/PAL-1")]))
    assert refs_of(await full(store, reply.session_id)) == [("ticket", "https://t.test/PAL-1", "ci", False)]


@pytest.mark.parametrize(
    "bad, field",
    [
        (ref("CI Run", "https://ci.test/1"), "external_refs[1].kind"),
        (ref("ci-run", "https://ci.test/1\nforged"), "external_refs[1].uri"),
        (ref("ci-run", "https://ci.test/" + "a" * 2048), "external_refs[1].uri"),
        (ref("ci-run", "https://ci.test/1", ""), "external_refs[1].created_by"),
    ],
)
async def test_a_bad_ref_is_refused_naming_it_and_nothing_is_stored_or_run(agent, store, ollama_sim, bad, field):
    good = ref("ci-run", "https://ci.test/0")
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="small"))).session
    continued = agent.RunStream(pb.RunStreamRequest(session_id=session.id, text="go", external_refs=[good, bad]))
    await expect_status(_drain(continued), grpc.StatusCode.INVALID_ARGUMENT, field)
    marker = f"never-run-{uuid.uuid4().hex}"
    await expect_status(
        agent.Run(pb.RunRequest(text=marker, external_refs=[good, bad])), grpc.StatusCode.INVALID_ARGUMENT, field
    )
    after = await full(store, session.id)
    assert not after.messages and not after.external_refs and after.revision == session.revision
    assert not ollama_sim.bodies()
    found = await store.ListSessions(store_pb.ListSessionsRequest(query=marker))
    assert found.total == 0


async def test_a_turn_with_too_many_refs_is_refused_before_it_begins(agent, store, ollama_sim):
    many = [ref("ci-run", f"https://ci.example.test/runs/{i}") for i in range(5_000)]  # what the probe sent
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="small"))).session
    continued = agent.RunStream(pb.RunStreamRequest(session_id=session.id, text="go", external_refs=many))
    await expect_status(
        _drain(continued),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "external_refs",
        "5,000",
        f"at most {MAX_REFS_PER_REQUEST}",
    )
    marker = f"never-run-{uuid.uuid4().hex}"
    await expect_status(
        agent.Run(pb.RunRequest(text=marker, external_refs=many[: MAX_REFS_PER_REQUEST + 1])),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "external_refs",
    )
    after = await full(store, session.id)
    assert not after.messages and not after.external_refs and after.revision == session.revision
    assert not ollama_sim.bodies()
    assert (await store.ListSessions(store_pb.ListSessionsRequest(query=marker))).total == 0
    events = await turn(agent, "go", session_id=session.id, external_refs=many[:MAX_REFS_PER_REQUEST])
    assert len((await full(store, events[0].session_id)).external_refs) == MAX_REFS_PER_REQUEST


async def test_a_turn_that_would_take_its_session_past_the_ref_cap_stores_nothing(agent, store, ollama_sim):
    session = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id="small"))).session
    for start in range(0, MAX_REFS_PER_SESSION, MAX_REFS_PER_REQUEST):
        await store.UpdateSession(
            store_pb.UpdateSessionRequest(
                session_id=session.id,
                add_external_refs=[
                    ref("ci-run", f"https://ci.example.test/runs/{i}")
                    for i in range(start, start + MAX_REFS_PER_REQUEST)
                ],
            )
        )
    full_up = await full(store, session.id)
    one_more = [ref("ci-run", "https://ci.example.test/new")]
    events = [
        e async for e in agent.RunStream(pb.RunStreamRequest(session_id=session.id, text="go", external_refs=one_more))
    ]
    errors = [e.error for e in events if e.HasField("error")]
    assert [e.code for e in errors] == ["RESOURCE_EXHAUSTED"] and "external_refs" in errors[0].message, errors
    assert [e.stream_end.reason for e in events if e.HasField("stream_end")] == [pb.STREAM_END_REASON_ERROR]
    after = await full(store, session.id)
    assert len(after.external_refs) == MAX_REFS_PER_SESSION and not after.messages
    assert after.revision == full_up.revision and not ollama_sim.bodies()
    # a ref it already holds adds nothing, so that turn runs
    await turn(agent, "go", session_id=session.id, external_refs=[ref("ci-run", "https://ci.example.test/runs/7")])


async def test_a_ref_is_never_opened(agent, store):
    """The ref points at a listener of ours: the turn, and everything after its stream_end that the
    next turn waits for, never connects to it."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        uri = f"http://127.0.0.1:{listener.getsockname()[1]}/runs/1"
        events = await turn(agent, "look at the run", external_refs=[ref("ci-run", uri)])
        await turn(agent, "and again", session_id=events[0].session_id)  # waits for the first's post-turn work
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert refs_of(await full(store, events[0].session_id))[0][1] == uri

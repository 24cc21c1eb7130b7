"""What a share link shows: a session built through the real Agent with the tools that write ids, host
paths and other sessions into it, then read back with GetShared. The response's bytes are searched,
so no field can carry what it must not."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import replace

import grpc
import pytest

from ollama_sim import Reply
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import agent_pb2_grpc, common_pb2, session_store_pb2_grpc
from palimpsest.v1 import session_store_pb2 as store_pb
from tests.conftest import bearer
from tests.helpers.calls import END

# Each test starts from the simulator's deterministic echo.
pytestmark = pytest.mark.usefixtures("fresh_sim")


@pytest.fixture(scope="module")
async def sharing(base_settings, store_server_auth, ollama_sim, tmp_path_factory):
    """The Agent, a Compressor and the store with auth on; the profile offers every tool that writes
    a path, a link or another session into a conversation."""
    from palimpsest.agent.app import start_agent
    from palimpsest.compressor.app import start_compressor

    root = tmp_path_factory.mktemp("share-workspace")
    profiles = tmp_path_factory.mktemp("share-profiles") / "profiles.json"
    profiles.write_text(
        json.dumps(
            {
                "default": "sharer",
                "profiles": [
                    {
                        "id": "sharer",
                        "model": "qwen3.6",
                        "context_window": 8192,
                        "max_iterations": 8,
                        "think_enabled": True,
                        "memory_recall_enabled": False,
                        "tools": {
                            "agent": [
                                "share_file",
                                "content_publish",
                                "session_search",
                                "spawn_agent",
                                "memory_search",
                            ],
                            "subagent": ["memory_search"],
                        },
                    }
                ],
            }
        )
    )
    settings = replace(
        base_settings,
        auth_enabled=True,
        ollama_host=ollama_sim.url,
        store_addr=store_server_auth.address,
        profiles_path=str(profiles),
        share_file_roots=(root, base_settings.data_dir / "workspace"),
    )
    compressor = await start_compressor(settings, port=0)
    agent = await start_agent(replace(settings, compressor_addr=compressor.address), port=0)
    async with (
        grpc.aio.insecure_channel(agent.address) as agent_channel,
        grpc.aio.insecure_channel(store_server_auth.address) as store_channel,
    ):
        stub = agent_pb2_grpc.AgentStub(agent_channel)
        stub.server = agent  # (a turn waits for its post-turn pass: what a share shows is then settled)
        yield (stub, session_store_pb2_grpc.SessionStoreStub(store_channel), root)
    await agent.stop(0)
    await compressor.stop(0)


async def turn(agent, me, text: str, **kw) -> list[pb.AgentEvent]:
    events = [e async for e in agent.RunStream(pb.RunStreamRequest(text=text, **kw), metadata=me)]
    assert events[-1].stream_end.reason == END.STREAM_END_REASON_COMPLETED, events[-1]
    # The turn's post-turn pass (a prune at its end may commit a compression of its own) is done
    # before anything else reads the session: otherwise the share below races it.
    await asyncio.gather(*agent.server.servicer.deps.post_turn_tasks)
    return events


def spellings(session_id: str) -> list[str]:
    return [session_id, uuid.UUID(session_id).hex]


async def test_a_share_shows_no_id_no_owner_no_host_path_and_no_other_session(sharing, ollama_sim, base_settings):
    agent, store, root = sharing
    owner = f"owner-{uuid.uuid4().hex[:8]}"
    me = bearer(owner)
    other = (
        await store.CreateSession(
            store_pb.CreateSessionRequest(profile_id="sharer", name="Divorce papers 4711"), metadata=me
        )
    ).session
    await store.AppendMessages(
        store_pb.AppendMessagesRequest(
            session_id=other.id,
            messages=[
                common_pb2.Message(role="user", content="my lawyer's number is OTHER-SECRET-0042"),
                common_pb2.Message(role="assistant", content="Noted."),
            ],
        ),
        metadata=me,
    )
    report = root / "report.html"
    report.write_text("<!doctype html><title>Q3</title><p>revenue up</p>")

    # Turn 1: a file from the Agent's host goes in, is published, and a path outside the roots is refused.
    ollama_sim.script(
        Reply(tool_calls=[("share_file", {"source": str(report)})]),
        Reply(tool_calls=[("content_publish", {"path": "report.html", "title": "Q3"})]),
        Reply(tool_calls=[("share_file", {"source": "/etc/shadow"})]),
        Reply(thinking=f"I copied {report} for the user.", text=f"Here it is (from {report})."),
    )
    events = await turn(agent, me, "make me the Q3 report")
    session_id = events[0].session_id
    await store.UpdateSession(store_pb.UpdateSessionRequest(session_id=session_id, name=f"Q3 from {root}"), metadata=me)

    # Turn 2: the model reads the owner's other sessions, directly and through a sub-agent.
    ollama_sim.script(
        Reply(tool_calls=[("session_search", {"action": "list"})]),
        Reply(tool_calls=[("session_search", {"action": "get", "session_id": other.id})]),
        Reply(tool_calls=[("spawn_agent", {"task": f"what does session {other.id} hold?"})]),
        Reply(text="Session 'Divorce papers 4711' holds OTHER-SECRET-0042."),  # the sub-agent's report
        Reply(
            thinking=f"{other.id} was read; this one is {session_id}.", text=f"I looked at {other.id.upper()} for you."
        ),
    )
    await turn(
        agent, me, f"is {session_id} like my other one? my notes are in /home/{owner}/notes.txt", session_id=session_id
    )

    # A compaction, then the model searches what it took out of the context: the session_search result
    # is among the passages, and the summary may speak of it.
    ollama_sim.script(Reply(text="The user compared this with 'Divorce papers 4711' (OTHER-SECRET-0042)."))
    compacted = [e async for e in agent.Compact(pb.CompactRequest(session_id=session_id), metadata=me)]
    assert any(e.HasField("context_compressed") for e in compacted), compacted
    ollama_sim.script(
        Reply(tool_calls=[("memory_search", {"query": "lawyer's number OTHER-SECRET-0042"})]), Reply(text="Found it.")
    )
    await turn(agent, me, "what was that number again?", session_id=session_id)

    forbidden = [
        *spellings(session_id),
        *spellings(other.id),
        "Divorce papers 4711",
        "OTHER-SECRET-0042",
        owner,
        str(root),
        str(base_settings.data_dir),
        str(base_settings.files_root),
    ]
    owners = (
        await store.GetSession(
            store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_FULL), metadata=me
        )
    ).session
    assert [m for m in owners.messages if m.is_compression and "OTHER-SECRET-0042" in m.content]  # the summary
    owners_view = owners.SerializeToString().lower()
    # The owner's own history holds every one of them (ids dashed): the test below has something to find.
    assert [s for s in forbidden[:-2] if s.lower().encode() not in owners_view] == [
        uuid.UUID(session_id).hex,
        uuid.UUID(other.id).hex,
    ]

    token = (await store.CreateShare(store_pb.CreateShareRequest(session_id=session_id), metadata=me)).token
    shared = await store.GetShared(store_pb.GetSharedRequest(token=token, limit=500))
    seen = shared.SerializeToString().lower()
    assert [s for s in forbidden if s.lower().encode() in seen] == []

    # What it still shows: the conversation, the files by name, and where something was left out.
    assert not shared.has_more and shared.name.startswith("Q3 from ")
    results = {}
    for m in shared.messages:
        if m.role == "tool":
            results.setdefault(m.name, m)
    assert list(results["share_file"].files) == ["report.html"]
    assert results["share_file"].metadata["link"] == "palimpsest://sessions/[this session]/files/report.html"
    assert results["share_file"].content.startswith("Shared …/report.html as report.html")
    for left_out in ("session_search", "spawn_agent", "memory_search"):
        assert "left out of this share" in results[left_out].content and not results[left_out].metadata
    # The compaction's marker and the prune at the last turn's end: each one line, nothing of the summary.
    markers = [m for m in shared.messages if m.is_compression]
    assert [m.metadata["reason"] for m in markers] == ["forced", "turnend"]
    assert all(m.content.startswith("Context compressed: ") and "\n" not in m.content for m in markers)
    [answer] = [m for m in shared.messages if m.content.startswith("I looked at")]
    assert answer.content == "I looked at [id] for you."
    assert answer.thinking == "[id] was read; this one is [this session]."


# -- the rules, one by one ---------------------------------------------------------------------------
THIS = "0b7e5c1e-8f6a-4d2b-9c3e-1a2b3c4d5e6f"


@pytest.mark.parametrize(
    "text, shown",
    [
        (f"session {THIS} and {THIS.upper()}", "session [this session] and [this session]"),
        (
            f"undashed {uuid.UUID(THIS).hex}, another 9f1c2d3e-0000-4000-8000-00000000abcd",
            "undashed [this session], another [id]",
        ),
        ("a SHA-256 " + "ab" * 32 + " stays", "a SHA-256 " + "ab" * 32 + " stays"),
        ("Shared /home/alice/out/report.pdf as report.pdf", "Shared …/report.pdf as report.pdf"),
        ("in /home/alice and file:///srv/data/x.csv", "in … and file://…/x.csv"),
        ("roots: /var/lib/palimpsest/workspace, /srv/a/b.tar.gz", "roots: …, …/b.tar.gz"),
        ('{"source":"/Users/bob/Desktop/q.png"}', '{"source":"…/q.png"}'),
        (f"palimpsest://sessions/{THIS}/files/a%20b.pdf", "palimpsest://sessions/[this session]/files/a%20b.pdf"),
        (
            "https://example.com/a/b, http://[::1]/x/y, src/app/main.py, /tmp, 1/2/3, and/or",
            "https://example.com/a/b, http://[::1]/x/y, src/app/main.py, /tmp, 1/2/3, and/or",
        ),
    ],
)
def test_ids_are_masked_and_paths_keep_only_a_file_name(text, shown):
    from palimpsest.store.shared_view import scrubbed

    assert scrubbed(text, THIS) == shown


def test_metadata_is_scrubbed_to_its_keys_and_nested_lists():
    from palimpsest.store.shared_view import shared_message

    message = common_pb2.Message(role="tool", name="custom", files=[f"/srv/files/{THIS}/image_1.png"])
    message.metadata.update({THIS: {"paths": ["/home/alice/x.txt", 3]}, "ok": True})
    shown = shared_message(message, THIS)
    assert list(shown.files) == ["image_1.png"]
    assert list(shown.metadata["[this session]"]["paths"]) == ["…/x.txt", 3] and shown.metadata["ok"] is True


def test_a_compression_marker_keeps_its_headline_not_the_summary():
    from palimpsest.store.shared_view import shared_message

    marker = common_pb2.Message(
        role="system",
        is_compression=True,
        content="Context compressed: 40 → 12 messages\nThe user read 'Divorce papers'…",
    )
    marker.metadata.update({"messages_before": 40})
    assert shared_message(marker, THIS).content == "Context compressed: 40 → 12 messages"


def test_the_tools_left_out_of_shares_are_tools_the_agent_has():
    from palimpsest.agent.tools.registry import BUILTIN
    from palimpsest.store.shared_view import LEFT_OUT_TOOLS

    assert LEFT_OUT_TOOLS <= set(BUILTIN)

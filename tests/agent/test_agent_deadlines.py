"""Every call between the services has a deadline: a SessionStore that stops answering (its
connections open, nothing coming back) fails a call after PALIMPSEST_RPC_TIMEOUT_SECONDS instead of
holding it, and the same channel works again once the store answers."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import grpc
import pytest

from palimpsest.shared.channels import DefaultDeadline, open_channel
from palimpsest.shared.errors import Unavailable
from palimpsest.v1 import agent_pb2, agent_pb2_grpc, session_store_pb2_grpc
from palimpsest.v1 import session_store_pb2 as pb
from tests.helpers.relay import Relay
from tests.helpers.waiting import until


async def test_a_long_call_gets_the_long_deadline(base_settings):
    seen = []

    async def continuation(details, request):
        seen.append((details.method, details.timeout))

    deadline = DefaultDeadline(7, 900)
    for method, timeout in (
        ("/palimpsest.v1.SessionStore/GetSession", None),
        ("/palimpsest.v1.Compressor/Compress", None),
        ("/palimpsest.v1.SessionStore/GetSession", 3.0),
    ):
        await deadline.intercept_unary_unary(
            continuation, grpc.aio.ClientCallDetails(method, timeout, None, None, None), None
        )
    assert [t for _, t in seen] == [7, 900, 3.0]  # a caller's own deadline wins


async def test_a_server_stream_gets_the_default_deadline_and_fails_naming_the_service(
    agent_server, store, profile, base_settings
):
    """Interceptors are filed per kind of call: one class serving every kind was filed under unary
    calls only, so server streams (Compress, GetFile) ran without a deadline and raised raw
    AioRpcErrors. A WatchSession never ends by itself: the default deadline must end it."""
    session = (await store.CreateSession(pb.CreateSessionRequest(profile_id=profile))).session
    settings = replace(base_settings, rpc_timeout_s=0.5)
    async with open_channel(agent_server.address, settings, service="Agent") as channel:
        watch = agent_pb2_grpc.AgentStub(channel).WatchSession(agent_pb2.WatchSessionRequest(session_id=session.id))
        with pytest.raises(Unavailable, match=f"^Agent at {agent_server.address} is not answering"):
            async with asyncio.timeout(30):  # only if the deadline is missing
                async for _ in watch:
                    pass


async def test_a_hung_store_fails_the_call_at_its_deadline_and_recovers(base_settings, store_server, profile):
    host, port = store_server.address.rsplit(":", 1)
    relay = Relay((host, int(port)))
    await relay.start()
    channel = open_channel(f"127.0.0.1:{relay.port}", replace(base_settings, rpc_timeout_s=2.0))
    try:
        store = session_store_pb2_grpc.SessionStoreStub(channel)
        await store.CreateSession(pb.CreateSessionRequest(profile_id=profile))
        relay.freeze()
        started = asyncio.get_running_loop().time()
        try:
            await asyncio.wait_for(store.ListSessions(pb.ListSessionsRequest(profile_id=profile)), timeout=20)
            raise AssertionError("a call through a frozen connection answered")
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        elapsed = asyncio.get_running_loop().time() - started
        assert 1.5 < elapsed < 10  # the deadline, not the test's own timeout
        relay.thaw()
        listed = await store.ListSessions(pb.ListSessionsRequest(profile_id=profile))
        assert listed.total == 1
    finally:
        relay.thaw()
        await channel.close()


async def test_a_turn_on_a_hung_store_ends_its_stream_and_the_next_turn_works(
    base_settings, store_server, compressor_server, compressor, ollama_sim, profiles_file
):
    from ollama_sim import Reply
    from palimpsest.agent.app import start_agent
    from palimpsest.v1 import agent_pb2 as apb
    from palimpsest.v1 import agent_pb2_grpc, common_pb2
    from palimpsest.v1 import compressor_pb2 as cpb
    from tests.conftest import agent_settings

    # The Compressor's first size check for a model builds its tokenizer, seconds on a loaded
    # machine: done here, so the 2 s deadline below is the store's and not the cold start's.
    await compressor.CheckContextSize(
        cpb.CheckContextSizeRequest(
            model="qwen3.6", window=8192, messages=[common_pb2.Message(role="user", content="warm")]
        )
    )

    async def turn(agent, session_id: str, text: str) -> list:
        return [e async for e in agent.RunStream(apb.RunStreamRequest(session_id=session_id, text=text))]

    host, port = store_server.address.rsplit(":", 1)
    relay = Relay((host, int(port)))
    await relay.start()
    settings = replace(
        agent_settings(base_settings, store_server, compressor_server, ollama_sim, profiles_file),
        store_addr=f"127.0.0.1:{relay.port}",
        rpc_timeout_s=2.0,
    )
    running = await start_agent(settings, port=0)
    try:
        async with grpc.aio.insecure_channel(running.address) as channel:
            agent = agent_pb2_grpc.AgentStub(channel)
            ollama_sim.script(Reply(text="first answer"))
            first = await turn(agent, "", "hello")
            assert first[-1].stream_end.reason == apb.STREAM_END_REASON_COMPLETED
            relay.freeze()
            # The turn ends at the deadline: a stream_end ERROR once it runs, or, while the Agent is
            # still loading the session, the call's own UNAVAILABLE naming the store.
            try:
                # (20 s: the 2 s deadline of each write, and the turn's end not waiting on the store)
                hung = await asyncio.wait_for(turn(agent, first[0].session_id, "are you there?"), timeout=20)
                ends = [e.stream_end for e in hung if e.HasField("stream_end")]
                assert ends and ends[0].reason == apb.STREAM_END_REASON_ERROR
                # The model may have started on the prompt, but its answer to a message the store
                # never acknowledged is not shown.
                assert not any(e.HasField("text_delta") for e in hung)
                assert any("SessionStore" in e.error.message for e in hung if e.HasField("error"))
            except grpc.aio.AioRpcError as error:
                assert error.code() == grpc.StatusCode.UNAVAILABLE and "SessionStore" in error.details()
            relay.thaw()
            ollama_sim.script(Reply(text="back again"))
            again = await asyncio.wait_for(turn(agent, first[0].session_id, "and now?"), timeout=60)
            assert again[-1].stream_end.reason == apb.STREAM_END_REASON_COMPLETED, [
                e.error for e in again if e.HasField("error")
            ]
    finally:
        relay.thaw()
        await running.stop(0)


async def test_the_model_starts_while_the_message_is_stored_and_shows_nothing_before(
    base_settings, store_server, compressor_server, ollama_sim, profiles_file
):
    """The first model call of a turn overlaps the append of the user's message (the fewest waits
    before the first token), but the client sees no answer before that message is stored."""
    from ollama_sim import Reply
    from palimpsest.agent.app import start_agent
    from palimpsest.v1 import agent_pb2 as apb
    from palimpsest.v1 import agent_pb2_grpc
    from palimpsest.v1 import session_store_pb2_grpc as spb_grpc
    from tests.conftest import agent_settings

    host, port = store_server.address.rsplit(":", 1)
    relay = Relay((host, int(port)))
    await relay.start()
    settings = replace(
        agent_settings(base_settings, store_server, compressor_server, ollama_sim, profiles_file),
        store_addr=f"127.0.0.1:{relay.port}",
    )
    running = await start_agent(settings, port=0)
    try:
        async with (
            grpc.aio.insecure_channel(running.address) as channel,
            grpc.aio.insecure_channel(store_server.address) as store_channel,
        ):
            agent = agent_pb2_grpc.AgentStub(channel)
            store = spb_grpc.SessionStoreStub(store_channel)
            ollama_sim.script(Reply(text="first answer"))
            first = [e async for e in agent.RunStream(apb.RunStreamRequest(text="hello"))]
            session_id = first[0].session_id
            await asyncio.gather(*running.servicer.deps.post_turn_tasks)  # its writes go through the relay too
            calls = len(ollama_sim.bodies())
            ollama_sim.script(Reply(text="second answer"))
            relay.freeze()  # the Agent's append of the next message hangs; the Compressor's reads do not
            events: asyncio.Queue = asyncio.Queue()

            async def second() -> None:
                async for event in agent.RunStream(apb.RunStreamRequest(session_id=session_id, text="again")):
                    events.put_nowait(event)

            task = asyncio.create_task(second())
            try:
                assert await until(lambda: len(ollama_sim.bodies()) > calls, 30)  # the model has the prompt
                assert any(m["content"] == "again" for m in ollama_sim.bodies()[-1]["messages"])
                seen = [events.get_nowait() for _ in range(events.qsize())]
                assert not any(e.HasField("text_delta") for e in seen), "an answer shown before its message was stored"
                relay.thaw()
                await asyncio.wait_for(task, timeout=60)
            finally:
                relay.thaw()
                task.cancel()
            seen += [events.get_nowait() for _ in range(events.qsize())]
            assert seen[-1].stream_end.reason == apb.STREAM_END_REASON_COMPLETED
            assert "".join(e.text_delta.text for e in seen if e.HasField("text_delta")) == "second answer"
            history = (await store.GetHistoryPage(pb.GetHistoryPageRequest(session_id=session_id, limit=10))).messages
            assert [m.content for m in history][-2:] == ["again", "second answer"]
    finally:
        relay.thaw()
        await running.stop(0)


async def test_a_turn_goes_on_without_the_compressor_and_says_so_once(
    base_settings, store_server, compressor_server, ollama_sim, profiles_file
):
    import socket

    from ollama_sim import Reply
    from palimpsest.agent.app import start_agent
    from palimpsest.v1 import agent_pb2 as apb
    from palimpsest.v1 import agent_pb2_grpc
    from tests.conftest import agent_settings

    with socket.socket() as probe:  # a port nothing listens on: the Compressor is away
        probe.bind(("127.0.0.1", 0))
        away = f"127.0.0.1:{probe.getsockname()[1]}"
    settings = replace(
        agent_settings(base_settings, store_server, compressor_server, ollama_sim, profiles_file), compressor_addr=away
    )
    running = await start_agent(settings, port=0)
    try:
        async with grpc.aio.insecure_channel(running.address) as channel:
            agent = agent_pb2_grpc.AgentStub(channel)
            ollama_sim.script(
                Reply(tool_calls=[("todo", {"action": "add", "item": "check the logs"})]),
                Reply(text="done without compression"),
            )
            events = [e async for e in agent.RunStream(apb.RunStreamRequest(text="plan something"))]
    finally:
        await running.stop(0)
    assert events[-1].stream_end.reason == apb.STREAM_END_REASON_COMPLETED
    assert events[-1].stream_end.text == "done without compression"
    errors = [e.error for e in events if e.HasField("error")]
    assert len(errors) == 1 and errors[0].code == "UNAVAILABLE" and "Compressor" in errors[0].message
    assert all(e.usage.count_method in ("heuristic", "reported") for e in events if e.HasField("usage"))


async def test_the_compressor_coming_back_is_used_again_within_seconds(
    base_settings, store_server, ollama_sim, profiles_file, tmp_path
):
    import socket

    from palimpsest.agent.app import start_agent
    from palimpsest.compressor.app import start_compressor
    from palimpsest.v1 import agent_pb2 as apb
    from palimpsest.v1 import agent_pb2_grpc

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = replace(
        base_settings,
        ollama_host=ollama_sim.url,
        store_addr=store_server.address,
        compressor_addr=f"127.0.0.1:{port}",
        profiles_path=profiles_file,
    )
    agent = await start_agent(settings, port=0)
    compressor = None
    try:
        async with grpc.aio.insecure_channel(agent.address) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)

            async def turn_used_the_compressor() -> bool:
                events = [e async for e in stub.RunStream(apb.RunStreamRequest(text="hello"))]
                assert events[-1].stream_end.reason == apb.STREAM_END_REASON_COMPLETED
                return not any(e.HasField("error") for e in events)

            for _ in range(3):  # away for a while: the channel's backoff grows
                assert not await turn_used_the_compressor()
            compressor = await start_compressor(settings, port=port)
            loop = asyncio.get_running_loop()
            back, deadline = False, loop.time() + 10
            while not back and loop.time() < deadline:
                back = await turn_used_the_compressor()
            assert back, "turns still ran without the Compressor 10 s after it returned"
    finally:
        await agent.stop(0)
        if compressor is not None:
            await compressor.stop(0)


async def test_compact_names_the_part_that_is_down(
    base_settings, store, store_server, ollama_sim, profiles_file, profile
):
    """Compact once said "SessionStore at the Compressor is not answering" when the Compressor was away, and a
    Compressor whose own store was away read as "Compressor … is not answering" though it had answered."""
    from palimpsest.agent.app import start_agent
    from palimpsest.compressor.app import start_compressor
    from palimpsest.shared.ports import free_port
    from palimpsest.v1 import agent_pb2 as apb
    from palimpsest.v1 import agent_pb2_grpc

    session = (await store.CreateSession(pb.CreateSessionRequest(profile_id=profile))).session
    away = f"127.0.0.1:{free_port()}"
    settings = replace(
        base_settings, ollama_host=ollama_sim.url, store_addr=store_server.address, profiles_path=profiles_file
    )
    cut_off = await start_compressor(replace(settings, store_addr=away), port=0)  # answers; its store does not

    async def compact_fails_with(compressor_addr: str) -> str:
        agent = await start_agent(replace(settings, compressor_addr=compressor_addr), port=0)
        try:
            async with grpc.aio.insecure_channel(agent.address) as channel:
                call = agent_pb2_grpc.AgentStub(channel).Compact(apb.CompactRequest(session_id=session.id))
                try:
                    events = [e async for e in call]
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAVAILABLE
                    return exc.details()
                raise AssertionError(f"Compact did not fail: {events}")
        finally:
            await agent.stop(0)

    try:
        assert (await compact_fails_with(away)).startswith(f"Compressor at {away} is not answering: ")
        relayed = await compact_fails_with(cut_off.address)
    finally:
        await cut_off.stop(0)
    assert relayed.startswith(f"SessionStore at {away} is not answering: ")
    assert relayed.endswith(f"(said the Compressor at {cut_off.address})") and relayed.count("not answering") == 1

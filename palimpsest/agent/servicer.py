"""The Agent gRPC servicer. A turn runs as its own task and its RunStream reads the turn's kept
events (turn_logs), so a client that reads slowly or goes away costs the turn nothing, and Stop
ends it cooperatively: partial text saved, every tool call answered, the session loadable."""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import AsyncIterator
from contextlib import suppress
from typing import Any

import grpc

from palimpsest.agent import sandbox
from palimpsest.agent.client_tools import MAX_ANSWER_BYTES
from palimpsest.agent.conversation import conflict
from palimpsest.agent.ephemeral import run_ephemeral
from palimpsest.agent.events import EventSink
from palimpsest.agent.pending_calls import Answer
from palimpsest.agent.replica_bus import ReplicaBus
from palimpsest.agent.runtime import SessionRuntime, TurnClaims
from palimpsest.agent.turn import Turn
from palimpsest.agent.turn_context import AgentDeps, TurnInput
from palimpsest.agent.turn_logs import TurnLogs
from palimpsest.agent.turn_opening import TurnRequest, open_turn, validate_turn
from palimpsest.agent.warm_cache import WarmCache
from palimpsest.agent.watchers import SessionWatchers
from palimpsest.shared.auth import SERVICE_ROLE, caller, forwarded_metadata
from palimpsest.shared.errors import (
    Aborted,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PalimpsestError,
    ResourceExhausted,
    Unavailable,
)
from palimpsest.shared.session_reads import whole_context
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import agent_pb2_grpc
from palimpsest.v1 import compressor_pb2 as cpb
from palimpsest.v1 import session_store_pb2 as store_pb

log = logging.getLogger("palimpsest.agent")

# The event streams hand over events already serialized (kept so, sent to many readers), which the
# server's serializer sends as they are (shared/server.py, _sending_bytes_as_they_are): the generated
# servicer's signature knows only messages, hence the override ignores below.
EncodedEvents = AsyncIterator[pb.AgentEvent | bytes]

# On SIGTERM, what is kept of the grace period for stopped turns to save their partial text and
# end their streams (one store write each) before gRPC cancels what is left.
STOP_MARGIN_S = 1.0
WARM_SESSIONS = 1000  # sessions whose last state is kept for their next turn
# How long a WatchSession waits for the session bus to listen (reconnecting) before it starts anyway
# with this replica's turns only.
WATCH_BUS_WAIT_S = 5.0
# How long a resume waits for another replica's turn to reach this one over the session bus.
RESUME_CATCH_UP_S = 2.0


class AgentServicer(agent_pb2_grpc.AgentServicer):
    def __init__(self, deps: AgentDeps) -> None:
        self.deps = deps
        self.sessions: SessionRuntime[Turn] = SessionRuntime(
            WarmCache(WARM_SESSIONS, deps.settings.agent_warm_mb * 1024 * 1024)
        )
        self.replica = uuid.uuid4().hex[:12]  # this process, as other replicas know it
        # Across replicas (when on): the store says whose turn it is.
        self.claims = (
            TurnClaims(deps.store, deps.settings.turn_claim_ttl_s, self.replica) if deps.settings.turn_claims else None
        )
        # WatchSession's clients by session, and every stream that follows a session, counted.
        self._watchers = SessionWatchers(deps.settings.watchers_per_user, deps.settings.watchers_per_session)
        # Each turn's events, for the client that lost its stream (ResumeStream).
        self.turn_logs = TurnLogs(deps.settings.stream_keep_s, deps.settings.stream_keep_bytes)
        # Across replicas (when on): Stop and the watchers' events travel through the store.
        self.bus = (
            ReplicaBus(
                deps.store,
                self.replica,
                deliver=self._heard,
                stop_here=self.sessions.stop,
                answer_here=deps.client_calls.answer,
                running=self._running_turns,
                alive=self.turn_logs.heard_alive,
                hearing=self.turn_logs.set_hearing,
            )
            if deps.settings.replica_events
            else None
        )

    def _publish(self, event: pb.AgentEvent) -> None:
        """A turn's event to its log and the session's watchers (serialized once for all of them):
        here, and (bus on) on every other replica."""
        payload = event.SerializeToString()
        self.turn_logs.record(event, local=True, payload=payload)
        self._watchers.publish(event.session_id, payload)
        if self.bus is not None:
            self.bus.publish(event)

    def _running_turns(self) -> list[tuple[str, str]]:
        """(session id, turn id) of each turn this replica runs."""
        return [(session_id, turn.sink.turn_id) for session_id, turn in self.sessions.running()]

    def _heard(self, event: pb.AgentEvent) -> None:
        """Another replica's turn's event: to its log and this replica's watchers."""
        payload = event.SerializeToString()
        self.turn_logs.record(event, local=False, payload=payload)
        self._watchers.publish(event.session_id, payload)

    async def _keep_warm(self, turn: Turn) -> None:
        """After the turn and its post-turn pass, off the client's path: the session as it is now,
        as the turn left it unless the post-turn pass compressed it (then read back)."""
        if turn.result.reason == pb.STREAM_END_REASON_ERROR:
            return  # a turn that failed (a store or model away) leaves nothing to trust: read afresh next time
        session = None if turn.compressed_after else turn.conv.snapshot()
        if session is None:
            try:
                session = await whole_context(self.deps.store.GetSession, turn.session_id)
            except PalimpsestError:
                return
        self.sessions.keep_warm(turn.session_id, turn.metadata, session)

    async def _reload_profiles(self) -> None:
        """An edited profiles file applies from the next turn; cached system prompts go with it.
        Read (with its prompt files) in a thread: the loop serves every other session meanwhile."""
        if not self.deps.profiles.changed():
            return
        fresh = await asyncio.to_thread(self.deps.profiles.reloaded)
        if fresh is not None:
            self.deps.profiles = fresh
            if fresh.error:  # the last good profiles stay in use; `pal profiles` shows the error too
                log.error("PALIMPSEST_PROFILES: %s; keeping the profiles last read", fresh.error)
                return
            self.deps.builder.invalidate()
            if self.deps.mcp is not None:  # servers added start connecting, servers removed stop
                await self.deps.mcp.sync(fresh)
            log.info("profiles reloaded from %s", fresh.path)

    async def _open_turn(
        self, request: TurnRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> tuple[Turn, TurnInput]:
        """Everything that can fail with a plain status before the stream begins: the turn, and
        what it answers."""
        validate_turn(request)
        metadata = forwarded_metadata(context)
        await self._reload_profiles()
        return await open_turn(self.deps, self.sessions, self._publish, request, metadata)

    async def _drive(self, turn: Turn, turn_input: TurnInput, stop_on_disconnect: bool) -> AsyncIterator[bytes]:
        """Run the turn under the session lock; yields its events (serialized, as its log keeps
        them) until stream_end. A caller that goes away once it has the first event (the session
        and turn to resume by) leaves the turn running, unless it asked otherwise."""
        holder, elsewhere = await self._hold(turn.session_id)
        self.sessions.started(turn.session_id, turn)
        kept = self.turn_logs.begin(turn.session_id, turn.sink.turn_id)
        turn.sink.announce(turn_started=pb.TurnStarted(text=turn_input.text[:200]))

        async def work() -> None:
            try:
                if elsewhere or self.sessions.generation(turn.session_id) != turn.ctx.opened_generation:
                    turn.conv.forget()  # another turn ran while we waited: start from the store
                try:
                    await turn.run(turn_input)
                finally:
                    self.sessions.ended(turn.session_id)
                await self.sessions.post_turn(turn.session_id, turn.post_turn())
                await self._keep_warm(turn)
            finally:
                self.turn_logs.ended(turn.sink.turn_id)
                await self._let_go(turn.session_id, holder)

        task = asyncio.create_task(work())
        self.deps.post_turn_tasks.add(task)
        task.add_done_callback(self.deps.post_turn_tasks.discard)
        finished = sent = False
        try:
            # The turn's own stream reads its kept log: a client slower than the turn holds nothing
            # of its own, and one past what is kept is told so (the turn goes on).
            async for payload in self.turn_logs.follow(kept, 0):
                yield payload
                sent = True
            finished = True
        finally:
            if not finished and (stop_on_disconnect or not sent):
                turn.stop.set()  # end the turn cooperatively: partial text saved

    async def _hold(self, session_id: str) -> tuple[str, bool]:
        """The session to one turn: in this process, then (with claims on) across replicas. (The
        claim's holder, whether another replica's turn ran first.)"""
        await self.sessions.acquire(session_id)
        try:
            return await self.claims.claim(session_id, uuid.uuid4().hex[:8]) if self.claims else ("", False)
        except BaseException:  # the client left, or the store failed, while waiting
            self.sessions.release(session_id)
            raise

    async def _let_go(self, session_id: str, holder: str) -> None:
        try:
            if holder and self.claims is not None:
                await self.claims.release(session_id, holder)
        finally:
            self.sessions.release(session_id)

    async def RunStream(  # type: ignore[override]
        self,
        request: pb.RunStreamRequest,
        context: grpc.aio.ServicerContext[pb.RunStreamRequest, pb.AgentEvent | bytes],
    ) -> EncodedEvents:
        turn, turn_input = await self._open_turn(request, context)
        async for event in self._drive(turn, turn_input, request.stop_on_disconnect):
            yield event

    async def Run(
        self, request: pb.RunRequest, context: grpc.aio.ServicerContext[pb.RunRequest, pb.RunResponse]
    ) -> pb.RunResponse:
        turn, turn_input = await self._open_turn(request, context)
        text, reason = "", pb.STREAM_END_REASON_UNSPECIFIED
        async for payload in self._drive(turn, turn_input, request.stop_on_disconnect):
            event = pb.AgentEvent.FromString(payload)
            if event.HasField("stream_end") and not event.is_subagent:
                text, reason = event.stream_end.text, event.stream_end.reason
            elif event.HasField("error") and not event.is_subagent and event.error.code == "UNAVAILABLE":
                raise Unavailable(event.error.message)
        return pb.RunResponse(session_id=turn.session_id, text=text, reason=reason)

    async def RunEphemeral(
        self,
        request: pb.RunEphemeralRequest,
        context: grpc.aio.ServicerContext[pb.RunEphemeralRequest, pb.RunEphemeralResponse],
    ) -> pb.RunEphemeralResponse:
        if not request.text.strip():
            raise InvalidArgument("text", "required")
        if request.max_iterations < 0:
            raise InvalidArgument("max_iterations", "must not be negative")
        if not (math.isfinite(request.timeout_seconds) and request.timeout_seconds >= 0):
            raise InvalidArgument("timeout_seconds", "must be a finite number of seconds, not negative")
        return await run_ephemeral(self.deps, request, forwarded_metadata(context))

    async def Compact(
        self, request: pb.CompactRequest, context: grpc.aio.ServicerContext[pb.CompactRequest, pb.AgentEvent]
    ) -> AsyncIterator[pb.AgentEvent]:
        if not request.session_id:
            raise InvalidArgument("session_id", "required")
        session = (await self.deps.store.GetSession(store_pb.GetSessionRequest(session_id=request.session_id))).session
        profile = self.deps.profiles.resumed(session.profile_id, session.provider, session.model)
        window = profile.window(self.deps.settings.ollama_num_ctx)
        with suppress(PalimpsestError):  # Ollama away: the profile's window (the summary call will say)
            window = (await self.deps.ollama.model_facts(profile.model)).usable_window(window)
        sink = EventSink(session.id, publish=self._publish)  # no turn_id: a compaction ends with its call
        holder, _ = await self._hold(session.id)
        # Once held: the turn before may still be ending (its post-turn pass dropped by the hold), and
        # keeps its copy warm as it lets go; the compaction makes that copy stale.
        self.sessions.forget_warm(session.id)
        try:
            try:
                async for event in self.deps.compressor.Compress(
                    cpb.CompressRequest(
                        session_id=session.id,
                        reason=cpb.COMPRESSION_REASON_FORCED,
                        model=profile.model,
                        window=window,
                        settings=profile.compression_settings(),
                    )
                ):
                    emitted = sink.compression(event)
                    if emitted is not None:
                        yield emitted
            except FailedPrecondition as exc:
                raise FailedPrecondition(f"nothing to compact: {exc}") from None
            except Aborted as exc:  # the Compressor's commit lost to a turn's write
                raise conflict(exc) from None
        finally:
            await self._let_go(session.id, holder)
        yield sink.stream_end(pb.STREAM_END_REASON_COMPLETED, "")

    async def Stop(
        self, request: pb.StopRequest, context: grpc.aio.ServicerContext[pb.StopRequest, pb.StopResponse]
    ) -> pb.StopResponse:
        if not request.session_id:
            raise InvalidArgument("session_id", "required")
        # Only the session's owner (or an admin) may stop it, or learn whether a turn runs in it:
        # reading the session checks exactly that, before anything is said.
        if self.deps.settings.auth_enabled:
            await self.deps.store.GetSession(
                store_pb.GetSessionRequest(session_id=request.session_id, view=store_pb.SESSION_VIEW_SUMMARY)
            )
        stopped = self.sessions.stop(request.session_id)
        if not stopped and self.bus is not None:  # the turn may run on another replica
            stopped = await self.bus.stop_elsewhere(request.session_id)
        return pb.StopResponse(stopped=stopped)

    async def WatchSession(  # type: ignore[override]
        self,
        request: pb.WatchSessionRequest,
        context: grpc.aio.ServicerContext[pb.WatchSessionRequest, pb.AgentEvent | bytes],
    ) -> EncodedEvents:
        who = caller()  # (verified by the server's interceptor)
        if not request.session_id:
            raise InvalidArgument("session_id", "required")
        # Counted first (a refusal costs nothing more), and in place before the watch is confirmed.
        with self._watchers.watching(request.session_id, who.sub) as watch:
            # Who may read the session may watch it: the store answers for the caller.
            await self.deps.store.GetSession(
                store_pb.GetSessionRequest(session_id=request.session_id, view=store_pb.SESSION_VIEW_SUMMARY)
            )
            if self.bus is not None:  # other replicas' turns reach this one only while the bus listens
                with suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.bus.listening.wait(), WATCH_BUS_WAIT_S)
            await context.send_initial_metadata(())  # the watch is in place: nothing from now on is missed
            while True:
                yield await watch.next()

    async def ResumeStream(  # type: ignore[override]
        self,
        request: pb.ResumeStreamRequest,
        context: grpc.aio.ServicerContext[pb.ResumeStreamRequest, pb.AgentEvent | bytes],
    ) -> EncodedEvents:
        who = caller()  # (verified by the server's interceptor)
        if not request.session_id:
            raise InvalidArgument("session_id", "required")
        if request.after_seq < 0:
            raise InvalidArgument("after_seq", "must not be negative")
        with self._watchers.following(request.session_id, who.sub):
            # Who may read the session may resume its turns: the store answers for the caller.
            await self.deps.store.GetSession(
                store_pb.GetSessionRequest(session_id=request.session_id, view=store_pb.SESSION_VIEW_SUMMARY)
            )
            # Checked before the stream begins, so a refusal is the call's status; a turn of another
            # replica gets a moment to arrive, should the client have seen more of it there.
            log = await self.turn_logs.open(
                request.session_id,
                request.turn_id,
                request.after_seq,
                catch_up_s=RESUME_CATCH_UP_S if self.bus is not None else 0.0,
            )
            async for payload in self.turn_logs.follow(log, request.after_seq):
                yield payload

    async def ListProfiles(
        self,
        request: pb.ListProfilesRequest,
        context: grpc.aio.ServicerContext[pb.ListProfilesRequest, pb.ListProfilesResponse],
    ) -> pb.ListProfilesResponse:
        await self._reload_profiles()  # what the next turn would use, and why an edit was not taken
        default_window = self.deps.settings.ollama_num_ctx
        profiles = []
        for profile in self.deps.profiles.profiles.values():
            listed = profile.to_proto(default_window)
            if self.deps.mcp is not None:
                listed.mcp_servers.extend(self.deps.mcp.statuses(profile))
            profiles.append(listed)
        return pb.ListProfilesResponse(
            profiles=profiles,
            default_profile_id=self.deps.profiles.default_id,
            profiles_error=self.deps.profiles.error,
            ollama_host=self.deps.ollama.host,
            sandbox_unavailable=(await sandbox.probe()).reason,
        )

    async def SubmitToolResult(
        self,
        request: pb.SubmitToolResultRequest,
        context: grpc.aio.ServicerContext[pb.SubmitToolResultRequest, pb.SubmitToolResultResponse],
    ) -> pb.SubmitToolResultResponse:
        for name in ("session_id", "turn_id", "call_id"):
            if not getattr(request, name):
                raise InvalidArgument(name, "required: as the tool_call_requested event named it")
        if len(request.content.encode()) > MAX_ANSWER_BYTES:
            raise ResourceExhausted(
                f"content: at most {MAX_ANSWER_BYTES} bytes (a larger result belongs in a "
                "session file the model can read)"
            )
        me = caller()
        # Who may read the session may answer its client's tools: the turn running here knows its
        # session's owner; for any other, the store answers for the caller (one round trip more).
        turn = self.sessions.running_turn(request.session_id)
        here = turn.conv.session if turn is not None and turn.sink.turn_id == request.turn_id else None
        if here is None or not me.can_access(here.owner or None):
            await self.deps.store.GetSession(
                store_pb.GetSessionRequest(session_id=request.session_id, view=store_pb.SESSION_VIEW_SUMMARY)
            )
        answer = Answer(
            request.content, request.is_error, trusted=self.deps.settings.auth_enabled and me.role == SERVICE_ROLE
        )
        key = (request.session_id, request.turn_id, request.call_id)
        outcome = self.deps.client_calls.answer(key, answer)
        if outcome == "unknown" and self.bus is not None:  # the turn may run on another replica
            outcome = await self.bus.answer_elsewhere(request.session_id, key, answer)
        if outcome == "answered":
            raise FailedPrecondition(
                f"call {request.call_id} of turn {request.turn_id} no longer waits: it was "
                "answered already, timed out, or its turn was stopped"
            )
        if outcome == "unknown":
            raise NotFound(
                f"no call {request.call_id} of turn {request.turn_id} waits for an answer in session "
                f"{request.session_id}"
            )
        return pb.SubmitToolResultResponse()

    async def finish_turns(self, grace: float) -> None:
        """On SIGTERM: turns under way get the grace period, less a margin, to finish; those still
        running then are stopped, so their clients get stream_end (partial text saved), not a cut."""
        margin = min(STOP_MARGIN_S, grace / 2)
        tasks = list(self.deps.post_turn_tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=grace - margin)
        self.sessions.stop_all()

    async def drain(self, timeout: float) -> None:
        """After the server stopped: stop any turn still running and give post-turn work `timeout`
        more (the margin finish_turns kept back from the grace period, not a second grace)."""
        self.sessions.stop_all()
        tasks = list(self.deps.post_turn_tasks)
        if tasks:
            with suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout)

"""The Agent gRPC servicer. A turn runs as its own task and streams through a queue, so a client
that goes away (or calls Stop) ends it cooperatively: partial text saved, every tool call
answered, the session loadable."""

from __future__ import annotations

import asyncio
import logging
import math
from contextlib import suppress

import grpc

from palimpsest.v1 import agent_pb2 as pb, agent_pb2_grpc, common_pb2, compressor_pb2 as cpb, session_store_pb2 as store_pb
from services.agent.conversation import StoredConversation, store_error
from services.agent.events import EventSink
from services.agent.subagent import run_subagent
from services.agent.tools.base import SpawnRequest
from services.agent.turn import AgentDeps, Turn, TurnInput
from services.agent.warm_cache import WarmCache
from services.agent.watchers import SessionWatchers
from services.shared.auth import forwarded_metadata, identity_from_context
from services.shared.errors import FailedPrecondition, InvalidArgument, PalimpsestError, Unavailable, from_rpc_error
from services.shared.session_reads import whole_context

log = logging.getLogger("palimpsest.agent")

MAX_TEXT_CHARS = 1_000_000
# On SIGTERM, what is kept of the grace period for stopped turns to save their partial text and
# end their streams (one store write each) before gRPC cancels what is left.
STOP_MARGIN_S = 1.0
WARM_SESSIONS = 1000  # sessions whose last state is kept for their next turn


def _validate_turn(request) -> None:
    if not request.text.strip() and not request.images:
        raise InvalidArgument("text", "a turn needs text or images")
    if len(request.text) > MAX_TEXT_CHARS:
        raise InvalidArgument("text", f"at most {MAX_TEXT_CHARS} characters")
    if request.hidden and request.images:
        raise InvalidArgument("images", "hidden turns carry machine payloads, not images")


class AgentServicer(agent_pb2_grpc.AgentServicer):
    def __init__(self, deps: AgentDeps, store_addr: str):
        self.deps = deps
        self.store_addr = store_addr
        # One turn per session at a time in this process; across replicas the store's revision
        # check refuses the second writer.
        self._locks: dict[str, asyncio.Lock] = {}
        self._running: dict[str, Turn] = {}
        self._watchers = SessionWatchers()  # WatchSession's clients, by session
        # The post-turn pass per session, so a new turn can drop it instead of waiting for it.
        self._post_turn: dict[str, asyncio.Future] = {}
        # Bumped whenever a session changes under its lock: a turn opened before it reloads.
        self._generation: dict[str, int] = {}
        # Per session, the caller's credentials and the CONTEXT view as its last turn left it: the
        # next turn starts from it (one round trip less before the first token). A stale copy costs a
        # reload at the first write, which the store refuses on the revision.
        self._warm: WarmCache[tuple[tuple, common_pb2.Session]] = WarmCache(
            WARM_SESSIONS, deps.settings.agent_warm_mb * 1024 * 1024)

    def _metadata(self, context) -> tuple[tuple[str, str], ...]:
        identity_from_context(context, enabled=self.deps.settings.auth_enabled, secret=self.deps.settings.jwt_secret)
        return forwarded_metadata(context)

    async def _keep_warm(self, turn: Turn) -> None:
        """After the turn and its post-turn pass, off the client's path: the session as it is now."""
        try:
            session = await whole_context(
                lambda request: self._store(self.deps.store.GetSession, request, turn.metadata), turn.session_id)
        except PalimpsestError:
            return
        self._warm.put(turn.session_id, (turn.metadata, session), session.ByteSize())

    def _forget_idle_lock(self, session_id: str, lock: asyncio.Lock) -> None:
        """One lock per session would pile up forever; an idle one nobody waits for can go."""
        if not lock.locked() and not getattr(lock, "_waiters", None) and self._locks.get(session_id) is lock:
            del self._locks[session_id]  # (its generation stays: a turn opened meanwhile must reload)

    def _reload_profiles(self) -> None:
        """An edited profiles file applies from the next turn; cached system prompts go with it."""
        fresh = self.deps.profiles.reloaded()
        if fresh is not None:
            self.deps.profiles = fresh
            if fresh.error:  # the last good profiles stay in use; `pal profiles` shows the error too
                log.error("PALIMPSEST_PROFILES: %s; keeping the profiles last read", fresh.error)
                return
            self.deps.builder.invalidate()
            log.info("profiles reloaded from %s", fresh.path)

    async def _store(self, method, request, metadata):
        try:
            return await method(request, metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            raise store_error(exc, self.store_addr) from None

    async def _open_turn(self, request, context) -> Turn:
        """Everything that can fail with a plain status before the stream begins."""
        _validate_turn(request)
        metadata = self._metadata(context)
        self._reload_profiles()
        warm = None
        if request.session_id:
            warm = self._warm.pop(request.session_id)
            if warm is not None and warm[0] == metadata:  # the same caller: the same access
                session = warm[1]
            else:
                warm = None
                # The CONTEXT view: the turn starts from it without loading the session again.
                session = await whole_context(
                    lambda part: self._store(self.deps.store.GetSession, part, metadata), request.session_id)
            profile = (self.deps.profiles.get(request.profile_id) if request.profile_id
                       else self.deps.profiles.for_session(session.profile_id))
        else:
            profile = self.deps.profiles.get(request.profile_id)
        try:
            facts = await self.deps.ollama.model_facts(profile.model)
        except Unavailable as exc:
            raise Unavailable(f"{exc}; then `ollama pull {profile.model}` for profile {profile.id!r}") from None
        if not request.session_id:
            session = (await self._store(self.deps.store.CreateSession, store_pb.CreateSessionRequest(
                profile_id=profile.id, provider="ollama", model=profile.model), metadata)).session
        conversation = StoredConversation(self.deps.store, session.id, metadata, self.store_addr)
        conversation.adopt(session)
        conversation.from_cache = warm is not None
        sink = EventSink(session.id, publish=self._watchers.publish)
        turn = Turn(self.deps, conversation, profile, sink, metadata, facts=facts)
        turn.opened_generation = self._generation.get(session.id, 0)
        if request.session_id and profile.id != session.profile_id:
            turn.switch_to = profile.id  # written by the turn, under the session lock
        return turn

    async def _drive(self, turn: Turn, turn_input: TurnInput):
        """Run the turn under the session lock; yields its events until stream_end."""
        lock = self._locks.setdefault(turn.session_id, asyncio.Lock())
        post_turn = self._post_turn.get(turn.session_id)
        if post_turn is not None and not post_turn.done():
            # The user is back before the post-turn pass finished (a summary can take the model
            # seconds): drop it. Its commit is one transaction, so nothing half-done stays, and this
            # turn's own first check compresses if the context still needs it.
            post_turn.cancel()
        await lock.acquire()
        self._running[turn.session_id] = turn
        turn.sink.announce(turn_started=pb.TurnStarted(text=turn_input.text[:200]))

        async def work() -> None:
            try:
                if self._generation.get(turn.session_id, 0) != turn.opened_generation:
                    turn.conv.session = None  # another turn ran while we waited: start from the store
                try:
                    await turn.run(turn_input)
                finally:
                    self._running.pop(turn.session_id, None)
                post_turn = asyncio.ensure_future(turn.post_turn())
                self._post_turn[turn.session_id] = post_turn
                try:
                    await post_turn
                except asyncio.CancelledError:
                    if not post_turn.cancelled():
                        raise  # this task itself is being cancelled, not just the post-turn pass
                    log.info("post-turn pass of %s dropped: the next turn arrived", turn.session_id)
                finally:
                    if self._post_turn.get(turn.session_id) is post_turn:
                        del self._post_turn[turn.session_id]
                await self._keep_warm(turn)
            finally:
                self._generation[turn.session_id] = self._generation.get(turn.session_id, 0) + 1
                lock.release()
                self._forget_idle_lock(turn.session_id, lock)

        task = asyncio.create_task(work())
        self.deps.post_turn_tasks.add(task)
        task.add_done_callback(self.deps.post_turn_tasks.discard)
        finished = False
        try:
            while True:
                event = await turn.sink.queue.get()
                yield event
                if event.HasField("stream_end") and not event.is_subagent:
                    finished = True
                    return
        finally:
            if not finished:
                turn.stop.set()  # the client went away: end the turn cooperatively

    async def RunStream(self, request, context):
        turn = await self._open_turn(request, context)
        async for event in self._drive(turn, TurnInput(request.text, list(request.images), request.hidden)):
            yield event

    async def Run(self, request, context):
        turn = await self._open_turn(request, context)
        text, reason = "", pb.STREAM_END_REASON_UNSPECIFIED
        async for event in self._drive(turn, TurnInput(request.text, list(request.images), request.hidden)):
            if event.HasField("stream_end") and not event.is_subagent:
                text, reason = event.stream_end.text, event.stream_end.reason
            elif event.HasField("error") and not event.is_subagent and event.error.code == "UNAVAILABLE":
                raise Unavailable(event.error.message)
        return pb.RunResponse(session_id=turn.session_id, text=text, reason=reason)

    async def RunEphemeral(self, request, context):
        if not request.text.strip():
            raise InvalidArgument("text", "required")
        if request.max_iterations < 0:
            raise InvalidArgument("max_iterations", "must not be negative")
        if not (math.isfinite(request.timeout_seconds) and request.timeout_seconds >= 0):
            raise InvalidArgument("timeout_seconds", "must be a finite number of seconds, not negative")
        metadata = self._metadata(context)
        parent_profile = None
        untrusted = False
        if request.parent_session_id:
            parent = (await self._store(self.deps.store.GetSession, store_pb.GetSessionRequest(
                session_id=request.parent_session_id), metadata)).session
            parent_profile = self.deps.profiles.get(parent.profile_id)
            untrusted = parent.untrusted_ingested  # sub-agents of an untrusted session run untrusted
        spawn = SpawnRequest(
            text=request.text, profile_id=request.profile_id, max_iterations=request.max_iterations or 40,
            exclude_tools=tuple(request.exclude_tools), briefing=request.briefing,
            custom_system_prompt=request.custom_system_prompt, inherit_system_prompt=request.inherit_system_prompt,
            context_transfer=request.context_transfer, parent_session_id=request.parent_session_id,
            timeout_seconds=request.timeout_seconds or 300.0,
        )
        result = await run_subagent(self.deps, spawn, sink=EventSink(request.parent_session_id, is_subagent=True),
                                    metadata=metadata, untrusted=untrusted, parent_profile=parent_profile)
        return pb.RunEphemeralResponse(text=result.text, completed_normally=result.completed_normally)

    async def Compact(self, request, context):
        metadata = self._metadata(context)
        if not request.session_id:
            raise InvalidArgument("session_id", "required")
        session = (await self._store(self.deps.store.GetSession, store_pb.GetSessionRequest(
            session_id=request.session_id), metadata)).session
        profile = self.deps.profiles.for_session(session.profile_id)
        window = profile.window(self.deps.settings.ollama_num_ctx)
        sink = EventSink(session.id, publish=self._watchers.publish)
        lock = self._locks.setdefault(session.id, asyncio.Lock())
        self._warm.pop(session.id)
        async with lock:
            try:
                async for event in self.deps.compressor.Compress(cpb.CompressRequest(
                        session_id=session.id, reason=cpb.COMPRESSION_REASON_FORCED, model=profile.model,
                        window=window, settings=profile.compression_settings()), metadata=metadata):
                    sink.compression(event)
                    yield sink.queue.get_nowait()
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    raise FailedPrecondition(f"nothing to compact: {exc.details()}") from None
                # A conflict means what it means for the store; anything else names the Compressor.
                raise (store_error(exc, self.deps.settings.store_addr) if exc.code() == grpc.StatusCode.ABORTED
                       else from_rpc_error(exc, "Compressor", self.deps.settings.compressor_addr)) from None
            finally:
                self._generation[session.id] = self._generation.get(session.id, 0) + 1
        sink.stream_end(pb.STREAM_END_REASON_COMPLETED, "")
        yield sink.queue.get_nowait()

    async def Stop(self, request, context):
        self._metadata(context)
        if not request.session_id:
            raise InvalidArgument("session_id", "required")
        # Only the session's owner (or an admin) may stop it, or learn whether a turn runs in it:
        # reading the session checks exactly that, before anything is said.
        if self.deps.settings.auth_enabled:
            await self._store(self.deps.store.GetSession, store_pb.GetSessionRequest(
                session_id=request.session_id, view=store_pb.SESSION_VIEW_SUMMARY), forwarded_metadata(context))
        turn = self._running.get(request.session_id)
        if turn is None:
            return pb.StopResponse(stopped=False)
        turn.stop.set()
        return pb.StopResponse(stopped=True)


    async def WatchSession(self, request, context):
        metadata = self._metadata(context)
        if not request.session_id:
            raise InvalidArgument("session_id", "required")
        # Who may read the session may watch it: the store answers for the caller.
        await self._store(self.deps.store.GetSession, store_pb.GetSessionRequest(
            session_id=request.session_id, view=store_pb.SESSION_VIEW_SUMMARY), metadata)
        queue = self._watchers.subscribe(request.session_id)
        try:
            await context.send_initial_metadata(())  # the watch is in place: nothing from now on is missed
            while True:
                yield await queue.get()
        finally:
            self._watchers.unsubscribe(request.session_id, queue)
    async def ListProfiles(self, request, context):
        self._metadata(context)
        self._reload_profiles()  # what the next turn would use, and why an edit was not taken
        default_window = self.deps.settings.ollama_num_ctx
        return pb.ListProfilesResponse(
            profiles=[p.to_proto(default_window) for p in self.deps.profiles.profiles.values()],
            default_profile_id=self.deps.profiles.default_id,
            profiles_error=self.deps.profiles.error,
            ollama_host=self.deps.ollama.host,
        )

    async def finish_turns(self, grace: float) -> None:
        """On SIGTERM: turns under way get the grace period, less a margin, to finish; those still
        running then are stopped, so their clients get stream_end (partial text saved), not a cut."""
        margin = min(STOP_MARGIN_S, grace / 2)
        tasks = list(self.deps.post_turn_tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=grace - margin)
        for turn in list(self._running.values()):
            turn.stop.set()

    async def drain(self, timeout: float) -> None:
        """After the server stopped: stop any turn still running and give post-turn work `timeout`
        more (the margin finish_turns kept back from the grace period, not a second grace)."""
        for turn in list(self._running.values()):
            turn.stop.set()
        tasks = list(self.deps.post_turn_tasks)
        if tasks:
            with suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout)


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
from types import MappingProxyType

from palimpsest.agent import sandbox
from palimpsest.agent.attachments import check_request, store_attachments
from palimpsest.agent.audit import ToolRunLog, store_tool_runs
from palimpsest.agent.client_tools import MAX_ANSWER_BYTES, Answer, ClientTool, client_tools_from_proto
from palimpsest.agent.conversation import StoredConversation, conflict
from palimpsest.agent.events import EventSink
from palimpsest.agent.profiles import PROVIDER, Profile, ProfileRegistry
from palimpsest.agent.replica_bus import ReplicaBus
from palimpsest.agent.runtime import SessionRuntime, TurnClaims
from palimpsest.agent.subagent import run_subagent
from palimpsest.agent.tools.base import SpawnRequest
from palimpsest.agent.tools.registry import BUILTIN, tools_for
from palimpsest.agent.turn import Turn
from palimpsest.agent.turn_context import AgentDeps, TurnContext, TurnInput
from palimpsest.agent.turn_logs import TurnLogs
from palimpsest.agent.warm_cache import WarmCache
from palimpsest.agent.watchers import SessionWatchers
from palimpsest.shared.auth import SERVICE_ROLE, caller, forwarded_metadata, vouching_metadata
from palimpsest.shared.errors import (
    Aborted,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PalimpsestError,
    ResourceExhausted,
    Unavailable,
)
from palimpsest.shared.external_refs import refs_from_proto
from palimpsest.shared.session_reads import whole_context
from palimpsest.shared.workspace_paths import BadPath, workspace_path
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import agent_pb2_grpc, common_pb2
from palimpsest.v1 import compressor_pb2 as cpb
from palimpsest.v1 import session_store_pb2 as store_pb

log = logging.getLogger("palimpsest.agent")

MAX_TEXT_CHARS = 1_000_000
# On SIGTERM, what is kept of the grace period for stopped turns to save their partial text and
# end their streams (one store write each) before gRPC cancels what is left.
STOP_MARGIN_S = 1.0
WARM_SESSIONS = 1000  # sessions whose last state is kept for their next turn
# How long a WatchSession waits for the session bus to listen (reconnecting) before it starts anyway
# with this replica's turns only.
WATCH_BUS_WAIT_S = 5.0
# How long a resume waits for another replica's turn to reach this one over the session bus.
RESUME_CATCH_UP_S = 2.0


def _validate_turn(request) -> None:
    if not (request.text.strip() or request.images or request.attachments or request.inline_attachments):
        raise InvalidArgument("text", "a turn needs text, images or files")
    if len(request.text) > MAX_TEXT_CHARS:
        raise InvalidArgument("text", f"at most {MAX_TEXT_CHARS} characters")
    if request.hidden and request.images:
        raise InvalidArgument("images", "hidden turns carry machine payloads, not images")
    refs_from_proto(request.external_refs)  # checked here: a bad ref must not cost a turn half run
    check_request(request)
    turn_cwd(request.cwd)


def turn_client_tools(request, profile: Profile, settings) -> tuple[list[ClientTool], int]:
    """The client's tools for the turn, and how long one call waits for its answer."""
    wait = request.client_tool_timeout_seconds
    if not 0 <= wait <= settings.client_tool_max_timeout_s:
        raise InvalidArgument(
            "client_tool_timeout_seconds",
            f"0 (the default, {settings.client_tool_timeout_s} s) to "
            f"{settings.client_tool_max_timeout_s} s (PALIMPSEST_CLIENT_TOOL_MAX_TIMEOUT_SECONDS)",
        )
    if not request.client_tools:
        return [], wait
    taken = {*BUILTIN, *tools_for((), profile.custom_tools)}  # built-ins, and the profile's custom tools
    return client_tools_from_proto(request.client_tools, taken), wait


def turn_cwd(raw: str) -> str:
    """A turn's working folder, as a workspace path ("" for the workspace itself)."""
    try:
        return workspace_path(raw, allow_root=True) if raw else ""
    except BadPath as exc:
        raise InvalidArgument("cwd", str(exc)) from None


def session_changes(session: common_pb2.Session, profile: Profile, request) -> dict:
    """The UpdateSession fields a turn writes before anything else: what it runs on, where that
    differs from what the session last ran on; the refs the request adds (a new session got them
    at its creation, and adding them again changes nothing); the taint of pasted images and
    uploaded files (content from outside, as a tool's output is), before they are stored."""
    changes: dict = {}
    if profile.id != session.profile_id:
        changes["profile_id"] = profile.id
    if (session.provider, session.model) != (PROVIDER, profile.model):
        changes.update(provider=PROVIDER, model=profile.model)
    stored = {(r.kind, r.uri, r.created_by) for r in session.external_refs}
    if any((r.kind, r.uri, r.created_by) not in stored for r in request.external_refs):
        changes["add_external_refs"] = list(request.external_refs)
    if (request.images or request.attachments or request.inline_attachments) and not session.untrusted_ingested:
        changes["mark_untrusted_ingested"] = True
    return changes


def _other_model_hint(profiles: ProfileRegistry, profile: Profile) -> str:
    """When a resumed session's model is not the one its profile names now: how to move it on."""
    configured = profiles.profiles.get(profile.id)
    if configured is None or configured.model == profile.model:
        return ""
    return (
        f" (the model this session last ran on), or continue it on the profile's model "
        f"{configured.model!r} by passing profile_id={profile.id!r}"
    )


class AgentServicer(agent_pb2_grpc.AgentServicer):
    def __init__(self, deps: AgentDeps):
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

    async def _open_turn(self, request, context) -> tuple[Turn, TurnInput]:
        """Everything that can fail with a plain status before the stream begins: the turn, and
        what it answers."""
        _validate_turn(request)
        metadata = forwarded_metadata(context)
        await self._reload_profiles()
        warm = None
        if request.session_id:
            warm = self.sessions.take_warm(request.session_id, metadata)
            # Else the CONTEXT view: the turn starts from it without loading the session again.
            session = warm or await whole_context(self.deps.store.GetSession, request.session_id)
            profile = (
                self.deps.profiles.get(request.profile_id)
                if request.profile_id
                else self.deps.profiles.resumed(session.profile_id, session.provider, session.model)
            )
        else:
            profile = self.deps.profiles.get(request.profile_id)
        client_tools, client_wait = turn_client_tools(request, profile, self.deps.settings)
        try:
            facts = await self.deps.ollama.model_facts(profile.model)
        except Unavailable as exc:
            raise Unavailable(
                f"{exc}; then `ollama pull {profile.model}` for profile {profile.id!r}"
                + _other_model_hint(self.deps.profiles, profile)
            ) from None
        if not request.session_id:
            session = (
                await self.deps.store.CreateSession(
                    store_pb.CreateSessionRequest(
                        profile_id=profile.id,
                        provider=PROVIDER,
                        model=profile.model,
                        external_refs=request.external_refs,
                    )
                )
            ).session
        files = await self._turn_files(request, session.id)
        if request.inline_attachments:  # storing them moved the session on (its taint): start from the store
            session, warm = await whole_context(self.deps.store.GetSession, session.id), None
        settings = self.deps.settings
        conversation = StoredConversation(
            self.deps.store,
            session.id,
            vouching_metadata(settings.auth_enabled, settings.jwt_secret),
            timeout=settings.rpc_timeout_s,
        )
        conversation.adopt(session)
        conversation.from_cache = warm is not None
        sink = EventSink(session.id, publish=self._publish, turn_id=uuid.uuid4().hex)
        turn = Turn(
            TurnContext(
                self.deps,
                conversation,
                profile,
                sink,
                metadata,
                facts,
                spawn=run_subagent,
                opened_generation=self.sessions.generation(session.id),
                session_changes=MappingProxyType(session_changes(session, profile, request)),
            )
        )
        return turn, TurnInput(
            request.text,
            list(request.images),
            request.hidden,
            files,
            cwd=turn_cwd(request.cwd),
            client_tools=client_tools,
            client_tool_timeout_s=client_wait,
        )

    async def _turn_files(self, request, session_id: str) -> list[str]:
        """The turn's files, stored before the stream begins so a refusal is the call's status. A
        session made for this turn goes again when its files are refused: nothing stays of it."""
        if not (request.attachments or request.inline_attachments):
            return []
        try:
            return await store_attachments(self.deps.store, session_id, request)
        except BaseException:
            if not request.session_id:
                with suppress(PalimpsestError):
                    await self.deps.store.DeleteSession(store_pb.DeleteSessionRequest(session_id=session_id))
            raise

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

    async def RunStream(self, request, context):
        turn, turn_input = await self._open_turn(request, context)
        async for event in self._drive(turn, turn_input, request.stop_on_disconnect):
            yield event

    async def Run(self, request, context):
        turn, turn_input = await self._open_turn(request, context)
        text, reason = "", pb.STREAM_END_REASON_UNSPECIFIED
        async for payload in self._drive(turn, turn_input, request.stop_on_disconnect):
            event = pb.AgentEvent.FromString(payload)
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
        metadata = forwarded_metadata(context)
        parent_profile = None
        untrusted = pinned = False
        if request.parent_session_id:
            parent = (
                await self.deps.store.GetSession(store_pb.GetSessionRequest(session_id=request.parent_session_id))
            ).session
            parent_profile = self.deps.profiles.resumed(parent.profile_id, parent.provider, parent.model)
            untrusted = parent.untrusted_ingested  # sub-agents of an untrusted session run untrusted
            pinned = parent.sandboxed
        spawn = SpawnRequest(
            text=request.text,
            profile_id=request.profile_id,
            max_iterations=request.max_iterations or 40,
            exclude_tools=tuple(request.exclude_tools),
            briefing=request.briefing,
            custom_system_prompt=request.custom_system_prompt,
            inherit_system_prompt=request.inherit_system_prompt,
            context_transfer=request.context_transfer,
            parent_session_id=request.parent_session_id,
            timeout_seconds=request.timeout_seconds or 300.0,
        )

        async def taint_parent() -> None:  # (the parent's own turns read the flag from the store)
            await self.deps.store.UpdateSession(
                store_pb.UpdateSessionRequest(session_id=request.parent_session_id, mark_untrusted_ingested=True)
            )

        tool_runs = ToolRunLog()
        try:
            result = await run_subagent(
                self.deps,
                spawn,
                sink=EventSink(request.parent_session_id, is_subagent=True),
                metadata=metadata,
                untrusted=untrusted,
                parent_profile=parent_profile,
                taint_parent=taint_parent if request.parent_session_id else None,
                sandbox_pinned=lambda: pinned,
                tool_runs=tool_runs,
            )
        finally:
            runs = tool_runs.unstored()
            if runs and request.parent_session_id:  # audited under the session it worked for, in one write
                settings = self.deps.settings
                await store_tool_runs(
                    self.deps.store.AppendMessages,
                    request.parent_session_id,
                    runs,
                    key=uuid.uuid4().hex,
                    metadata=vouching_metadata(settings.auth_enabled, settings.jwt_secret),
                    timeout=settings.rpc_timeout_s,
                )
        return pb.RunEphemeralResponse(text=result.text, completed_normally=result.completed_normally)

    async def Compact(self, request, context):
        if not request.session_id:
            raise InvalidArgument("session_id", "required")
        session = (await self.deps.store.GetSession(store_pb.GetSessionRequest(session_id=request.session_id))).session
        profile = self.deps.profiles.resumed(session.profile_id, session.provider, session.model)
        window = profile.window(self.deps.settings.ollama_num_ctx)
        with suppress(PalimpsestError):  # Ollama away: the profile's window (the summary call will say)
            window = (await self.deps.ollama.model_facts(profile.model)).usable_window(window)
        sink = EventSink(session.id, publish=self._publish)  # no turn_id: a compaction ends with its call
        self.sessions.forget_warm(session.id)
        holder, _ = await self._hold(session.id)
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

    async def Stop(self, request, context):
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

    async def WatchSession(self, request, context):
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

    async def ResumeStream(self, request, context):
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

    async def ListProfiles(self, request, context):
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

    async def SubmitToolResult(self, request, context):
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
        here = turn is not None and turn.sink.turn_id == request.turn_id and turn.conv.session is not None
        if not (here and me.can_access(turn.conv.session.owner or None)):
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

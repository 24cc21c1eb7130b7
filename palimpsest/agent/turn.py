"""One turn of the agent: pre-turn compression, then the tool loop against Ollama, then the
post-turn check. Events go to the turn's sink as they happen; nothing here knows about gRPC
streams, so RunStream, Run and RunEphemeral all drive the same code. The work of each step lives
in ``palimpsest.agent.stages`` (prepare and size, call the model, store, run tools, upkeep); this
module holds the loop that runs them in order and the state one turn carries between them."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import uuid
from collections.abc import Sequence

from palimpsest.agent import context_builder as cb
from palimpsest.agent.client_tools import ClientTool
from palimpsest.agent.images import ImageTarget, user_messages
from palimpsest.agent.profiles import Profile
from palimpsest.agent.stages.model_call import call_model, request_body
from palimpsest.agent.stages.prepare import Prepared, TooLarge, after_refusal, prepare
from palimpsest.agent.stages.report import model_report, record_usage
from palimpsest.agent.stages.runs_on import RunsOn, announce_model, runs_on, settle_mcp
from palimpsest.agent.stages.sizing import call_notes, unchecked
from palimpsest.agent.stages.storing import (
    StalePrompt,
    StoringTask,
    answer_message,
    save_partial,
    store_answer,
    tool_calls_of,
)
from palimpsest.agent.stages.tools import MAX_SPAWN_DEPTH, ToolRun, run_tools
from palimpsest.agent.stages.upkeep import (
    compress as run_compression,
)
from palimpsest.agent.stages.upkeep import (
    compress_after_turn,
    name_session,
    recall,
    title_session,
)
from palimpsest.agent.stream_guard import StreamStopped, StreamTimeout
from palimpsest.agent.tools.base import SpawnRequest, ToolContext, TurnState, schema
from palimpsest.agent.turn_context import END, SubagentOptions, TurnContext, TurnInput, TurnResult
from palimpsest.shared import metrics
from palimpsest.shared.context_view import sliced_for_size_check
from palimpsest.shared.errors import PalimpsestError, Unavailable
from palimpsest.shared.ollama import ChatResult, ContextRefused, ModelFacts
from palimpsest.shared.settings import Settings
from palimpsest.v1 import agent_pb2, common_pb2
from palimpsest.v1 import compressor_pb2 as cpb
from palimpsest.v1 import session_store_pb2 as store_pb

log = logging.getLogger("palimpsest.agent")

Message = common_pb2.Message

# The session a turn is working for. A sub-agent sets it for its own run and restores the
# parent's in `finally`, so nothing after it (the parent's next iteration, background work)
# ever sees a sub-agent's session.
current_session: contextvars.ContextVar[str] = contextvars.ContextVar("current_session", default="")


class Turn:
    """One user message answered: built from a ``TurnContext`` by the Agent's servicer (RunStream,
    Run) or by ``run_subagent`` (RunEphemeral, spawn_agent), run once with ``run``, then (stored
    sessions) ``post_turn``.

    A turn holds the session's conversation (``conv``: stored, or ephemeral for a sub-agent), what
    it runs on (``on``: profile, model, window, tools; a tool may switch the profile mid-turn), and a
    sink that receives every event.
    ``run`` always ends in ``stream_end`` (except for a sub-agent, whose parent reports it): every
    failure becomes an error event, and what was already said is stored as a partial answer.
    The servicer serialises turns per session and sets ``stop`` when the client stops one or leaves.
    """

    def __init__(self, ctx: TurnContext):
        self.ctx = ctx
        self.deps = deps = ctx.deps
        self.conv = conversation = ctx.conversation
        profile = ctx.profile
        self.sink = ctx.sink
        self.metadata = ctx.metadata
        self.is_subagent = ctx.subagent is not None
        self.spawner = ctx.spawn  # None: this turn cannot spawn sub-agents (spawn_agent is not offered)
        options = ctx.subagent or SubagentOptions(depth=0)
        self.system_prompt_override = options.system_prompt
        self.max_iterations = options.max_iterations or profile.max_iterations
        self.exclude_tools = tuple(options.exclude_tools)
        self.depth = options.depth
        self.parent_session_id = options.parent_session_id
        # A stored turn writes its own session; a sub-agent writes its parent's through the parent.
        self.session_writer = conversation.update if not conversation.ephemeral else options.session_writer
        self.taint_parent = options.taint_parent
        self.cwd = options.cwd
        self._parent_pinned = options.sandbox_pinned
        self.key = uuid.uuid4().hex  # the run whose first file tool syncs the workspace
        self.client_tools: list[ClientTool] = []
        self.client_tool_timeout_s = deps.settings.client_tool_timeout_s
        # A sub-agent of a session that has taken in outside content runs clamped: its task may
        # carry instructions planted in that content, so it keeps only the confined tools.
        self.clamped = self.is_subagent and conversation.untrusted
        self.stop = asyncio.Event()
        self.state = TurnState()
        self.last_prompt_tokens = 0
        self.last_trigger = 0  # where the last size check said compression starts
        self.prompt_cut = False  # the last call's report proved its prompt cut
        self.compressed_after = False  # the post-turn pass committed a compression
        self.first_words = ""  # the name this turn gave a new session, for the title after the answer
        self.result = TurnResult()
        self._pending: list[Message] = []  # this turn's user message, stored with the first size check
        self._noted_iteration = -1  # the iteration whose notes are already on their way to the store
        self._compressor_away = False  # said once per turn
        self._shrunk_by = ""  # what the last refused prompt was shrunk by before it was sent again
        self._partial: ChatResult | None = None  # the call under way, kept as a partial answer if cut short
        # The profile, model, window and tools it runs on, made anew when a tool switches profile.
        self.on = self._runs_on(profile, ctx.facts)

    # -- small helpers -------------------------------------------------------------------------
    @property
    def settings(self) -> Settings:
        return self.deps.settings

    @property
    def session_id(self) -> str:
        return self.conv.session_id

    @property
    def stored(self) -> bool:
        return not self.conv.ephemeral

    def _runs_on(self, profile: Profile, facts: ModelFacts) -> RunsOn:
        return runs_on(
            profile,
            facts,
            num_ctx=self.settings.ollama_num_ctx,
            mcp=self.deps.mcp,
            is_subagent=self.is_subagent,
            exclude=self.exclude_tools,
            depth=self.depth,
            client_tools=self.client_tools,
            clamped=self.clamped,
        )

    def _system_prompt(self) -> str:
        if self.system_prompt_override is not None:
            return self.system_prompt_override
        return self.deps.builder.system_prompt(self.on.profile, subagent=self.is_subagent)

    def _keep_recent(self) -> int:
        return self.on.profile.compression_keep_recent or self.settings.compression_keep_recent

    def _compression_on(self) -> bool:
        return self.stored and self.settings.compression_enabled and self.on.profile.compression_enabled

    def _end(self, reason: agent_pb2.StreamEndReason, text: str) -> TurnResult:
        self.result = TurnResult(text=text, reason=reason)
        if not self.is_subagent:
            self.sink.stream_end(reason, text)
            metrics.turn_ended(reason)
        return self.result

    # -- the turn ------------------------------------------------------------------------------
    async def run(self, turn_input: TurnInput) -> TurnResult:
        token = current_session.set(self.session_id or f"subagent-of-{self.parent_session_id}")
        try:
            return await self._run(turn_input)
        except PalimpsestError as exc:
            await self._save_partial("error")
            self.sink.error(exc.code.name, str(exc))
            return self._end(END.STREAM_END_REASON_ERROR, self.result.text)
        except Exception as exc:  # noqa: BLE001 — a turn always ends with stream_end
            log.exception("turn failed in session %s", self.session_id)
            await self._save_partial("error")
            self.sink.error("INTERNAL", f"the turn failed: {type(exc).__name__}: {exc}")
            return self._end(END.STREAM_END_REASON_ERROR, self.result.text)
        finally:
            current_session.reset(token)
            await self.conv.done_appending()

    async def _run(self, turn_input: TurnInput) -> TurnResult:
        announce_model(self.sink, self.on)
        self.cwd = turn_input.cwd or self.cwd
        # The servers' tools as of the turn's start, not of its request.
        reload = await settle_mcp(self.deps.mcp, self.on.profile)
        if turn_input.client_tools:
            self.client_tools = list(turn_input.client_tools)
            self.client_tool_timeout_s = turn_input.client_tool_timeout_s or self.client_tool_timeout_s
            reload = True
        if reload:
            self.on = self._runs_on(self.on.profile, self.on.facts)
        if self.conv.session is None:  # (an ephemeral conversation holds its context already)
            await self.conv.load()
        if self.ctx.session_changes:
            await self.conv.update(**self.ctx.session_changes)
        self.state.goal = turn_input.text
        messages = await user_messages(
            ImageTarget(
                session_id=self.session_id,
                stored=self.stored,
                store=self.deps.store,
                compressor=self.deps.compressor,
                model=self.on.profile.model,
                window=self.on.window,
                settings=self.on.profile.compression_settings(),
                image_fallback=self.settings.image_tokens_fallback,
                # (only pictures need the context's count: the rest of the time nothing is built for it)
                preamble=self._prompt_head() if turn_input.images else (),
                tool_schemas=self.on.tool_schemas_json() if turn_input.images else (),
            ),
            turn_input.text,
            turn_input.images,
            turn_input.hidden,
            turn_input.files,
        )
        if not turn_input.hidden:  # (a sub-agent's conversation has no session to name)
            self.first_words = await name_session(self.conv, self.sink, turn_input.text)
        recalled = await recall(self.deps.store, self.conv, self.on.profile, self.on.window, turn_input.text)
        # Stored while the first size check runs, and that check is also the pre-turn estimate:
        # the fewest round trips before the first token. Recalled excerpts go just before the
        # message that recalled them and stay there, so the prompt only ever grows at its end.
        self._pending = [*recalled, *messages]
        return await self._loop()

    async def _loop(self) -> TurnResult:
        """Up to ``max_iterations`` model calls. Each: prepare the prompt (the Compressor sizes it,
        compressing first if it says so), stream the call; an answer without tool calls is stored
        and ends the turn, otherwise the tool calls are stored and run and the loop goes on.
        ``stalled`` counts calls in a row without todo progress (the anti-stall note reads it)."""
        stalled = 0
        progress_seen = self.state.todo_progress
        for iteration in range(self.max_iterations):
            if self.stop.is_set():
                if self._pending:  # stopped before the first call: the user's message is still kept
                    await self.conv.append(self._pending)
                    self._pending = []
                return self._end(END.STREAM_END_REASON_STOPPED, self.result.text)
            refusals, prepared = 0, await self._prepare(iteration, stalled)
            while True:
                if isinstance(prepared, TooLarge):
                    return await self._too_large(prepared.answer)
                built, check, storing = prepared.built, prepared.check, prepared.storing
                self._shrunk_by = prepared.shrunk_by or self._shrunk_by
                try:
                    reply = await self._call_model(built, storing)
                    break
                except StalePrompt:  # nothing reached the client: the same call, built from what is stored
                    prepared = await self._prepare(iteration, stalled)
                except ContextRefused as exc:  # proven over the window: shrunk and sent once more, or the end
                    refusals += 1
                    prepared = await after_refusal(
                        self,
                        exc,
                        built,
                        check,
                        iteration,
                        refusals,
                        conv=self.conv,
                        window=self.on.window,
                        requested_window=self.on.requested_window,
                        compression_on=self._compression_on(),
                        keep_recent=self._keep_for(iteration),
                        shrunk_before=self._shrunk_by,
                    )
                except StreamStopped:
                    await self._save_partial("stopped")
                    return self._end(END.STREAM_END_REASON_STOPPED, self.result.text)
                except (StreamTimeout, PalimpsestError) as exc:
                    await self._save_partial("error")
                    code = "DEADLINE_EXCEEDED" if isinstance(exc, StreamTimeout) else exc.code.name
                    self.sink.error(code, str(exc))
                    return self._end(END.STREAM_END_REASON_ERROR, self.result.text)
            self._partial = None  # from here on the reply is saved, never as a partial
            report = await self._account(reply, check, built)
            if not reply.tool_calls:
                if not await store_answer(self.conv, reply, report, settings=self.settings, sink=self.sink):
                    return self._end(END.STREAM_END_REASON_ERROR, reply.content)
                return self._end(END.STREAM_END_REASON_COMPLETED, reply.content)
            calls = tool_calls_of(reply)
            await self.conv.append([answer_message(reply, tool_calls=calls)], report=report)
            await run_tools(
                calls,
                ToolRun(
                    self.on.tools,
                    self.on.clamped_out,
                    self.conv,
                    self.sink,
                    self.stop,
                    self.state,
                    self.is_subagent,
                    self.tool_context,
                    self.taint,
                ),
            )
            if self.stop.is_set():
                return self._end(END.STREAM_END_REASON_STOPPED, self.result.text)
            if self.state.todo_progress > progress_seen:
                progress_seen, stalled = self.state.todo_progress, 0
            else:
                stalled += 1
            if self.state.switched_profile:
                await self._switch_profile(self.state.switched_profile)
        return self._end(END.STREAM_END_REASON_MAX_ITERATIONS, self.result.text)

    async def _prepare(self, iteration: int, stalled: int) -> Prepared | TooLarge:
        """The prompt for the next call (see stages.prepare), with this call's notes once."""
        if self._noted_iteration != iteration:  # a call made again (StalePrompt) has its notes
            self._noted_iteration = iteration
            self._pending.extend(
                cb.note_messages(call_notes(self.on.profile, iteration, self.max_iterations, stalled, self.state.goal))
            )
        built = self.build(self._pending)
        # This turn's user message on its way to the store while the first size check runs and the
        # model starts reading the prompt: the fewest waits before the first token.
        storing, self._pending = (StoringTask(self.conv, self._pending) if self._pending else None), []
        return await prepare(self, built, storing, iteration)

    async def _too_large(self, answer: str) -> TurnResult:
        """The turn's end when its prompt cannot fit: the answer says why, and is kept in the session."""
        await self.conv.append([Message(role="assistant", content=answer)])
        self.sink.text(answer)
        return self._end(END.STREAM_END_REASON_CONTEXT_TOO_LARGE, answer)

    def build(self, pending: Sequence[Message] = ()) -> list[Message]:
        return cb.ContextBuilder.build(
            self._system_prompt(),
            [*self.conv.context, *(m for m in pending if not m.explicit_flags or m.is_context)],
            self._memory_message(),
        )

    def _prompt_head(self) -> list[Message]:
        """What every prompt of this session begins with: the system prompt and the memory message
        (the Compressor begins a summary with it, so Ollama reuses what it evaluated for the last call)."""
        return cb.ContextBuilder.build(self._system_prompt(), [], self._memory_message())

    def _memory_message(self) -> str:
        """The owner's memory as the session holds it: taken when the session was made and at each
        compression, so between two compressions every prompt begins alike (a sub-agent: none)."""
        session = self.conv.session
        if session is None:
            return ""
        return cb.memory_message(session.memory.entries, self.settings.memory_prompt_tokens)

    async def _switch_profile(self, profile_id: str) -> None:
        self.state.switched_profile = ""
        profile = self.deps.profiles.get(profile_id)
        facts = await self.deps.ollama.model_facts(profile.model)  # its capabilities, not the last's
        self.deps.builder.invalidate(profile_id)
        await settle_mcp(self.deps.mcp, profile)
        self.on = self._runs_on(profile, facts)
        announce_model(self.sink, self.on)

    # -- the model call --------------------------------------------------------------------------
    async def check_size(
        self, built: list[Message], iteration: int, *, decide: bool = True
    ) -> cpb.CheckContextSizeResponse:
        """The one question before a model call, answered by the Compressor: the view to send, its
        count, and fits / compress first / too large. While the Compressor is away the turn goes on
        uncompressed, its view cut at the fixed heuristic rate, and the client is told once."""
        try:
            return await self.deps.compressor.CheckContextSize(
                cpb.CheckContextSizeRequest(
                    model=self.on.profile.model,
                    messages=sliced_for_size_check(built),
                    window=self.on.window,
                    session_id=self.session_id,
                    settings=self.on.profile.compression_settings(),
                    tool_schemas=self.on.tool_schemas_json(),
                    keep_recent_messages=self._keep_for(iteration),
                    decide_compression=decide and self._compression_on(),
                )
            )
        except Unavailable as exc:
            if not self._compressor_away:
                self._compressor_away = True
                log.warning("turn in %s goes on without the Compressor: %s", self.session_id or "-", exc)
                self.sink.error("UNAVAILABLE", f"{exc}; this turn goes on without compression or exact counts")
            return unchecked(built, self.on.window, self.settings.compression_message_token_budget)

    async def _call_model(self, built: list[Message], storing: StoringTask | None = None) -> ChatResult:
        """One model call streamed to the client (see stages.model_call); what it says is kept as
        the partial answer until the loop stores it whole."""
        self._partial = reply = ChatResult()
        return await call_model(
            self.deps.ollama,
            lambda: request_body(
                built,
                model=self.on.profile.model,
                facts=self.on.facts,
                window=self.on.window,
                tools=self.on.tool_schemas(),
                think_enabled=self.on.profile.think_enabled,
            ),
            reply,
            sink=self.sink,
            stop=self.stop,
            settings=self.settings,
            storing=storing,
            model=self.on.profile.model,
            window=self.on.window,
            said=self._said,
        )

    def _said(self, text: str) -> None:
        self.result.text = text

    async def _save_partial(self, why: str) -> None:
        await save_partial(self.conv, self._partial, why)
        self._partial = None

    async def _account(
        self, reply: ChatResult, check: cpb.CheckContextSizeResponse, built: list[Message]
    ) -> store_pb.ModelReport:
        """The call's report, judged for the append of its answer, and the meter. The meter goes
        first: it is the call's, known once its report is judged, and on its way to the client
        while the answer is stored (after the store, its write to the client was one more step
        between the last token and stream_end)."""
        self.last_trigger = check.trigger  # where this size check said compression starts
        # (through_seq: the stored rows this prompt carries)
        report, self.prompt_cut = model_report(
            reply,
            check,
            built,
            self.conv.through_seq,
            model=self.on.profile.model,
            window=self.on.window,
            stored=self.stored,
            session_id=self.session_id,
        )
        self.last_prompt_tokens = await record_usage(
            reply,
            check,
            built,
            report,
            compressor=self.deps.compressor,
            sink=self.sink,
            model=self.on.profile.model,
            window=self.on.window,
            stored=self.stored,
            parent_session_id=self.parent_session_id,
        )
        return report

    # -- tools -----------------------------------------------------------------------------------
    def tool_context(self, call_id: str = "") -> ToolContext:
        """What this turn's tools (and a sub-agent's planner) see of it, for the call ``call_id``."""
        session_id = self.session_id or self.parent_session_id
        workspaces = self.deps.workspaces
        return ToolContext(
            session_id=session_id,
            workspace=workspaces.get(session_id) if workspaces is not None and session_id else None,
            cwd=self.cwd,
            turn_key=self.key,
            stop=self.stop,
            sandbox_pinned=self.sandbox_pinned(),
            call_id=call_id,
            turn_id=self.sink.turn_id,
            client_calls=self.deps.client_calls,
            client_tool_timeout_s=self.client_tool_timeout_s,
            store=self.deps.store,
            ollama=self.deps.ollama,
            profile=self.on.profile,
            settings=self.settings,
            events=self.sink,
            state=self.state,
            window=self.on.window,
            is_subagent=self.is_subagent,
            untrusted=self.conv.untrusted,
            spawn=self._spawn if self.spawner is not None and self.depth < MAX_SPAWN_DEPTH else None,
            update_session=self.session_writer,
            conversation=list(self.conv.context),
            tool_schemas=[schema(t) for t in self.on.tools.values()],
        )

    def sandbox_pinned(self) -> bool:
        """The session's commands run in the sandbox whatever the profile says (a sub-agent: its parent's)."""
        if self._parent_pinned is not None:
            return self._parent_pinned()
        return bool(self.conv.session is not None and self.conv.session.sandboxed)

    async def taint(self) -> None:
        """Outside content is in the conversation: this run's and every parent's are marked."""
        if self.conv.untrusted:
            return
        await self.conv.mark_untrusted()
        if self.taint_parent is not None:
            await self.taint_parent()

    async def _spawn(self, request: SpawnRequest) -> tuple[str, bool]:
        assert self.spawner is not None  # (offered to the tools only with one)
        result = await self.spawner(
            self.deps,
            request,
            sink=self.sink.for_subagent(),
            metadata=self.metadata,
            untrusted=self.conv.untrusted,
            depth=self.depth + 1,
            parent_profile=self.on.profile,
            session_writer=self.session_writer,
            taint_parent=self.taint,
            cwd=self.cwd,
            parent_stop=self.stop,
            sandbox_pinned=self.sandbox_pinned,
            tool_runs=self.conv.tool_runs,
        )
        return result.text, result.completed_normally

    # -- compression -----------------------------------------------------------------------------
    async def compress(self, reason: cpb.CompressionReason, current_tokens: int, keep_recent_messages: int = 0) -> bool:
        """Run one compression (see stages.upkeep.compress); a failure is logged and the turn goes on."""
        return await run_compression(
            self.deps.compressor,
            self.conv,
            self.sink,
            cpb.CompressRequest(
                session_id=self.session_id,
                reason=reason,
                model=self.on.profile.model,
                window=self.on.window,
                keep_recent_messages=keep_recent_messages,
                settings=self.on.profile.compression_settings(),
                current_tokens=current_tokens,
                expected_revision=self.conv.revision,
                prompt_head=self._prompt_head(),
                tool_schemas=self.on.tool_schemas_json(),
            ),
        )

    def _midturn_keep(self) -> int:
        return max(12, 2 * self._keep_recent())

    def _keep_for(self, iteration: int) -> int:
        """Messages a compression keeps verbatim: the pre-turn plan keeps whole turns (0 here), a
        mid-turn one the newest messages of the long turn under way."""
        return 0 if iteration == 0 else self._midturn_keep()

    async def post_turn(self) -> None:
        """After stream_end, off the client's path: a new session's title, then a compression on the
        real count, or because the last prompt came back truncated (the Compressor knows from the
        session's flag)."""
        answered = self.result.reason == END.STREAM_END_REASON_COMPLETED and self.result.text.strip()
        if self.first_words and answered and self.settings.session_titles:
            await title_session(
                self.deps.ollama,
                self.conv,
                self.sink,
                model=self.on.profile.model,
                window=self.on.window,
                thinking=self.on.facts.thinking,
                goal=self.state.goal,
                answer=self.result.text,
                first_words=self.first_words,
            )
        if not self._compression_on() or self.result.reason == END.STREAM_END_REASON_UNSPECIFIED:
            return
        if (
            self.last_trigger
            and self.last_prompt_tokens < self.last_trigger
            and not self.prompt_cut
            and not self.conv.flagged_cut
        ):
            return  # the last prompt was under the trigger and whole: the Compressor would say so
        compressed = await compress_after_turn(
            self.deps.compressor,
            self.sink,
            cpb.CompressRequest(
                session_id=self.session_id,
                reason=cpb.COMPRESSION_REASON_POSTTURN,
                model=self.on.profile.model,
                window=self.on.window,
                keep_recent_messages=self._midturn_keep(),
                only_if_over_threshold=True,
                current_tokens=self.last_prompt_tokens,
                settings=self.on.profile.compression_settings(),
                prompt_head=self._prompt_head(),
                tool_schemas=self.on.tool_schemas_json(),
            ),
        )
        self.compressed_after = self.compressed_after or compressed

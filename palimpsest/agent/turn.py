"""One turn of the agent: pre-turn compression, then the tool loop against Ollama, then the
post-turn check. Events go to the turn's sink as they happen; nothing here knows about gRPC
streams, so RunStream, Run and RunEphemeral all drive the same code. The work of each step lives
in ``palimpsest.agent.stages`` (prepare and size, call the model, store, run tools, upkeep); this
module holds the loop that runs them in order and the state one turn carries between them."""

from __future__ import annotations

import contextvars
import logging

from palimpsest.agent import context_builder as cb
from palimpsest.agent.images import ImageTarget, user_messages
from palimpsest.agent.stages.model_call import call_model, request_body
from palimpsest.agent.stages.prepare import Prepared, TooLarge, after_refusal, prepare
from palimpsest.agent.stages.report import model_report, record_usage
from palimpsest.agent.stages.runs_on import announce_model, settle_mcp
from palimpsest.agent.stages.sizing import call_notes, unchecked
from palimpsest.agent.stages.storing import (
    StalePrompt,
    StoringTask,
    answer_message,
    save_partial,
    store_answer,
    tool_calls_of,
)
from palimpsest.agent.stages.tools import ToolRun, run_tools
from palimpsest.agent.stages.upkeep import (
    name_session,
    recall,
)
from palimpsest.agent.stream_guard import StreamStopped, StreamTimeout
from palimpsest.agent.turn_base import TurnBase
from palimpsest.agent.turn_compression import TurnCompression
from palimpsest.agent.turn_context import END, TurnInput, TurnResult
from palimpsest.agent.turn_tools import TurnTools
from palimpsest.shared.context_view import sliced_for_size_check
from palimpsest.shared.errors import PalimpsestError, Unavailable
from palimpsest.shared.ollama import ChatResult, ContextRefused
from palimpsest.v1 import common_pb2
from palimpsest.v1 import compressor_pb2 as cpb
from palimpsest.v1 import session_store_pb2 as store_pb

log = logging.getLogger("palimpsest.agent")

Message = common_pb2.Message

# The session a turn is working for. A sub-agent sets it for its own run and restores the
# parent's in `finally`, so nothing after it (the parent's next iteration, background work)
# ever sees a sub-agent's session.
current_session: contextvars.ContextVar[str] = contextvars.ContextVar("current_session", default="")


class Turn(TurnTools, TurnCompression, TurnBase):
    """One user message answered: built from a ``TurnContext`` by the Agent's servicer (RunStream,
    Run) or by ``run_subagent`` (RunEphemeral, spawn_agent), run once with ``run``, then (stored
    sessions) ``post_turn``.

    A turn holds the session's conversation (``conv``: stored, or ephemeral for a sub-agent), what
    it runs on (``on``: profile, model, window, tools; a tool may switch the profile mid-turn), and a
    sink that receives every event.
    ``run`` always ends in ``stream_end`` (except for a sub-agent, whose parent reports it): every
    failure becomes an error event, and what was already said is stored as a partial answer.
    The servicer serialises turns per session and sets ``stop`` when the client stops one or leaves.
    Its state and helpers are TurnBase's; the tool and compression sides TurnTools' and
    TurnCompression's.
    """

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
            else:
                await self.prune_loop_results(iteration)
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

"""One turn of the agent: pre-turn compression, then the tool loop against Ollama, then the
post-turn check. Events go to the turn's sink as they happen; nothing here knows about gRPC
streams, so RunStream, Run and RunEphemeral all drive the same code."""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import time
import uuid
from collections.abc import Sequence

from google.protobuf import struct_pb2

from palimpsest.v1 import agent_pb2, common_pb2, compressor_pb2 as cpb, session_store_pb2 as store_pb
from services.agent import context_builder as cb
from services.agent.audit import Recording
from services.agent.context_builder import ContextBuilder
from services.agent.conversation import EphemeralConversation, StoredConversation
from services.agent.overflow import REFUSAL_RETRIES, halve_biggest_tool_result, refused_answer
from services.agent.images import ImageTarget, user_messages
from services.agent.mcp_servers.manager import named
from services.agent.stream_guard import StreamStopped, StreamTimeout, guarded, read_rest_in_background
from services.agent.titles import TITLE_TIMEOUT_S, clean_title, title_first_words, title_request
from services.agent.tools.base import SpawnRequest, ToolContext, ToolResult, TurnState, confined, schema
from services.agent.tools.registry import execute, tools_for
from services.agent.client_tools import ClientTool
from services.agent.turn_context import (
    END,
    SubagentOptions,
    TurnContext,
    TurnInput,
    TurnResult,
)
from services.shared.context_view import (
    heuristic_tokens,
    heuristic_view,
    message_budget,
    sliced_for_size_check,
    to_ollama_messages,
    view_chars,
)
from services.shared.auth import as_service
from services.shared.errors import Aborted, FailedPrecondition, PalimpsestError, Unavailable
from services.shared.ollama import ChatResult, ContextRefused, OllamaClient
from services.shared import metrics
from services.shared.reports import counted_exactly, judge
from services.shared.settings import Settings
from services.shared.structs import to_struct

log = logging.getLogger("palimpsest.agent")

Message = common_pb2.Message

# The session a turn is working for. A sub-agent sets it for its own run and restores the
# parent's in `finally`, so nothing after it (the parent's next iteration, background work)
# ever sees a sub-agent's session.
current_session: contextvars.ContextVar[str] = contextvars.ContextVar("current_session", default="")
# (profile, model, window asked for) already warned of as more than the model was trained on.
_WINDOWS_WARNED: set[tuple[str, str, int]] = set()

MAX_SPAWN_DEPTH = 2
PREVIEW_CHARS = 400
# How a count was made, as usage events name it.
COUNT_METHODS = {
    cpb.ESTIMATE_METHOD_EXACT: "exact",
    cpb.ESTIMATE_METHOD_CALIBRATED: "calibrated",
    cpb.ESTIMATE_METHOD_BASELINE_DELTA: "calibrated",
    cpb.ESTIMATE_METHOD_FALLBACK: "heuristic",
}
# The answer was streamed but could not be stored: say so, and where its text still is.
NOT_STORED = ("The answer above was not stored in the session: {cause}. Its full text is in this stream's "
              "stream_end; copy it from there, or ask again once the SessionStore is back.")
# The result of a call a stop came before (every call gets one, so the context stays valid).
NOT_RUN = ToolResult(content="[not run: the turn was stopped]", is_error=True, untrusted=False,
                     metadata={"stopped": True})
TOO_LARGE_ANSWER = (
    "This conversation no longer fits the model's context window (about {tokens} tokens of a "
    "{limit}-token budget), even after compression. Start a new session, or run /compact and try again."
)


class StalePrompt(Exception):
    """The session changed under the turn (another writer) while the prompt was on its way."""


class StoringTask:
    """Messages being appended in the background; awaitable any number of times. `stale` says
    the append found the session changed by someone else (the conversation reloaded first)."""

    def __init__(self, conv: StoredConversation | EphemeralConversation, messages: Sequence[Message]) -> None:
        self._reloads = conv.reloads
        self._conv = conv
        self._task = asyncio.ensure_future(conv.append(messages))

    def __await__(self):
        return self._task.__await__()

    @property
    def stale(self) -> bool:
        return self._conv.reloads != self._reloads


def answer_message(reply: ChatResult, **fields) -> Message:
    """A model call's answer as stored: what it said and thought, the seconds it took and the tokens
    the model generated for it (a size check later replaces that count with the message's own
    count by the model's tokenizer, with its digest)."""
    return Message(role="assistant", content=reply.content, thinking=reply.thinking,
                   elapsed_seconds=reply.elapsed_seconds, token_count=reply.eval_count or 0, **fields)


def tool_metadata(outcome: ToolResult) -> struct_pb2.Struct:
    """What a tool said about its result besides the text, kept with the result."""
    return to_struct({**outcome.metadata, **({"is_error": True} if outcome.is_error else {})})


class Turn:
    """One user message answered: built by the Agent's servicer (RunStream, Run) or by
    ``run_subagent`` (RunEphemeral, spawn_agent), run once with ``run``, then (stored sessions) ``post_turn``.

    A turn holds the session's conversation (``conv``: stored, or ephemeral for a sub-agent), the
    profile it runs under (switchable by a tool mid-turn), and a sink that receives every event.
    ``run`` always ends in ``stream_end`` (except for a sub-agent, whose parent reports it): every
    failure becomes an error event, and what was already said is stored as a partial answer.
    The servicer serialises turns per session and sets ``stop`` when the client stops one or leaves.
    """

    def __init__(self, ctx: TurnContext):
        self.ctx = ctx
        self.deps = deps = ctx.deps
        self.conv = conversation = ctx.conversation
        self.profile = profile = ctx.profile  # switched by a tool mid-turn (switch_profile)
        self.sink = ctx.sink
        self.metadata = ctx.metadata
        self.facts = facts = ctx.facts
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
        self.clamped_out: list[str] = []  # the tools the clamp took away
        self.stop = asyncio.Event()
        self.state = TurnState()
        self.requested_window = profile.window(deps.settings.ollama_num_ctx)
        self.window = facts.usable_window(self.requested_window)
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
        self._load_tools()

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

    def _load_tools(self) -> None:
        names = self.profile.tools_for_subagent if self.is_subagent else self.profile.agent_tools
        excluded = set(self.exclude_tools)
        if self.depth >= MAX_SPAWN_DEPTH:
            excluded.add("spawn_agent")
        # The profile's MCP tools as their servers list them now, kept for the whole turn (the tool
        # block leads the prompt Ollama reuses); a sub-agent gets those its tools list names.
        mcp = self.deps.mcp.tools_for(self.profile) if self.deps.mcp is not None else {}
        self.tools = tools_for(names, self.profile.custom_tools, excluded,
                               mcp=named(mcp, names) if self.is_subagent else mcp)
        self.tools.update((tool.name, tool) for tool in self.client_tools)  # the turn's own, after the profile's
        if self.clamped:
            self.clamped_out = [name for name, tool in self.tools.items() if not confined(tool)]
            self.tools = {name: tool for name, tool in self.tools.items() if confined(tool)}

    async def _settle_mcp(self) -> bool:
        """Whether the profile has MCP servers; those still on their first try to connect (the Agent
        just started, or the profiles file just added them) are waited for, each at most its
        timeout, so that their tools are in the tool set loaded next."""
        if self.deps.mcp is None or not self.profile.mcp_servers:
            return False
        await self.deps.mcp.settle(self.profile)
        return True

    def _system_prompt(self) -> str:
        if self.system_prompt_override is not None:
            return self.system_prompt_override
        return self.deps.builder.system_prompt(self.profile, subagent=self.is_subagent)

    def _keep_recent(self) -> int:
        return self.profile.compression_keep_recent or self.settings.keep_recent

    def _compression_on(self) -> bool:
        return self.stored and self.settings.compression_enabled and self.profile.compression_enabled

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

    def _announce_model(self) -> None:
        """The model and the window the turn runs in; a profile asking for more than the model was
        trained on is told (Ollama would clamp it silently, and the meter would show a window that
        is not there)."""
        requested = self.requested_window if self.requested_window > self.window else 0
        if requested and (self.profile.id, self.profile.model, requested) not in _WINDOWS_WARNED:
            _WINDOWS_WARNED.add((self.profile.id, self.profile.model, requested))  # the event tells every turn
            log.warning("profile %s asks for a %d-token window; %s was trained on %d: the turn uses %d",
                        self.profile.id, requested, self.profile.model, self.window, self.window)
        self.sink.model_info(self.profile.model, self.window, requested)

    async def _run(self, turn_input: TurnInput) -> TurnResult:
        self._announce_model()
        self.cwd = turn_input.cwd or self.cwd
        reload = await self._settle_mcp()  # the servers' tools as of the turn's start, not of its request
        if turn_input.client_tools:
            self.client_tools = list(turn_input.client_tools)
            self.client_tool_timeout_s = turn_input.client_tool_timeout_s or self.client_tool_timeout_s
            reload = True
        if reload:
            self._load_tools()
        if self.conv.session is None and self.stored:
            await self.conv.load()
        if self.ctx.session_changes and self.stored:
            await self.conv.update(**self.ctx.session_changes)
        self.state.goal = turn_input.text
        messages = await user_messages(ImageTarget(
            session_id=self.session_id, stored=self.stored, store=self.deps.store, compressor=self.deps.compressor,
            model=self.profile.model, window=self.window, settings=self.profile.compression_settings(),
            image_fallback=self.settings.image_tokens_fallback,
            # (only pictures need the context's count: the rest of the time nothing is built for it)
            preamble=self._prompt_head() if turn_input.images else (),
            tool_schemas=self._tool_schemas_json() if turn_input.images else ()),
            turn_input.text, turn_input.images, turn_input.hidden, turn_input.files)
        if self.stored and not turn_input.hidden:
            await self._name_session(turn_input.text)
        recalled = await self._recall(turn_input.text)
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
                if isinstance(prepared, TurnResult):
                    return prepared
                built, check, storing = prepared
                try:
                    reply = await self._call_model(built, storing)
                    break
                except StalePrompt:  # nothing reached the client: the same call, built from what is stored
                    prepared = await self._prepare(iteration, stalled)
                except ContextRefused as exc:  # proven over the window: shrunk and sent once more, or the end
                    refusals += 1
                    prepared = await self._after_refusal(exc, built, check, iteration, refusals)
                except StreamStopped:
                    await self._save_partial("stopped")
                    return self._end(END.STREAM_END_REASON_STOPPED, self.result.text)
                except (StreamTimeout, PalimpsestError) as exc:
                    await self._save_partial("error")
                    code = "DEADLINE_EXCEEDED" if isinstance(exc, StreamTimeout) else exc.code.name
                    self.sink.error(code, str(exc))
                    return self._end(END.STREAM_END_REASON_ERROR, self.result.text)
            self._partial: ChatResult | None = None  # from here on the reply is saved, never as a partial
            through_seq = self.conv.through_seq  # the stored rows this prompt carries
            report = self._report(reply, check, built, through_seq)
            # The meter first: it is the call's, known once its report is judged, and on its way to
            # the client while the answer is stored (after the store, its write to the client was
            # one more step between the last token and stream_end).
            await self._record_usage(reply, check, built, through_seq, report)
            if not reply.tool_calls:
                if not await self._store_answer(reply, report):
                    return self._end(END.STREAM_END_REASON_ERROR, reply.content)
                return self._end(END.STREAM_END_REASON_COMPLETED, reply.content)
            calls = await self._save_tool_calls(reply, report)
            await self._run_tools(calls)
            if self.stop.is_set():
                return self._end(END.STREAM_END_REASON_STOPPED, self.result.text)
            if self.state.todo_progress > progress_seen:
                progress_seen, stalled = self.state.todo_progress, 0
            else:
                stalled += 1
            if self.state.switched_profile:
                await self._switch_profile(self.state.switched_profile)
        return self._end(END.STREAM_END_REASON_MAX_ITERATIONS, self.result.text)

    async def _prepare(self, iteration: int, stalled: int
                       ) -> tuple[list[Message], cpb.CheckContextSizeResponse, StoringTask | None] | TurnResult:
        """The prompt for the next call, sized by the Compressor (compressed first when it says
        so, cut where it says), or the turn's end when even that cannot fit. This turn's user
        message may still be on its way to the store when the prompt fits (see _call_model)."""
        if self._noted_iteration != iteration:  # a call made again (StalePrompt) has its notes
            self._noted_iteration = iteration
            self._pending.extend(cb.note_messages(self._notes(iteration, stalled)))
        built = self._build(self._pending)
        storing = self._store_pending()
        try:
            check = await self._check_size(built, iteration)
        except BaseException:
            if storing is not None:
                await storing  # both finished; the store's failure speaks first
            raise
        if storing is not None and check.decision != cpb.SIZE_DECISION_FITS:
            await storing  # compression and the too-large answer start from what is stored
            if storing.stale:  # someone else wrote in between: build from what is stored
                built = self._build()
                check = await self._check_size(built, iteration)
            storing = None
        if check.decision == cpb.SIZE_DECISION_COMPRESS_FIRST:
            # Pre-turn (first call) or mid-turn (later calls): the Compressor decided on its own
            # count and its dry run, so compression_started never lies. Then one more check,
            # which no longer offers compression: fits, cut further, or too large.
            reason = cpb.COMPRESSION_REASON_PRETURN if iteration == 0 else cpb.COMPRESSION_REASON_MIDTURN
            if await self._compress(reason, check.tokens, check.compress_keep_recent_messages):
                built = self._build()
            check = await self._check_size(built, iteration, decide=False)
        if check.decision != cpb.SIZE_DECISION_FITS:
            return await self._too_large(TOO_LARGE_ANSWER.format(tokens=check.tokens, limit=check.limit))
        return cb.apply_cuts(built, check.cuts), check, storing

    async def _too_large(self, answer: str) -> TurnResult:
        """The turn's end when its prompt cannot fit: the answer says why, and is kept in the session."""
        await self.conv.append([Message(role="assistant", content=answer)])
        self.sink.text(answer)
        return self._end(END.STREAM_END_REASON_CONTEXT_TOO_LARGE, answer)

    async def _after_refusal(self, refusal: ContextRefused, sent: list[Message], check: cpb.CheckContextSizeResponse,
                             iteration: int, refusals: int
                             ) -> tuple[list[Message], cpb.CheckContextSizeResponse, None] | TurnResult:
        """The call again after Ollama refused its prompt as over the window: compressed first (the
        refusal proves the count low, so any gain will do), else with its largest tool result cut to
        half; refused again, or nothing to shrink, the turn ends explained (never Ollama's raw error)."""
        log.warning("Ollama refused the prompt of %s as over its %d-token window (counted %d): %s",
                    self.session_id or "a sub-agent", self.window, check.tokens, refusal)
        if refusals > REFUSAL_RETRIES:
            return await self._too_large(refused_answer(self.window, self.requested_window, self._shrunk_by))
        view, shrunk_by = sent, []
        if self._compression_on():
            before = len(self.conv.context)
            reason = cpb.COMPRESSION_REASON_PRETURN if iteration == 0 else cpb.COMPRESSION_REASON_MIDTURN
            # Over the window whatever our count said: the Compressor takes any gain.
            if await self._compress(reason, max(check.tokens, self.window + 1), self._keep_for(iteration)) \
                    and len(self.conv.context) < before:
                shrunk_by.append("compressing the conversation")
                built = self._build()
                check = await self._check_size(built, iteration, decide=False)
                if check.decision != cpb.SIZE_DECISION_FITS:
                    return await self._too_large(TOO_LARGE_ANSWER.format(tokens=check.tokens, limit=check.limit))
                view = cb.apply_cuts(built, check.cuts)
        # Also when compressed: the refusal proves our count low by an unknown amount, and a freed
        # turn or two (priced by that same count) may not be enough for the one retry there is.
        halved = halve_biggest_tool_result(view)
        if halved is not None:
            shrunk_by.append("cutting its largest tool result to half")
            check = await self._check_size(halved, iteration, decide=False)
            view = cb.apply_cuts(halved, check.cuts)
        if not shrunk_by:
            return await self._too_large(refused_answer(self.window, self.requested_window, ""))
        self._shrunk_by = " and ".join(shrunk_by)
        return view, check, None

    def _build(self, pending: Sequence[Message] = ()) -> list[Message]:
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

    def _notes(self, iteration: int, stalled: int) -> list[str]:
        """What this call is reminded of. Each note is stored where it is given (see note_messages):
        the next call's prompt then begins with this one's, which Ollama reuses instead of
        evaluating it again."""
        p = self.profile
        notes = []
        left = self.max_iterations - iteration - 1
        # From the second call on (the first ends with the user's words), or when few are left.
        if p.iteration_budget_enabled and (iteration > 0 or left <= 1):
            notes.append(cb.iteration_budget_note(iteration, self.max_iterations))
        if p.goal_anchoring_enabled and iteration > 0 and iteration % max(1, p.goal_anchoring_interval) == 0:
            notes.append(cb.goal_anchor_note(self.state.goal))
        if p.anti_stall_enabled and stalled >= p.anti_stall_threshold:
            notes.append(cb.anti_stall_note(stalled))
        return notes

    async def _switch_profile(self, profile_id: str) -> None:
        self.state.switched_profile = ""
        self.profile = self.deps.profiles.get(profile_id)
        self.facts = await self.deps.ollama.model_facts(self.profile.model)  # its capabilities, not the last's
        self.deps.builder.invalidate(profile_id)
        self.requested_window = self.profile.window(self.settings.ollama_num_ctx)
        self.window = self.facts.usable_window(self.requested_window)
        await self._settle_mcp()
        self._load_tools()
        self._announce_model()

    # -- the model call --------------------------------------------------------------------------
    async def _check_size(self, built: list[Message], iteration: int, *,
                          decide: bool = True) -> cpb.CheckContextSizeResponse:
        """The one question before a model call, answered by the Compressor: the view to send, its
        count, and fits / compress first / too large. While the Compressor is away the turn goes on
        uncompressed, its view cut at the fixed heuristic rate, and the client is told once."""
        try:
            return await self.deps.compressor.CheckContextSize(cpb.CheckContextSizeRequest(
                model=self.profile.model, messages=sliced_for_size_check(built), window=self.window,
                session_id=self.session_id,
                settings=self.profile.compression_settings(), tool_schemas=self._tool_schemas_json(),
                keep_recent_messages=self._keep_for(iteration),
                decide_compression=decide and self._compression_on()))
        except Unavailable as exc:
            if not self._compressor_away:
                self._compressor_away = True
                log.warning("turn in %s goes on without the Compressor: %s", self.session_id or "-", exc)
                self.sink.error("UNAVAILABLE", f"{exc}; this turn goes on without compression or exact counts")
            return self._unchecked(built)

    def _unchecked(self, built: list[Message]) -> cpb.CheckContextSizeResponse:
        """A size check without the Compressor: oversized messages cut at the heuristic rate, sent."""
        view = heuristic_view(built, message_budget(self.window, self.settings.message_token_budget))
        return cpb.CheckContextSizeResponse(
            fits=True, decision=cpb.SIZE_DECISION_FITS, method=cpb.ESTIMATE_METHOD_FALLBACK,
            tokens=heuristic_tokens(view_chars(view)), limit=self.window,
            cuts=[cpb.ViewCut(index=i, content=v.content) for i, (m, v) in enumerate(zip(built, view)) if v is not m])

    def _tool_schemas(self) -> list[dict] | None:
        return [schema(t) for t in self.tools.values()] if self.facts.tools and self.tools else None

    def _tool_schemas_json(self) -> list[str]:
        return [json.dumps(s, ensure_ascii=False) for s in self._tool_schemas() or ()]

    def _request_body(self, built: list[Message]) -> dict:
        messages = to_ollama_messages(built)
        if not self.facts.vision:
            for m in messages:
                m.pop("images", None)
        think = None
        if self.facts.thinking:
            think = self.profile.think_enabled
        return OllamaClient.chat_body(self.profile.model, messages, num_ctx=self.window, tools=self._tool_schemas(),
                                      think=think)

    def _store_pending(self) -> StoringTask | None:
        """This turn's user message on its way to the store, while the first size check runs and
        the model starts reading the prompt: the fewest waits before the first token."""
        if not self._pending:
            return None
        storing = StoringTask(self.conv, self._pending)
        self._pending = []
        return storing

    async def _call_model(self, built: list[Message], storing: StoringTask | None = None) -> ChatResult:
        """Stream one model call to the client. With `storing`, the user's message is still on its
        way to the store: nothing reaches the client, and nothing else is written, before it is
        stored. If storing fails, the call is dropped and the store's error ends the turn; if it
        found the session changed by another writer, the call is dropped as StalePrompt."""
        reply = ChatResult()
        self._partial = reply
        started = time.monotonic()
        try:
            await self._stream_reply(built, reply, storing)
        finally:
            if storing is not None:
                await storing
        reply.elapsed_seconds = time.monotonic() - started
        return reply

    async def _stream_reply(self, built: list[Message], reply: ChatResult, storing: StoringTask | None) -> None:
        thinking_open = False
        stream = self.deps.ollama.chat_stream(self._request_body(built))
        chunks = guarded(stream, first_chunk_timeout=self.settings.stream_first_chunk_timeout,
                         chunk_timeout=self.settings.stream_chunk_timeout, stop=self.stop)
        done = False
        try:
            async for chunk in chunks:
                if storing is not None:
                    await storing
                    if storing.stale:
                        raise StalePrompt
                    storing = None
                message = chunk.get("message") or {}
                if message.get("thinking"):
                    thinking_open = True
                    self.sink.thinking(message["thinking"])
                if thinking_open and (message.get("content") or message.get("tool_calls") or chunk.get("done")):
                    thinking_open = False
                    self.sink.thinking_end()
                if message.get("content"):
                    self.sink.text(message["content"])
                reply.absorb(chunk)
                self.result.text = reply.content
                if chunk.get("done"):  # Ollama's last chunk: the reply is whole
                    done = True
                    break
        finally:
            if done:  # the response's end is read off the turn's path, so its connection is kept
                read_rest_in_background(chunks)
            else:  # an error in here closes the HTTP stream at once
                await chunks.aclose()
        if storing is not None:  # a stream without a single chunk: the prompt must still not be stale
            await storing
            if storing.stale:
                raise StalePrompt
        if reply.model and reply.model != self.profile.model:
            self.sink.model_info(reply.model, self.window)

    async def _store_answer(self, reply: ChatResult, report: store_pb.ModelReport) -> bool:
        """The turn's answer, stored exactly once with the call's report: retried under one
        idempotency key while the store does not answer, until the reply-write deadline. False (and
        the client told) if it was not."""
        try:
            await self.conv.append([answer_message(reply)],
                                   retry_for=self.settings.reply_write_deadline_s,
                                   attempt_timeout=self.settings.rpc_timeout_s, report=report)
            return True
        except PalimpsestError as exc:
            log.error("the answer of session %s was not stored: %s", self.session_id, exc)
            self.sink.error(exc.code.name, NOT_STORED.format(cause=exc))
            return False

    async def _save_partial(self, why: str) -> None:
        partial = getattr(self, "_partial", None)
        if partial is None or not (partial.content or partial.thinking):
            return
        message = Message(role="assistant", content=partial.content, thinking=partial.thinking)
        message.metadata.update({"partial": True, "ended": why})
        try:
            await self.conv.append([message])
        except PalimpsestError:
            log.exception("could not save the partial answer of session %s", self.session_id)
        self._partial = None

    def _report(self, reply: ChatResult, check: cpb.CheckContextSizeResponse, built: list[Message],
                through_seq: int) -> store_pb.ModelReport:
        """The call's report as the append of its answer carries it (one write before stream_end):
        judged by the rules the Compressor's RecordBaseline applies, with the counts its size check
        made and the context's size for the meter."""
        report = store_pb.ModelReport(context_token_count=check.tokens, token_digest=check.token_digest,
                                      token_counts=check.new_counts)
        self.last_trigger = check.trigger
        self.prompt_cut = False
        if not reply.prompt_eval_count or not self.stored:
            return report  # (a sub-agent's report goes to RecordBaseline, which judges it: _record_usage)
        # The prompt's characters only for a report of a prompt not counted exactly: summed over the
        # whole prompt they stood between the model's last token and stream_end for nothing.
        sent_chars, had_images = (0, False) if counted_exactly(check.method, check.shape) else \
            (view_chars(built), any(m.images for m in built))
        verdict = judge(reply.prompt_eval_count, model=self.profile.model, method=check.method, shape=check.shape,
                        window=self.window, sent_chars=sent_chars, had_images=had_images)
        metrics.model_report(verdict, method=check.method, counted=check.tokens, reported=reply.prompt_eval_count)
        if verdict.problem:
            log.warning("the model's report for %s is not kept: %s", self.session_id or "-", verdict.problem)
        elif verdict.prompt_cut:
            # Ollama evaluated fewer tokens than the content alone has: it cut the prompt. The
            # session is flagged for the post-turn pass; the meter keeps our own count.
            report.prompt_cut = self.prompt_cut = True
            log.warning("cut prompt: Ollama reported %d tokens, the content alone is %d (session %s)",
                        reply.prompt_eval_count, check.shape.content_tokens, self.session_id or "-")
        elif verdict.learned:
            report.baseline.CopyFrom(store_pb.Baseline(tokens=reply.prompt_eval_count, through_seq=through_seq,
                                                       model=self.profile.model))
            if verdict.observation is not None:
                report.observation.CopyFrom(verdict.observation)
            report.context_token_count = reply.prompt_eval_count
        return report

    async def _record_usage(self, reply: ChatResult, check: cpb.CheckContextSizeResponse, built: list[Message],
                            through_seq: int, report: store_pb.ModelReport) -> None:
        """The meter after a call. A stored session's report goes with the append of the answer; a
        sub-agent's (nothing stored) still teaches the model's calibration through RecordBaseline."""
        reported = report.HasField("baseline")
        if not self.stored and reply.prompt_eval_count:
            try:
                with as_service():  # a model report teaches every session of the model: the services' own
                    recorded = await self.deps.compressor.RecordBaseline(cpb.RecordBaselineRequest(
                        model=self.profile.model, prompt_eval_count=reply.prompt_eval_count, sent_tokens=check.tokens,
                        sent_chars=view_chars(built), had_images=any(m.images for m in built), window=self.window,
                        shape=check.shape, method=check.method))
                reported = recorded.recorded
            except PalimpsestError as exc:  # the answer is there; a lost report only costs precision
                log.warning("could not record the report of a sub-agent of %s: %s", self.parent_session_id, exc)
        tokens = reply.prompt_eval_count if reported and reply.prompt_eval_count else check.tokens
        self.last_prompt_tokens = tokens
        metrics.model_call(reply.prompt_eval_count or 0, reply.eval_count or 0)
        self.sink.usage(tokens, self.window, reply.prompt_eval_count or 0, reply.eval_count or 0,
                        "reported" if reported else COUNT_METHODS.get(check.method, "heuristic"))

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
            profile=self.profile,
            settings=self.settings,
            events=self.sink,
            state=self.state,
            window=self.window,
            is_subagent=self.is_subagent,
            untrusted=self.conv.untrusted,
            spawn=self._spawn if self.spawner is not None and self.depth < MAX_SPAWN_DEPTH else None,
            update_session=self.session_writer,
            conversation=list(self.conv.context),
            tool_schemas=[schema(t) for t in self.tools.values()],
        )

    async def _save_tool_calls(self, reply: ChatResult, report: store_pb.ModelReport) -> list[common_pb2.ToolCall]:
        calls = []
        for i, raw in enumerate(reply.tool_calls):
            fn = raw.get("function") or {}
            arguments = fn.get("arguments") or {}
            calls.append(common_pb2.ToolCall(
                id=raw.get("id") or f"call_{i}", name=fn.get("name", ""),
                arguments_json=json.dumps(arguments) if not isinstance(arguments, str) else arguments))
        await self.conv.append([answer_message(reply, tool_calls=calls)], report=report)
        return calls

    async def _run_tools(self, calls: list[common_pb2.ToolCall]) -> None:
        results: list[Message] = []
        extra: list[Message] = []
        for call in calls:
            if self.stop.is_set():
                # Every call gets a result, so the context stays valid for the next turn.
                results.append(Message(role="tool", name=call.name, tool_call_id=call.id, content=NOT_RUN.content))
                self._audit(call).end(NOT_RUN, 0.0)
                continue
            outcome, elapsed = await self._run_tool(call)
            if outcome.untrusted:
                # At once, not after the batch: the next call in it is judged tainted.
                await self.taint()
            result = Message(role="tool", name=call.name, tool_call_id=call.id, content=outcome.content,
                             images=outcome.images, files=outcome.files, is_compression_critical=outcome.critical,
                             elapsed_seconds=elapsed, metadata=tool_metadata(outcome))
            results.append(result)
            if "plan" in outcome.metadata:
                extra.append(Message(role="assistant", content=outcome.metadata["plan"], is_plan=True))
        await self.conv.append(results + extra)
        if self.state.todo_changed:
            self.state.todo_changed = False
            self.sink.todo_updated(list(self.state.todo))

    def _audit(self, call: common_pb2.ToolCall) -> Recording:
        """The run of `call` on the session's audit log (a sub-agent's: its parent's), from now on."""
        return self.conv.tool_runs.start(call, turn_id=self.sink.turn_id, is_subagent=self.is_subagent)

    async def _run_tool(self, call: common_pb2.ToolCall) -> tuple[ToolResult, float]:
        """The tool's result and the seconds it ran, recorded on the audit log (a run cut short too)."""
        self.sink.tool_started(call.id, call.name, call.arguments_json)
        started = time.monotonic()
        audited = self._audit(call)
        tool = self.tools.get(call.name)
        if tool is None and call.name in self.clamped_out:
            outcome = ToolResult(content=f"{call.name} is not available to this sub-agent: the session it works for "
                                         "has taken in outside content, so its sub-agents keep only "
                                         f"{', '.join(self.tools) or 'no tools'}.", is_error=True, untrusted=False,
                                 metadata={"refused": "untrusted content"})
        elif tool is None:
            outcome = ToolResult(content=f"Unknown tool {call.name!r}. Available: {', '.join(self.tools)}",
                                 is_error=True, untrusted=False)
        else:
            try:
                args = json.loads(call.arguments_json or "{}")
            except ValueError:
                args = None
            if not isinstance(args, dict):
                outcome = ToolResult(content=f"Arguments for {call.name} must be a JSON object", is_error=True,
                                     untrusted=False)
            else:
                outcome = await execute(tool, args, self.tool_context(call.id))
        elapsed = time.monotonic() - started
        audited.end(outcome, elapsed)
        self.sink.tool_finished(call.id, call.name, outcome.content[:PREVIEW_CHARS], outcome.is_error, elapsed)
        return outcome, elapsed

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
        result = await self.spawner(self.deps, request, sink=self.sink.for_subagent(), metadata=self.metadata,
                                    untrusted=self.conv.untrusted, depth=self.depth + 1,
                                    parent_profile=self.profile, session_writer=self.session_writer,
                                    taint_parent=self.taint, cwd=self.cwd, parent_stop=self.stop,
                                    sandbox_pinned=self.sandbox_pinned, tool_runs=self.conv.tool_runs)
        return result.text, result.completed_normally

    # -- compression -----------------------------------------------------------------------------
    async def _compress(self, reason: cpb.CompressionReason, current_tokens: int, keep_recent_messages: int = 0) -> bool:
        """Run one compression, forwarding its events; a failure is logged and the turn goes on."""
        committed = 0
        try:
            async for event in self.deps.compressor.Compress(cpb.CompressRequest(
                    session_id=self.session_id, reason=reason, model=self.profile.model, window=self.window,
                    keep_recent_messages=keep_recent_messages, settings=self.profile.compression_settings(),
                    current_tokens=current_tokens, expected_revision=self.conv.revision,
                    prompt_head=self._prompt_head(), tool_schemas=self._tool_schemas_json())):
                self.sink.compression(event)
                if event.HasField("compressed"):
                    committed = event.compressed.revision
        except Aborted:
            raise
        except FailedPrecondition:  # nothing to compress: not a failure
            return False
        except PalimpsestError as exc:
            log.warning("compression (%s) failed for %s: %s", reason, self.session_id, exc)
            return False
        await self.conv.load()
        if committed and self.conv.revision != committed:
            raise Aborted(f"another writer changed session {self.session_id} right after its compression")
        return True

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
        await self._title_session()
        if not self._compression_on() or self.result.reason == END.STREAM_END_REASON_UNSPECIFIED:
            return
        if self.last_trigger and self.last_prompt_tokens < self.last_trigger and not self.prompt_cut \
                and not self.conv.flagged_cut:
            return  # the last prompt was under the trigger and whole: the Compressor would say so
        try:
            async for event in self.deps.compressor.Compress(cpb.CompressRequest(
                    session_id=self.session_id, reason=cpb.COMPRESSION_REASON_POSTTURN, model=self.profile.model,
                    window=self.window, keep_recent_messages=self._midturn_keep(), only_if_over_threshold=True,
                    current_tokens=self.last_prompt_tokens, settings=self.profile.compression_settings(),
                    prompt_head=self._prompt_head(), tool_schemas=self._tool_schemas_json())):
                self.sink.compression(event, watchers_only=True)  # after stream_end: for the session's watchers
                self.compressed_after = self.compressed_after or event.HasField("compressed")
        except FailedPrecondition:  # nothing to compress
            pass
        except PalimpsestError as exc:
            log.warning("post-turn compression failed for %s: %s", self.session_id, exc)

    async def _title_session(self) -> None:
        """The model's short title for a session this turn named by its first words, once its
        first answer is in. A failed call, an unusable answer or a rename meanwhile (the revision
        moved) keeps the first words."""
        answered = self.result.reason == END.STREAM_END_REASON_COMPLETED and self.result.text.strip()
        if not (self.first_words and answered and self.settings.session_titles):
            return
        try:
            async with asyncio.timeout(TITLE_TIMEOUT_S):
                reply = await self.deps.ollama.chat(title_request(self.profile.model, self.window, self.state.goal,
                                                                  self.result.text, self.facts.thinking))
        except (PalimpsestError, TimeoutError) as exc:
            log.info("no title for session %s (%s): its first words stay its name", self.session_id, exc)
            return
        title = clean_title(reply.content)
        if not title or title == self.first_words:
            return
        try:
            await self.conv.update(name=title)
        except PalimpsestError as exc:  # renamed (or written) by someone else meanwhile: theirs stands
            log.info("session %s not titled: %s", self.session_id, exc)
            return
        self.sink.announce(session_renamed=agent_pb2.SessionRenamed(name=title))

    # -- memory ----------------------------------------------------------------------------------
    async def _recall(self, text: str) -> list[Message]:
        """Up to k relevant excerpts of compressed-away history, each injected once per session, within
        their share of the window."""
        p = self.profile
        if not (self.stored and p.memory_recall_enabled and text.strip() and self.conv.has_summary()):
            return []
        # Excerpts stay in the context until the next compression: what earlier turns recalled
        # since then counts against the same share of the window.
        room = cb.recall_chars(self.window) - sum(len(m.content) for m in self.conv.context if m.is_recall)
        if room < cb.MIN_EXCERPT_CHARS:
            return []
        try:
            found = await self.deps.store.SearchMemory(store_pb.SearchMemoryRequest(
                session_id=self.session_id, query=text[:500], limit=max(1, p.memory_recall_k) * 3,
                min_similarity=p.memory_recall_min_similarity, embed_model=p.embed_model))
        except PalimpsestError as exc:
            log.warning("memory recall failed for %s: %s", self.session_id, exc)
            return []
        session = self.conv.session
        injected = session.metadata["injected_chunk_ids"] if session and "injected_chunk_ids" in session.metadata \
            else None
        seen = set(injected) if isinstance(injected, struct_pb2.ListValue) else set()
        fits = min(p.memory_recall_k, room // cb.MIN_EXCERPT_CHARS)  # each excerpt long enough to say something
        fresh = [c for c in found.chunks if float(c.id) not in seen][:fits]
        if not fresh:
            return []
        await self.conv.update(metadata={"injected_chunk_ids": sorted(seen | {float(c.id) for c in fresh})})
        return [cb.recall_message(fresh, text, room, untrusted=self.conv.untrusted)]

    async def _name_session(self, text: str) -> None:
        session = self.conv.session
        if session is not None and not session.name and text.strip():
            name = title_first_words(text)
            try:
                await self.conv.update(name=name)
            except PalimpsestError:
                log.warning("could not name session %s", self.session_id)
                return
            self.first_words = name
            self.sink.announce(session_renamed=agent_pb2.SessionRenamed(name=name))

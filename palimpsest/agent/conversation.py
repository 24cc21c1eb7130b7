"""Where a turn's messages live: a stored session (every write through the SessionStore, guarded by
the session's revision) or an ephemeral sub-agent context in memory."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

import grpc
from google.protobuf.message import Message as ProtoMessage

from palimpsest.agent.audit import ToolRunLog, store_tool_runs
from palimpsest.shared.auth import serving_credentials
from palimpsest.shared.errors import Aborted, InvalidArgument, PalimpsestError, PermissionDenied, Unavailable
from palimpsest.shared.session_reads import whole_context
from palimpsest.shared.structs import to_struct
from palimpsest.shared.stubs import AsyncStoreStub
from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as store_pb

R = TypeVar("R")  # a store call's reply

log = logging.getLogger("palimpsest.agent")

Message = common_pb2.Message
NUL, REPLACEMENT = "\x00", "\ufffd"


def retry_delay(attempt: int) -> float:
    """Seconds before retry `attempt` (0-based) of a write that must land: soon at first (a store
    restarting is back in a second or two), then every 2 s, never hammering one that is down."""
    return min(2.0, 0.2 * 2**attempt)


class TurnAppends:
    """A turn's appends over one SessionStore.AppendStream call. The first append opens it (the
    user's message, stored while the prompt is sized, off the model's path); the answer's append
    after the model's last token then travels on it without a call of its own (no new HTTP/2
    stream, no server interceptors: 0.55–0.65 ms less between the last token and stream_end, of
    2.7–3.5 ms p50, measured side by side). Called like the unary method it stands for, with
    requests that carry an idempotency key (``StoredConversation.append``'s): a request whose stream
    ended under it (a store replica stopping ends the streams between two appends) is sent once
    more on a new stream, as gRPC retries a unary call refused UNAVAILABLE. An append that fails
    otherwise or is not answered in time drops the stream; the caller's retry opens another."""

    # The turn's end waits this long for the store to close the call; then it goes regardless.
    CLOSE_WAIT_S = 1.0

    def __init__(self, store: AsyncStoreStub, metadata: tuple[tuple[str, str], ...]) -> None:
        self._store = store
        # Opened once with the services' vouch beside the caller's credentials: any append of the
        # turn may carry a model report, and a stream's metadata is fixed when it opens.
        self._metadata = metadata
        self._call: Any = None  # the open AppendStream call (its reads and writes raise PalimpsestErrors)
        self._caller: object = None  # the served caller's credentials the call was opened with
        self._closed = False  # after close(): each append a call of its own (the turn's later writes)
        self._lock = asyncio.Lock()  # one append in flight: the answers come in order

    @property
    def open(self) -> bool:
        """A call is open and, as far as this side knows, alive."""
        return self._call is not None and not self._call.done()

    async def __call__(
        self,
        request: store_pb.AppendMessagesRequest,
        *,
        metadata: tuple[tuple[str, str], ...] | None = None,
        timeout: float,
    ) -> store_pb.AppendMessagesResponse:
        async with self._lock:
            if self._closed or (self._call is not None and self._caller != serving_credentials()):
                # (an append for another caller than the stream's, e.g. under as_service(): its own call)
                return await self._store.AppendMessages(request, metadata=metadata, timeout=timeout)
            try:
                async with asyncio.timeout(timeout):
                    try:
                        return await self._exchange(request)
                    except PalimpsestError as exc:
                        # The stream had ended, or ended under the request (served once or not at
                        # all; gRPC may say INTERNAL for a call ended under it): once more, same key.
                        if not (isinstance(exc, Unavailable) or exc.code == grpc.StatusCode.INTERNAL):
                            raise
                        self._drop()
                        return await self._exchange(request)
            except TimeoutError:
                self._drop()
                raise Unavailable(f"the SessionStore did not answer an append within {timeout:g} s") from None
            except BaseException:
                self._drop()
                raise

    async def _exchange(self, request: store_pb.AppendMessagesRequest) -> store_pb.AppendMessagesResponse:
        """One send and its answer. Unavailable when the request never left (the call had ended:
        gRPC may report that under any status, INTERNAL among them) or the call ended before it
        was answered (served once or not at all)."""
        if self._call is None:
            self._call = self._store.AppendStream(metadata=self._metadata or None)
            self._caller = serving_credentials()
        call = self._call
        try:
            await call.write(request)
        except PalimpsestError as exc:
            raise Unavailable(f"the SessionStore's append stream had ended ({exc})") from None
        reply = await call.read()
        if reply is grpc.aio.EOF:
            raise Unavailable("the SessionStore ended the append stream")
        return reply

    def _drop(self) -> None:
        call, self._call = self._call, None
        if call is not None:
            call.cancel()

    async def close(self) -> None:
        """The turn's model calls are over: the call ends (OK) once the store has read to its end,
        or at once if that takes longer than CLOSE_WAIT_S (every append was answered: nothing is
        lost with it). A later append (the post-turn pass) is a call of its own."""
        self._closed = True
        try:
            async with self._lock:
                call, self._call = self._call, None
                if call is None:
                    return
                try:
                    async with asyncio.timeout(self.CLOSE_WAIT_S):
                        await call.done_writing()
                        await call.read()  # its end (EOF): the call is over on both sides
                except (PalimpsestError, TimeoutError) as exc:
                    log.info("an append stream ended without its close: %s", exc or "not closed in time")
                    call.cancel()
        except asyncio.CancelledError:  # (cancelled on its way out: the call goes at once)
            self._drop()
            raise


def conflict(exc: Aborted) -> Aborted:
    """A revision conflict in our caller's terms: what it means for a turn."""
    return Aborted(f"another turn changed this session at the same time: {exc}")


def storable(message: Message) -> Message:
    """The message with NUL characters (a tool that read a binary file, a model that emitted one)
    replaced by U+FFFD: the store refuses them, and a turn must not fail over its own output."""
    texts = (message.content, message.thinking, *(c.arguments_json for c in message.tool_calls))
    if not any(NUL in t for t in texts):
        return message
    copy = Message()
    copy.CopyFrom(message)
    copy.content = copy.content.replace(NUL, REPLACEMENT)
    copy.thinking = copy.thinking.replace(NUL, REPLACEMENT)
    for call in copy.tool_calls:
        call.arguments_json = call.arguments_json.replace(NUL, REPLACEMENT)
    return copy


class Conversation(Protocol):
    """Where a turn's messages live, as the turn and its stages see it: a stored session
    (``StoredConversation``) or a sub-agent's context in memory (``EphemeralConversation``). A turn
    writes through it alike; what an ephemeral one cannot do (a name, a count, a compression) it
    does as nothing, so the turn branches on ``ephemeral`` only where the outcome differs."""

    @property
    def ephemeral(self) -> bool: ...
    @property
    def session_id(self) -> str: ...  # "" for an ephemeral one
    @property
    def session(self) -> common_pb2.Session | None: ...  # the session as last read or written
    @property
    def context(self) -> list[Message]: ...  # the messages a prompt is built from
    @property
    def revision(self) -> int | None: ...
    @property
    def reloads(self) -> int: ...  # how often a stale start was reloaded (see StoringTask)
    @property
    def flagged_cut(self) -> bool: ...  # the store said the last prompt came back cut
    @property
    def tool_runs(self) -> ToolRunLog: ...
    @property
    def untrusted(self) -> bool: ...
    @property
    def through_seq(self) -> int: ...

    async def load(self) -> list[Message]: ...

    async def append(
        self,
        messages: Sequence[Message],
        *,
        retry_for: float = 0.0,
        attempt_timeout: float | None = None,
        report: store_pb.ModelReport | None = None,
    ) -> list[int]: ...

    async def done_appending(self) -> None: ...

    def forget(self) -> None: ...

    def snapshot(self) -> common_pb2.Session | None: ...

    async def update(self, **fields: Any) -> common_pb2.Session | None: ...

    async def set_token_count(self, tokens: int) -> None: ...

    async def mark_untrusted(self) -> None: ...

    def has_summary(self) -> bool: ...


class StoredConversation:
    """A persistent session. Writes carry the revision this turn last saw: a second writer is
    refused (ABORTED) instead of interleaving with us."""

    ephemeral = False

    def __init__(
        self, store: AsyncStoreStub, session_id: str, vouch: Iterable[tuple[str, str]] = (), timeout: float = 30.0
    ) -> None:
        self.store = store
        self.session_id = session_id
        self.vouch = tuple(vouch)  # the services' vouch for what only they may write (a model report)
        self.timeout = timeout  # an attempt at a write, unless its caller gives one (PALIMPSEST_RPC_TIMEOUT_SECONDS)
        self.revision: int | None = None
        self.session: common_pb2.Session | None = None
        self.context: list[Message] = []
        # Started from the copy the Agent kept after the last turn: a write refused as stale reloads
        # from the store and tries once more (someone else wrote in between).
        self.from_cache = False
        self.reloads = 0  # how often a stale start was reloaded: a prompt built before is stale too
        self.flagged_cut = False  # the store said the last prompt came back cut (a report's append)
        # The seq the store gives the next message: an append guarded by our revision still goes
        # ahead when only the session's other fields changed meanwhile (a rename, a pin, a taint).
        self.next_seq: int | None = None
        self.warm_worthy = True  # False once what we hold of the session could not be refreshed
        self.appends = TurnAppends(store, self.vouch)
        # The turn's tool runs (its sub-agents' too) until an append carries them to the audit log,
        # and the seq of the stored message that carries each tool call (its record names it).
        self.tool_runs = ToolRunLog()
        self.call_seqs: dict[str, int] = {}

    async def _call(
        self, method: Callable[..., Awaitable[R]], request: ProtoMessage, timeout: float | None = None
    ) -> R:
        # A model report or tool runs ride with the caller's credentials (the interceptor's) and the
        # services' vouch.
        metadata = (
            self.vouch
            if isinstance(request, store_pb.AppendMessagesRequest) and (request.HasField("report") or request.tool_runs)
            else ()
        )
        try:
            return await method(request, metadata=metadata or None, timeout=timeout)
        except Aborted as exc:
            raise conflict(exc) from None

    async def load(self) -> list[Message]:
        return self.adopt(await whole_context(self.store.GetSession, self.session_id))

    def adopt(self, session: common_pb2.Session) -> list[Message]:
        """Take a session (CONTEXT view) already loaded by the caller."""
        self.session = session
        self.revision = session.revision
        self.next_seq = session.next_seq or None  # 0: a store that does not say
        self.context = list(session.context)
        return self.context

    async def _write(
        self,
        method: Callable[..., Awaitable[R]],
        make_request: Callable[[], ProtoMessage],
        timeout: float | None = None,
    ) -> R:
        try:
            reply = await self._call(method, make_request(), timeout)
        except Aborted:
            if not self.from_cache:
                raise
            self.from_cache = False
            await self.load()
            self.reloads += 1
            reply = await self._call(method, make_request(), timeout)
        self.from_cache = False
        return reply

    async def _write_until(
        self,
        method: Callable[..., Awaitable[R]],
        make_request: Callable[[], ProtoMessage],
        seconds: float,
        attempt_timeout: float,
    ) -> R:
        """_write, retried while the store does not answer, for up to `seconds`. Only for requests
        that are safe to repeat (an append under its idempotency key)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        attempt = 0
        while True:
            remaining = deadline - loop.time()
            try:
                return await self._write(method, make_request, max(0.1, min(attempt_timeout, remaining)))
            except Unavailable as exc:
                delay = retry_delay(attempt)
                if loop.time() + delay >= deadline:
                    raise
                attempt += 1
                log.warning(
                    "session %s: a write that must land failed (%s); retry %d in %.1fs",
                    self.session_id,
                    exc,
                    attempt,
                    delay,
                )
                await asyncio.sleep(delay)

    async def append(
        self,
        messages: Sequence[Message],
        *,
        retry_for: float = 0.0,
        attempt_timeout: float | None = None,
        report: store_pb.ModelReport | None = None,
    ) -> list[int]:
        """Store messages after this session's last. Every attempt carries one idempotency key, so
        an attempt whose answer was lost is never stored twice; ``retry_for``: keep retrying that
        long while the store does not answer (the write of a turn's answer). ``report``: what the
        model reported for the call the messages answer, written in the same transaction, as are the
        tool runs the turn's log holds (the audit log's records of the runs these messages answer)."""
        messages = [storable(m) for m in messages]
        key = uuid.uuid4().hex
        attempt_timeout = self.timeout if attempt_timeout is None else attempt_timeout
        runs = self.tool_runs.unstored(self.call_seqs)
        carried = len(runs)

        def request() -> store_pb.AppendMessagesRequest:
            built = store_pb.AppendMessagesRequest(
                session_id=self.session_id,
                messages=messages,
                expected_revision=self.revision,
                idempotency_key=key,
                report=report,
                tool_runs=runs,
            )
            if self.next_seq is not None:
                built.expected_next_seq = self.next_seq
            return built

        try:
            reply = await self._append(request, retry_for, attempt_timeout)
        except (PermissionDenied, InvalidArgument) as exc:
            if report is None and not runs:
                raise
            # A report or records the store will not take never cost the answer: stored without them.
            log.warning(
                "session %s: the model report or the tool runs' records were refused (%s); the messages "
                "are stored without them",
                self.session_id,
                exc,
            )
            report, runs = None, []
            reply = await self._append(request, retry_for, attempt_timeout)
        self.tool_runs.stored(carried)
        if report is not None:
            self.flagged_cut = reply.context_truncated
        self.revision = reply.revision
        if reply.seqs:
            self.next_seq = max(reply.seqs) + 1
        if reply.session_changed:
            await self._refresh()
        stored = []
        for seq, message in zip(reply.seqs, messages):
            copy = Message()
            copy.CopyFrom(message)
            copy.seq = seq
            stored.append(copy)
            self.call_seqs.update((call.id, seq) for call in message.tool_calls)
        self.context.extend(m for m in stored if (m.is_context if m.explicit_flags else True))
        return list(reply.seqs)

    async def _refresh(self) -> None:
        """The session's own fields as the store has them now, after an append found them changed
        by someone else (a rename, a pin, a taint) while this turn ran; the context stays ours. When
        they cannot be read, this copy is not kept warm for the next turn."""
        try:
            fresh = (
                await self.store.GetSession(
                    store_pb.GetSessionRequest(session_id=self.session_id, view=store_pb.SESSION_VIEW_SUMMARY)
                )
            ).session
        except PalimpsestError as exc:
            log.warning(
                "session %s changed meanwhile and could not be read again (%s): not kept warm", self.session_id, exc
            )
            self.warm_worthy = False
            return
        self.session = fresh

    async def _append(
        self, request: Callable[[], store_pb.AppendMessagesRequest], retry_for: float, attempt_timeout: float
    ) -> store_pb.AppendMessagesResponse:
        try:
            if retry_for > 0:
                return await self._write_until(self.appends, request, retry_for, attempt_timeout)
            return await self._write(self.appends, request, attempt_timeout)
        except Unavailable:
            # Its outcome unknown (the store may have stored it and lost the answer): this copy may
            # be stale, so the next write refused as stale reloads and tries once more, as a turn
            # started from a warm copy does.
            self.from_cache = True
            raise

    async def done_appending(self) -> None:
        """The turn's own writes are over: the tool runs no append carried (a stop, a cancellation or
        a failure under its tools) go to the audit log, then its append stream ends."""
        runs = self.tool_runs.unstored(self.call_seqs)
        try:
            if runs:
                await store_tool_runs(
                    self.appends, self.session_id, runs, key=uuid.uuid4().hex, metadata=self.vouch, timeout=self.timeout
                )
                self.tool_runs.stored(len(runs))
        finally:
            await self.appends.close()

    def forget(self) -> None:
        """Drop the copy of the session held: another turn wrote since it was taken, so the turn
        loads it from the store when it starts."""
        self.session = None

    def snapshot(self) -> common_pb2.Session | None:
        """The session as this conversation left it (CONTEXT view): what the Agent keeps warm for
        the next turn without reading it back, when nothing but this conversation wrote since."""
        if self.session is None or self.revision is None or not self.warm_worthy:
            return None
        session = common_pb2.Session()
        session.CopyFrom(self.session)
        session.revision = self.revision
        session.next_seq = self.next_seq or 0
        del session.context[:]
        session.context.extend(self.context)
        return session

    async def update(self, **fields: Any) -> common_pb2.Session:
        """UpdateSession fields (dicts for `metadata` and `planning_log`), guarded by our revision."""
        structs = {name: fields.pop(name) for name in ("metadata", "planning_log") if name in fields}

        def request() -> store_pb.UpdateSessionRequest:
            built = store_pb.UpdateSessionRequest(session_id=self.session_id, expected_revision=self.revision, **fields)
            for name, data in structs.items():
                getattr(built, name).CopyFrom(to_struct(data))
            return built

        reply = await self._write(self.store.UpdateSession, request)
        self.revision = reply.session.revision
        self.session = reply.session
        self.next_seq = reply.session.next_seq or self.next_seq
        return reply.session

    async def set_token_count(self, tokens: int) -> None:
        await self.update(context_token_count=tokens)

    async def mark_untrusted(self) -> None:
        if self.session is not None and self.session.untrusted_ingested:
            return
        await self.update(mark_untrusted_ingested=True)

    @property
    def untrusted(self) -> bool:
        return bool(self.session and self.session.untrusted_ingested)

    @property
    def through_seq(self) -> int:
        return max((m.seq for m in self.context), default=0)

    def has_summary(self) -> bool:
        return any(m.is_summary for m in self.context)


class EphemeralConversation:
    """A sub-agent's temporary context: nothing is written anywhere."""

    ephemeral = True
    flagged_cut = False
    session_id = ""
    session = None
    reloads = 0

    def __init__(
        self, messages: Sequence[Message] = (), untrusted: bool = False, tool_runs: ToolRunLog | None = None
    ) -> None:
        self.context: list[Message] = list(messages)
        self._untrusted = untrusted
        self.revision = None
        # The parent turn's log (a spawned sub-agent's runs are audited under the parent session), or
        # one of its own that RunEphemeral writes at its end.
        self.tool_runs = tool_runs if tool_runs is not None else ToolRunLog()

    async def load(self) -> list[Message]:
        return self.context

    async def append(
        self,
        messages: Sequence[Message],
        *,
        retry_for: float = 0.0,
        attempt_timeout: float | None = None,
        report: store_pb.ModelReport | None = None,
    ) -> list[int]:
        self.context.extend(messages)
        return [0] * len(messages)

    async def done_appending(self) -> None:
        return None

    def forget(self) -> None:
        return None  # nothing is stored: the context in memory is the only copy

    def snapshot(self) -> None:
        return None  # nothing is stored: nothing to keep warm

    async def update(self, **fields: Any) -> None:
        return None

    async def set_token_count(self, tokens: int) -> None:
        return None

    async def mark_untrusted(self) -> None:
        self._untrusted = True

    @property
    def untrusted(self) -> bool:
        return self._untrusted

    @property
    def through_seq(self) -> int:
        return 0

    def has_summary(self) -> bool:
        return False

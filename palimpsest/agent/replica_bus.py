"""The Agent's side of the session bus (the store's PublishSessionMessages and
ListenSessionMessages, over PostgreSQL LISTEN/NOTIFY): a `Stop` and a client tool's answer reach
the replica running the turn, and `WatchSession` sees the turns of every replica.

- Every event a turn publishes goes into an outbox that one task sends in batches: a turn only
  appends to a bounded queue, so a slow or absent store delays watchers, never a turn (when the
  outbox is full its oldest events go).
- One stream listens for what every replica publishes, opened again (here or on another store
  replica) whenever it ends. Delivery is at most once: what is published while it is down is
  missed, so a `Stop` sends its request again until it is answered.
- A replica ignores what it published itself: its own watchers had it already.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import deque
from collections.abc import Callable
from contextlib import suppress

from google.protobuf.message import DecodeError

from palimpsest.agent.pending_calls import Answer, Key, Outcome
from palimpsest.agent.turn_logs import ALIVE_EVERY_S
from palimpsest.shared import tracing
from palimpsest.shared.auth import as_service
from palimpsest.shared.errors import PalimpsestError
from palimpsest.shared.stubs import AsyncStoreStub
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import session_store_pb2 as store_pb

log = logging.getLogger("palimpsest.agent.bus")

OUTBOX_MESSAGES = 10_000  # about a minute of 40 turns streaming, should the store be away
# One publish: within the store's 1,000 messages and far within a gRPC message.
BATCH_MESSAGES = 500
BATCH_BYTES = 4 * 1024 * 1024
MAX_PAYLOAD_BYTES = 1024 * 1024  # the store's limit for one message
# A listen is a subscription, not a call that should finish: a day's deadline (then it listens
# again), and the channel's keepalive notices a dead peer long before.
LISTEN_SPAN_S = 24 * 3600.0
RELISTEN_FIRST_S = 0.1
RELISTEN_MOST_S = 2.0
# A Stop for a turn on another replica: sent again every half second until that replica answers,
# for at most two seconds (a listen reopening in between misses the first send).
STOP_REACH_S = 2.0
STOP_RESEND_S = 0.5


def relayable(event: pb.AgentEvent) -> bytes | None:
    """An event as the bus carries it; None when too big. A final answer past the store's limit goes
    without its text: watchers elsewhere still learn that (and how) the turn ended."""
    payload = pb.ReplicaMessage(event=event).SerializeToString()
    if len(payload) <= MAX_PAYLOAD_BYTES:
        return payload
    if event.HasField("stream_end"):
        slim = pb.AgentEvent()
        slim.CopyFrom(event)
        slim.stream_end.text = ""
        return pb.ReplicaMessage(event=slim).SerializeToString()
    return None


class ReplicaBus:
    def __init__(
        self,
        store: AsyncStoreStub,
        replica: str,
        *,
        deliver: Callable[[pb.AgentEvent], None],
        stop_here: Callable[[str], bool],
        running: Callable[[], list[tuple[str, str]]] = list,
        answer_here: Callable[[Key, Answer], Outcome] = lambda key, answer: "unknown",
        alive: Callable[[str], None] = lambda turn_id: None,
        hearing: Callable[[bool], None] = lambda hearing: None,
    ) -> None:
        """``deliver``: an event from another replica, to this replica's watchers. ``stop_here``:
        stop the session's turn if this replica runs it (True then). ``running``: (session id, turn
        id) of the turns this replica runs, announced every ALIVE_EVERY_S; ``alive``: another
        replica announced this turn; ``hearing``: whether this replica's listen is in place."""
        self.store = store
        self.replica = replica
        self._deliver = deliver
        self._stop_here = stop_here
        self._answer_here = answer_here
        self._running = running
        self._alive = alive
        self._hearing = hearing
        self._outbox: deque[store_pb.SessionMessage] = deque()
        self._mail = asyncio.Event()
        self._sent = asyncio.Event()  # the outbox is empty and nothing is being sent
        self._sent.set()
        self._answers: dict[str, asyncio.Future] = {}  # Stop requests and tool answers sent, by id
        self._tasks: list[asyncio.Task] = []
        self.listening = asyncio.Event()  # a listen is in place: what is published now arrives
        self.dropped = 0  # events the full outbox let go

    def start(self) -> None:
        # The bus is the services' own (never a caller's credentials), and its listen no one's trace.
        with as_service(), tracing.untraced():
            self._tasks = [
                asyncio.create_task(self._listen_forever()),
                asyncio.create_task(self._send_forever()),
                asyncio.create_task(self._announce_forever()),
            ]

    async def close(self, flush_s: float = 0.0) -> None:
        """Stop listening and sending; the outbox (the stopped turns' last events) gets ``flush_s``."""
        if flush_s > 0:
            with suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._sent.wait(), flush_s)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- out ---------------------------------------------------------------------------------
    def _message(self, session_id: str, payload: bytes) -> store_pb.SessionMessage:
        return store_pb.SessionMessage(session_id=session_id, origin=self.replica, payload=payload)

    def publish(self, event: pb.AgentEvent) -> None:
        """Queue a turn's event for the other replicas' watchers; never waits."""
        payload = relayable(event)
        if payload is None:
            log.warning(
                "session %s: a %s event of more than %d bytes not sent to other replicas",
                event.session_id,
                event.WhichOneof("event"),
                MAX_PAYLOAD_BYTES,
            )
            return
        self._post(event.session_id, payload)

    async def _announce_forever(self) -> None:
        """Say which turns run here, so replicas keeping their events know they are not lost."""
        while True:
            await asyncio.sleep(ALIVE_EVERY_S)  # a period, not a wait for something
            for session_id, turn_id in self._running():
                self._post(session_id, pb.ReplicaMessage(alive=turn_id).SerializeToString())

    def _post(self, session_id: str, payload: bytes) -> None:
        if len(self._outbox) >= OUTBOX_MESSAGES:
            self._outbox.popleft()
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("the store takes no events: %d dropped for other replicas' watchers", self.dropped)
        self._outbox.append(self._message(session_id, payload))
        self._sent.clear()
        self._mail.set()

    async def _send_forever(self) -> None:
        while True:
            await self._mail.wait()
            self._mail.clear()
            while self._outbox:
                batch: list[store_pb.SessionMessage] = []
                size = 0
                while self._outbox and len(batch) < BATCH_MESSAGES and size < BATCH_BYTES:
                    batch.append(self._outbox.popleft())
                    size += len(batch[-1].payload)
                try:
                    with tracing.untraced():  # a batch of many turns' events: part of none of their traces
                        await self.store.PublishSessionMessages(store_pb.PublishSessionMessagesRequest(messages=batch))
                except PalimpsestError as exc:  # the channel retried already: these are lost to watchers elsewhere
                    log.warning("%d events not sent to other replicas' watchers: %s", len(batch), exc)
            self._sent.set()

    async def stop_elsewhere(self, session_id: str) -> bool:
        """Ask the replica running the session's turn to stop it; True once it says it did, False
        when no replica answers within STOP_REACH_S (no turn runs)."""
        request_id = secrets.token_hex(8)
        return await self._ask(session_id, request_id, pb.ReplicaMessage(stop=request_id)) is True

    async def answer_elsewhere(self, session_id: str, key: Key, answer: Answer) -> Outcome:
        """Hand a client tool's answer to the replica whose turn waits for it; "unknown" when none
        takes it within STOP_REACH_S."""
        request_id = secrets.token_hex(8)
        message = pb.ReplicaMessage(
            tool_answer=pb.ToolAnswer(
                request_id=request_id,
                turn_id=key[1],
                call_id=key[2],
                content=answer.content,
                is_error=answer.is_error,
                trusted=answer.trusted,
            )
        )
        outcome = await self._ask(session_id, request_id, message)
        return outcome if outcome in ("taken", "answered") else "unknown"

    async def _ask(self, session_id: str, request_id: str, message: pb.ReplicaMessage) -> object:
        """Send ``message`` until the replica it is for answers ``request_id`` (its answer), for at most
        STOP_REACH_S (then None): a listen reopening in between misses a send."""
        loop = asyncio.get_running_loop()
        answered: asyncio.Future = loop.create_future()
        self._answers[request_id] = answered
        deadline = loop.time() + STOP_REACH_S
        try:
            with as_service():
                while (left := deadline - loop.time()) > 0:
                    await self._send_now(session_id, message)
                    try:
                        return await asyncio.wait_for(asyncio.shield(answered), min(STOP_RESEND_S, left))
                    except asyncio.TimeoutError:
                        continue
            return None
        finally:
            del self._answers[request_id]

    async def _send_now(self, session_id: str, message: pb.ReplicaMessage) -> None:
        """A Stop or its answer: ahead of the outbox, whose events may be queued behind a slow store."""
        await self.store.PublishSessionMessages(
            store_pb.PublishSessionMessagesRequest(messages=[self._message(session_id, message.SerializeToString())])
        )

    async def _reply(self, session_id: str, message: pb.ReplicaMessage) -> None:
        try:
            with tracing.untraced():
                await self._send_now(session_id, message)
        except PalimpsestError as exc:  # the asker sends its request again and we answer that
            log.warning("session %s: an answer to another replica not sent: %s", session_id, exc)

    def _reply_soon(self, session_id: str, message: pb.ReplicaMessage) -> None:
        task = asyncio.create_task(self._reply(session_id, message))
        self._tasks.append(task)
        task.add_done_callback(self._tasks.remove)

    # -- in ----------------------------------------------------------------------------------
    async def _listen_forever(self) -> None:
        wait = RELISTEN_FIRST_S
        while True:
            try:
                async for reply in self.store.ListenSessionMessages(
                    store_pb.ListenSessionMessagesRequest(), timeout=LISTEN_SPAN_S
                ):
                    if not reply.messages:  # the first: in place from now on
                        self.listening.set()
                        self._hearing(True)
                        wait = RELISTEN_FIRST_S
                    for message in reply.messages:
                        self._receive(message)
            except PalimpsestError as exc:
                log.log(
                    logging.WARNING if self.listening.is_set() else logging.DEBUG,
                    "session bus: listening again (%s)",
                    exc,
                )
            finally:
                self.listening.clear()
                self._hearing(False)
            await asyncio.sleep(wait)  # back-off between listens, while the store has none in place
            wait = min(wait * 2, RELISTEN_MOST_S)

    def _receive(self, message: store_pb.SessionMessage) -> None:
        if message.origin == self.replica:
            return
        try:
            parsed = pb.ReplicaMessage.FromString(message.payload)
        except DecodeError:
            log.warning("session bus: an undecodable message from %s ignored", message.origin)
            return
        kind = parsed.WhichOneof("kind")
        if kind == "event":
            self._deliver(parsed.event)
        elif kind == "stop":
            if self._stop_here(message.session_id):
                self._reply_soon(message.session_id, pb.ReplicaMessage(stopped=parsed.stop))
        elif kind == "tool_answer":
            got = parsed.tool_answer
            outcome = self._answer_here(
                (message.session_id, got.turn_id, got.call_id), Answer(got.content, got.is_error, got.trusted)
            )
            if outcome != "unknown":  # (the replica running the turn answers; the others keep quiet)
                self._reply_soon(
                    message.session_id,
                    pb.ReplicaMessage(tool_answered=pb.ToolAnswered(request_id=got.request_id, outcome=outcome)),
                )
        elif kind == "alive":
            self._alive(parsed.alive)
        elif kind == "stopped":
            self._answered(parsed.stopped, True)
        elif kind == "tool_answered":
            self._answered(parsed.tool_answered.request_id, parsed.tool_answered.outcome)

    def _answered(self, request_id: str, result: object) -> None:
        answered = self._answers.get(request_id)
        if answered is not None and not answered.done():
            answered.set_result(result)

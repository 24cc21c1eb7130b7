"""Messages between Agent replicas about sessions, carried by PostgreSQL LISTEN/NOTIFY: a Stop for a
turn another replica runs, a turn's events for watchers elsewhere. No new infrastructure: every store
replica publishes with NOTIFY on one channel and keeps one connection that LISTENs on it, and every
Agent holds a ListenSessionMessages stream to one store replica.

A NOTIFY payload is text of less than 8,000 bytes. A message is encoded (base64 of its protobuf)
and cut into as many payloads as it needs, each naming the message, its part and the number of
parts; all of one publish go in one statement, so they commit together and reach every listener
consecutively and in order (PostgreSQL delivers a transaction's notifications in the order sent,
and transactions in commit order). Delivery is at most once: what is published while a listen
connection is down is lost to it, and its listeners are told by the end of their streams.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import secrets
from dataclasses import dataclass, field

import asyncpg

from palimpsest.shared import tracing
from palimpsest.v1 import session_store_pb2 as pb

log = logging.getLogger("palimpsest.store.bus")

CHANNEL = "palimpsest_session_messages"
# A part's text: "<id>:<part>:<parts>:<base64>", below NOTIFY's 8,000 bytes with room for the header.
PART_BYTES = 5_700  # 7,600 characters of base64
MAX_PAYLOAD_BYTES = 1024 * 1024  # one message; a turn's events are far smaller
# A message in parts not completed within this many parts of others is dropped (parts of one publish
# arrive together, so this only bounds what a damaged stream could leave behind).
MAX_PENDING_MESSAGES = 64
# A listener (one Agent's stream) this many messages behind is cut off rather than held in memory.
LISTENER_QUEUE = 10_000
# How often the listen connection is checked: a connection that went away without a word (a dead
# host, a cut network) is noticed within this time and opened again.
CHECK_INTERVAL_S = 5.0
RECONNECT_FIRST_S = 0.1
RECONNECT_MOST_S = 2.0


def notify_payloads(message: bytes, message_id: str) -> list[str]:
    """The NOTIFY payloads that carry one encoded message."""
    text = base64.b64encode(message).decode()
    step = PART_BYTES // 3 * 4
    parts = [text[i : i + step] for i in range(0, len(text), step)] or [""]
    return [f"{message_id}:{i}:{len(parts)}:{part}" for i, part in enumerate(parts)]


@dataclass
class Reassembly:
    """Parts back into messages, in the order their last part arrives."""

    _pending: dict[str, list[str | None]] = field(default_factory=dict)

    def add(self, payload: str) -> bytes | None:
        """The whole message once ``payload`` completes it; None before (or for a damaged part)."""
        try:
            message_id, index, count, text = payload.split(":", 3)
            i, n = int(index), int(count)
        except ValueError:
            log.warning("session bus: a payload that is not a message part (%.40r…) ignored", payload)
            return None
        if not 0 <= i < n:
            return None
        if n == 1:
            return base64.b64decode(text)
        parts = self._pending.setdefault(message_id, [None] * n)
        if len(parts) != n:
            return None
        parts[i] = text
        if any(part is None for part in parts):
            while len(self._pending) > MAX_PENDING_MESSAGES:
                self._pending.pop(next(iter(self._pending)))
            return None
        del self._pending[message_id]
        return base64.b64decode("".join(parts))  # type: ignore[arg-type]


class ListenerGone(Exception):
    """The listen connection dropped, or the listener fell behind: what it missed is unknown."""


_END = object()  # put on a listener's queue: its stream ends with ListenerGone


class Listener:
    """One ListenSessionMessages stream: the messages for it, until it ends."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue = asyncio.Queue()
        self.reason = ""

    def put(self, message: pb.SessionMessage) -> bool:
        """False when the listener is too far behind (then it is ended)."""
        if self._queue.qsize() >= LISTENER_QUEUE:
            self.end("the listener fell behind")
            return False
        self._queue.put_nowait(message)
        return True

    def end(self, reason: str) -> None:
        if not self.reason:
            self.reason = reason
            self._queue.put_nowait(_END)

    async def next_batch(self) -> list[pb.SessionMessage]:
        """What has arrived (at least one message); raises ListenerGone once ended."""
        batch = [await self._queue.get()]
        while not self._queue.empty():
            batch.append(self._queue.get_nowait())
        if batch[-1] is _END or _END in batch:
            raise ListenerGone(self.reason)
        return batch


class SessionBus:
    """This store replica's side of the bus: publishes through the pool, listens on a connection of
    its own (opened again whenever it drops) and hands every message to this replica's listeners."""

    def __init__(self, dsn: str, pool: asyncpg.Pool, *, check_interval_s: float = CHECK_INTERVAL_S) -> None:
        self._dsn = dsn
        self._pool = pool
        self._check_interval_s = check_interval_s
        self._listeners: set[Listener] = set()
        self._listening = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.connection_pid: int | None = None  # the listen connection's backend, for tests and logs

    async def publish(self, messages: list[pb.SessionMessage]) -> None:
        payloads = [
            part for message in messages for part in notify_payloads(message.SerializeToString(), secrets.token_hex(8))
        ]
        # One statement, one transaction: the parts reach every listener together, in this order.
        await self._pool.execute("SELECT count(pg_notify($1, p)) FROM unnest($2::text[]) AS p", CHANNEL, payloads)

    async def listen(self, timeout: float) -> Listener:
        """A new listener, once this replica's listen is in place (UNAVAILABLE after ``timeout``)."""
        listener = Listener()
        self._listeners.add(listener)
        try:
            await asyncio.wait_for(self._listening.wait(), timeout)
        except BaseException:
            self._listeners.discard(listener)
            raise
        return listener

    def leave(self, listener: Listener) -> None:
        self._listeners.discard(listener)

    def start(self) -> None:
        self._task = asyncio.create_task(self._listen_forever())

    async def stop(self) -> None:
        """Ends every listener's stream now (a draining store must not wait on them) and closes."""
        self._end_all("the store is stopping")
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _end_all(self, reason: str) -> None:
        for listener in list(self._listeners):
            listener.end(reason)
        self._listeners.clear()

    def _deliver(self, message: pb.SessionMessage) -> None:
        for listener in list(self._listeners):
            if not listener.put(message):
                self._listeners.discard(listener)
                log.warning("session bus: a listener fell %d messages behind and was cut off", LISTENER_QUEUE)

    async def _listen_forever(self) -> None:
        wait = RECONNECT_FIRST_S
        while True:
            try:
                await self._listen_once()
                wait = RECONNECT_FIRST_S
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 — whatever broke the connection, open it again
                log.warning("session bus: listen connection lost (%s: %s); reconnecting", type(exc).__name__, exc)
            finally:
                self._listening.clear()
                self.connection_pid = None
                # Messages published from now until the listen is back are lost to these listeners:
                # ending their streams tells them so (they listen again, here or elsewhere).
                self._end_all("the store's listen connection to PostgreSQL dropped")
            await asyncio.sleep(wait)  # back-off before opening it again
            wait = min(wait * 2, RECONNECT_MOST_S)

    async def _listen_once(self) -> None:
        with tracing.untraced():  # housekeeping, no one's request: not a trace of its own every few seconds
            conn = await asyncpg.connect(self._dsn, timeout=self._check_interval_s)
        lost = asyncio.Event()
        conn.add_termination_listener(lambda _conn: lost.set())
        reassembly = Reassembly()

        def on_notify(_conn: object, _pid: int, _channel: str, payload: object) -> None:
            data = reassembly.add(str(payload))
            if data is None:
                return
            try:
                message = pb.SessionMessage.FromString(data)
            except Exception:  # noqa: BLE001 — someone else's NOTIFY on our channel: not ours to relay
                log.warning("session bus: an undecodable message ignored")
                return
            self._deliver(message)

        try:
            with tracing.untraced():
                await conn.add_listener(CHANNEL, on_notify)
            self.connection_pid = conn.get_server_pid()
            self._listening.set()
            while not lost.is_set():
                try:
                    await asyncio.wait_for(lost.wait(), self._check_interval_s)
                except asyncio.TimeoutError:
                    with tracing.untraced():
                        await conn.fetchval("SELECT 1", timeout=self._check_interval_s)
            raise ConnectionError("the connection was closed")
        finally:
            self._listening.clear()
            conn.terminate()

"""What the Agent keeps per session between and during turns, in this process: one owner for
serialising turns, stopping them, the post-turn pass, and the warm copy for the next turn.

- One turn (or forced compaction) per session at a time: ``exclusive`` is its lock. Across
  replicas the store's revision check refuses the second writer.
- The turn that is running, so ``stop`` reaches it.
- The post-turn pass, so the next turn drops it instead of waiting for a summary.
- A generation per session, bumped whenever the session changed under its lock: a turn opened
  before that reloads instead of starting from what it read.
- The warm copy (the caller's credentials and the CONTEXT view as the last turn left it): the next
  turn by the same caller starts from it, one round trip less before the first token. A stale copy
  costs a reload at the first write, which the store refuses on the revision.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Generic, Protocol, TypeVar

from palimpsest.agent.warm_cache import WarmCache
from palimpsest.shared.stubs import AsyncStoreStub
from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as store_pb

log = logging.getLogger("palimpsest.agent")

Credentials = tuple[tuple[str, str], ...]


class Stoppable(Protocol):
    stop: asyncio.Event


T = TypeVar("T", bound=Stoppable)


class SessionRuntime(Generic[T]):
    def __init__(self, warm: WarmCache[tuple[Credentials, common_pb2.Session]]) -> None:
        self._warm = warm
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: dict[str, int] = {}  # holders and waiters of each lock: an idle one is forgotten
        self._running: dict[str, T] = {}
        self._post_turn: dict[str, asyncio.Future] = {}
        self._generation: dict[str, int] = {}

    # -- the warm copy --------------------------------------------------------------------------
    def take_warm(self, session_id: str, credentials: Credentials) -> common_pb2.Session | None:
        """The kept copy, for the same caller only (the same access); taken, so it is used once."""
        warm = self._warm.pop(session_id)
        return warm[1] if warm is not None and warm[0] == credentials else None

    def keep_warm(self, session_id: str, credentials: Credentials, session: common_pb2.Session) -> None:
        self._warm.put(session_id, (credentials, session), session.ByteSize())

    def forget_warm(self, session_id: str) -> None:
        self._warm.pop(session_id)

    # -- one at a time --------------------------------------------------------------------------
    def generation(self, session_id: str) -> int:
        return self._generation.get(session_id, 0)

    async def acquire(self, session_id: str) -> None:
        """The session to this caller alone, until ``release`` (which another task may call: a
        turn's post-turn work holds it after its stream ended). A post-turn pass still under way is
        dropped first: its commit is one transaction, so nothing half-done stays, and the next
        turn's own first check compresses if the context still needs it."""
        self.drop_post_turn(session_id)
        lock = self._locks.setdefault(session_id, asyncio.Lock())
        self._users[session_id] = self._users.get(session_id, 0) + 1
        try:
            await lock.acquire()
        except BaseException:  # cancelled while waiting: never held
            self._leave(session_id)
            raise

    def release(self, session_id: str) -> None:
        """The session changed under its lock: a turn opened before this reloads."""
        self._generation[session_id] = self.generation(session_id) + 1
        self._locks[session_id].release()
        self._leave(session_id)

    def _leave(self, session_id: str) -> None:
        self._users[session_id] -= 1
        if not self._users[session_id]:  # nobody holds or waits: one lock per session would pile up
            del self._users[session_id], self._locks[session_id]

    # -- the running turn and its post-turn pass ------------------------------------------------
    def started(self, session_id: str, turn: T) -> None:
        self._running[session_id] = turn

    def ended(self, session_id: str) -> None:
        self._running.pop(session_id, None)

    def running_turn(self, session_id: str) -> T | None:
        return self._running.get(session_id)

    def running(self) -> list[tuple[str, T]]:
        """(session id, turn) of each turn running here."""
        return list(self._running.items())

    def stop(self, session_id: str) -> bool:
        """Ask the session's running turn to stop; False when none runs here."""
        turn = self._running.get(session_id)
        if turn is None:
            return False
        turn.stop.set()
        return True

    def stop_all(self) -> None:
        for turn in list(self._running.values()):
            turn.stop.set()

    async def post_turn(self, session_id: str, work: Awaitable[None]) -> None:
        """Run the post-turn pass; the next turn may drop it (then this returns quietly)."""
        future = asyncio.ensure_future(work)
        self._post_turn[session_id] = future
        try:
            await future
        except asyncio.CancelledError:
            if not future.cancelled():
                raise  # the caller itself is being cancelled, not just the post-turn pass
            log.info("post-turn pass of %s dropped: the next turn arrived", session_id)
        finally:
            if self._post_turn.get(session_id) is future:
                del self._post_turn[session_id]

    def drop_post_turn(self, session_id: str) -> None:
        future = self._post_turn.get(session_id)
        if future is not None and not future.done():
            future.cancel()


class TurnClaims:
    """Turns on one session across Agent replicas: claimed in the store (ClaimTurn) once this
    process holds the session, renewed while the turn and its post-turn pass run, released after.
    A replica that dies holding a claim stops renewing it, and the claim runs out after ``ttl``."""

    # Waiting for another replica's claim: short first (its turn may be ending), never longer than
    # a second between looks, never past the moment the claim runs out.
    FIRST_WAIT_S = 0.05
    MOST_WAIT_S = 1.0

    def __init__(self, store: AsyncStoreStub, ttl_s: int, replica: str) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.replica = replica
        self._renewing: dict[str, asyncio.Task] = {}

    async def claim(self, session_id: str, turn_id: str) -> tuple[str, bool]:
        """Wait until the session's turn is this one's: (the holder name to release with, whether
        another replica held it first — then the session may have changed since it was read)."""
        holder = f"{self.replica}/{turn_id}"
        wait, waited = self.FIRST_WAIT_S, False
        while True:
            reply = await self.store.ClaimTurn(
                store_pb.ClaimTurnRequest(session_id=session_id, holder=holder, ttl_seconds=self.ttl_s)
            )
            if reply.granted:
                break
            log.info(
                "session %s: turn held by %s for %.1fs more; waiting",
                session_id,
                reply.holder,
                reply.expires_in_seconds,
            )
            waited = True
            await asyncio.sleep(min(wait, max(0.01, reply.expires_in_seconds)))
            wait = min(wait * 2, self.MOST_WAIT_S)
        self._renewing[holder] = asyncio.create_task(self._renew(session_id, holder))
        return holder, waited

    async def _renew(self, session_id: str, holder: str) -> None:
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            try:
                await self.store.ClaimTurn(
                    store_pb.ClaimTurnRequest(session_id=session_id, holder=holder, ttl_seconds=self.ttl_s)
                )
            except Exception as exc:  # noqa: BLE001 — the next renewal tries again; the claim may run out
                log.warning("session %s: renewing the turn's claim failed: %s", session_id, exc)

    async def release(self, session_id: str, holder: str) -> None:
        task = self._renewing.pop(holder, None)
        if task is not None:
            task.cancel()
        try:
            await self.store.ClaimTurn(store_pb.ClaimTurnRequest(session_id=session_id, holder=holder, release=True))
        except Exception as exc:  # noqa: BLE001 — unreleased, the claim runs out on its own
            log.warning("session %s: releasing the turn's claim failed: %s", session_id, exc)

"""The Agent's per-session runtime on its own: one turn at a time, stop, the post-turn pass the next
turn drops, generations, the warm copy, and nothing left behind for an idle session."""

from __future__ import annotations

import asyncio

import pytest

from palimpsest.agent.runtime import SessionRuntime
from palimpsest.agent.warm_cache import WarmCache
from palimpsest.v1 import common_pb2


class FakeTurn:
    def __init__(self) -> None:
        self.stop = asyncio.Event()


def runtime() -> SessionRuntime[FakeTurn]:
    return SessionRuntime(WarmCache(8, 1 << 20))


async def test_turns_on_one_session_run_one_at_a_time_and_move_the_generation() -> None:
    sessions = runtime()
    await sessions.acquire("s")
    second = asyncio.create_task(sessions.acquire("s"))
    other = asyncio.create_task(sessions.acquire("t"))  # another session does not wait
    await other
    await asyncio.sleep(0)  # (a scheduling turn: the second acquire is parked on the lock)
    assert not second.done() and sessions.generation("s") == 0

    async def release_elsewhere() -> None:  # a turn's post-turn work releases from its own task
        sessions.release("s")

    await asyncio.create_task(release_elsewhere())
    await second
    assert sessions.generation("s") == 1
    sessions.release("s")
    sessions.release("t")
    assert sessions.generation("s") == 2
    assert not sessions._locks and not sessions._users  # idle sessions leave nothing behind


async def test_a_caller_cancelled_while_waiting_never_holds_the_session() -> None:
    sessions = runtime()
    await sessions.acquire("s")
    waiting = asyncio.create_task(sessions.acquire("s"))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    sessions.release("s")
    assert not sessions._locks and not sessions._users
    await sessions.acquire("s")  # and the session is free again
    sessions.release("s")


async def test_the_next_turn_drops_an_unfinished_post_turn_pass() -> None:
    sessions = runtime()
    started = asyncio.Event()

    async def slow_summary() -> None:
        started.set()
        await asyncio.Event().wait()  # a summary the model never finishes

    await sessions.acquire("s")
    pass_done = asyncio.create_task(sessions.post_turn("s", slow_summary()))
    await started.wait()
    sessions.release("s")
    await sessions.acquire("s")  # the user is back
    await pass_done  # dropped: returns quietly
    sessions.release("s")


async def test_stop_reaches_the_running_turn_only() -> None:
    sessions = runtime()
    turn = FakeTurn()
    assert not sessions.stop("s")
    sessions.started("s", turn)
    assert sessions.stop("s") and turn.stop.is_set()
    sessions.ended("s")
    assert not sessions.stop("s")


def test_the_warm_copy_is_for_the_same_caller_and_used_once() -> None:
    sessions = runtime()
    alice, bob = (("authorization", "Bearer a"),), (("authorization", "Bearer b"),)
    session = common_pb2.Session(id="s", revision=3)
    sessions.keep_warm("s", alice, session)
    assert sessions.take_warm("s", bob) is None  # another caller: another access
    sessions.keep_warm("s", alice, session)
    assert sessions.take_warm("s", alice) == session
    assert sessions.take_warm("s", alice) is None

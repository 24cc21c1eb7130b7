"""All SQL of the SessionStore, one module per aggregate and one place for each table's SQL;
parameters are always bound.

- sessions: sessions, session_messages, session_messages_archive, applied_appends
- memory: memory_chunks (recall)
- owner_memory: owner_memory, owner_memory_entries, owner_memory_pending (what the agent remembers
  about each owner, and the writes held for their approval)
- shares: session_shares
- calibration: calibration_observations, session_baselines
- usage: the per-owner quotas over the sessions' byte counters
- tool_runs: tool_runs (a session's audit log; written by the append function)
- access: the ownership and revision checks every part shares

The schema lives in migrations/ and the current text of its SQL functions in functions.sql (both applied by db.migrate).
"""

from __future__ import annotations

import asyncpg

from palimpsest.store.repository.calibration import Calibration
from palimpsest.store.repository.memory import MemoryChunks
from palimpsest.store.repository.owner_memory import MemoryCaps, OwnerMemory
from palimpsest.store.repository.sessions import HotWindow, Sessions
from palimpsest.store.repository.shares import Shares
from palimpsest.store.repository.tool_runs import ToolRuns
from palimpsest.store.repository.usage import OwnerUsage, Quotas

__all__ = ["HotWindow", "MemoryCaps", "Quotas", "SessionRepository"]


class SessionRepository:
    """The parts over one pool; the servicer calls each part for its own tables."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        hot_window: HotWindow,
        share_key: bytes,
        quotas: Quotas = Quotas(0, 0),
        memory_caps: MemoryCaps = MemoryCaps(0, 0, 0),
    ) -> None:
        self.usage = OwnerUsage(pool, quotas)
        self.sessions = Sessions(pool, hot_window=hot_window, usage=self.usage)
        self.memory = MemoryChunks(pool)
        self.shares = Shares(pool, share_key)
        self.calibration = Calibration(pool)
        self.tool_runs = ToolRuns(pool)
        self.owner_memory = OwnerMemory(pool, memory_caps)

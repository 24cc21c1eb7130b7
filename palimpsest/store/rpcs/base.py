"""What every part of the SessionStore servicer holds: the repository, the files, the settings."""

from __future__ import annotations

from palimpsest.shared.settings import Settings
from palimpsest.shared.stopping import Stopping
from palimpsest.store.files import FileStore
from palimpsest.store.repository import SessionRepository
from palimpsest.store.semantic import MemoryIndex
from palimpsest.store.session_bus import SessionBus


class StoreRpcs:
    """The state the RPC classes share; SessionStoreServicer (palimpsest.store.servicer) joins them."""

    def __init__(
        self,
        repo: SessionRepository,
        files: FileStore,
        settings: Settings,
        memory_index: MemoryIndex | None = None,
        bus: SessionBus | None = None,
    ) -> None:
        self.repo = repo
        self.bus = bus  # messages between Agent replicas (None: a store without a listen connection)
        self.files = files
        self.settings = settings
        # The semantic tier of memory search; None (or not enabled): lexical only.
        self.memory_index = memory_index
        self.stopping = Stopping()  # set by the server's drain: append streams waiting on their writer end

    def _chunks_committed(self) -> None:
        """New chunks (or a summary) are stored: the indexer embeds them in the background, after
        the commit, so an embedder that is down or slow never fails or slows the write."""
        if self.memory_index is not None:
            self.memory_index.poke()

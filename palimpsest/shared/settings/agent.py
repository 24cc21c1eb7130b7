"""Settings of the Agent: profiles, commands and files, turns across replicas, streams and waits."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from palimpsest.shared.settings.declare import setting, setting_from
from palimpsest.shared.settings.paths import SANDBOX_MODES, absolute_folders, default_data_dir


@dataclass(frozen=True)
class AgentSettings:
    """Agent"""

    profiles_path: str = setting(
        "PALIMPSEST_PROFILES",
        "",
        "agent profiles file (JSON, below); edits apply from the next turn. A file that does not parse stops "
        "the Agent from starting, with its line; an edit that does not parse while it runs is logged as an "
        "error with its line, the last good profiles stay in use, and `pal profiles` shows the error",
        default_doc="*(built-in default profile)*",
    )
    sandbox_mode: str = setting(
        "PALIMPSEST_SANDBOX",
        "auto",
        'how `run_command` runs commands: `auto`, as each profile\'s `"sandbox"` says (sandboxed unless it '
        'says `"enabled": false`); `required`, always sandboxed whatever the profile says; `off`, never: '
        "commands run on the Agent's host (same limits, same clean environment), and sessions pinned to the "
        "sandbox are released. Anything else stops the Agent from starting. When the sandbox cannot start, "
        "the Agent says why at start and `pal health` shows it (Commands' sandbox, below)",
        choices=SANDBOX_MODES,
    )
    share_file_roots: tuple[Path, ...] = setting_from(
        "PALIMPSEST_SHARE_FILE_ROOTS",
        lambda: (default_data_dir() / "workspace",),
        "the Agent's folders `share_file` may copy from: absolute paths, separated by `:` (Files in the conversation)",
        convert=absolute_folders,
        derive=lambda s: (s.data_dir / "workspace",),
        default_doc="`$PALIMPSEST_DATA_DIR/workspace`",
    )
    share_file_max_bytes: int = setting(
        "PALIMPSEST_SHARE_FILE_MAX_MB",
        1024,
        "`share_file`'s own size cap; the store's `PALIMPSEST_FILES_MAX_MB` and the owner's quota still apply "
        "to the copy",
        unit="MB",
        old=("SHARE_FILE_MAX_SIZE_MB",),
        least=1,
    )
    reply_write_deadline_s: float = setting(
        "PALIMPSEST_REPLY_WRITE_DEADLINE_SECONDS",
        30.0,
        "how long the Agent retries storing a turn's answer while the SessionStore does not answer (one "
        "idempotency key: never stored twice); past it the stream ends with an error saying the answer was "
        "not stored",
        unit="seconds",
        old=("PALIMPSEST_REPLY_WRITE_DEADLINE_S",),
        least=0,
    )
    client_tool_timeout_s: int = setting(
        "PALIMPSEST_CLIENT_TOOL_TIMEOUT_SECONDS",
        300,
        "how long a turn waits for a client's answer to one call of its tools, when the request does not say "
        "(`client_tool_timeout_seconds`; Client tools, below)",
        unit="seconds",
        old=("PALIMPSEST_CLIENT_TOOL_TIMEOUT_S",),
        least=1,
    )
    client_tool_max_timeout_s: int = setting(
        "PALIMPSEST_CLIENT_TOOL_MAX_TIMEOUT_SECONDS",
        3600,
        "the most a request may ask for (`client_tool_timeout_seconds`) as its wait for a client tool's "
        "answer (Client tools, below)",
        unit="seconds",
        old=("PALIMPSEST_CLIENT_TOOL_MAX_TIMEOUT_S",),
        least=1,
    )
    session_titles: bool = setting(
        "PALIMPSEST_SESSION_TITLES",
        True,
        "after a new session's first answer, off the client's path, the model is asked for a short title (one "
        "call of at most 24 tokens, in the conversation's num_ctx so Ollama does not reload the model); until "
        "then, and whenever no usable title comes back, the session is named by its first words; a rename by "
        "the user meanwhile wins; `0` keeps the first words",
    )
    agent_warm_mb: int = setting(
        "PALIMPSEST_AGENT_WARM_MB",
        64,
        "the Agent keeps sessions' last state for their next turn within this many megabytes (a session over "
        "a quarter of it is not kept)",
        unit="MB",
        to_bytes=False,
        least=0,
    )
    turn_claims: bool = setting(
        "PALIMPSEST_TURN_CLAIMS",
        False,
        "with several Agent replicas: claim each turn in the store so one session never runs two turns at "
        "once across replicas (two more calls per turn); see Deploying",
    )
    turn_claim_ttl_s: int = setting(
        "PALIMPSEST_TURN_CLAIM_TTL_SECONDS",
        30,
        "how long a turn's claim lasts unless renewed (every third of it): how long a dead Agent's claim "
        "holds a session",
        unit="seconds",
        old=("PALIMPSEST_TURN_CLAIM_TTL_S",),
        least=1,
    )
    replica_events: bool = setting(
        "PALIMPSEST_REPLICA_EVENTS",
        False,
        "with several Agent replicas: `Stop` reaches the Agent running the turn, and `WatchSession` sees "
        "every Agent's turns, through the store's session bus (PostgreSQL LISTEN/NOTIFY); every event of "
        "every turn is published once more; see Deploying",
    )
    stream_keep_s: float = setting(
        "PALIMPSEST_STREAM_KEEP_SECONDS",
        300.0,
        "how long after a turn ends its events stay kept for `ResumeStream` (a running turn's are kept while "
        "it runs); see What a session remembers",
        unit="seconds",
        old=("PALIMPSEST_STREAM_KEEP_S",),
        least=0,
    )
    stream_keep_bytes: int = setting(
        "PALIMPSEST_STREAM_KEEP_MB",
        64,
        "all kept turns' events together at most this many megabytes: ended turns go first, then the largest "
        "turn's oldest events. A turn's own `RunStream` reads from them too, so this is also all that clients "
        "reading slower than their turns can cost (a client past it is told where to resume; see What a "
        "session remembers)",
        unit="MB",
        least=1,
    )
    watchers_per_user: int = setting(
        "PALIMPSEST_WATCHERS_PER_USER",
        48,
        "streams following sessions (`WatchSession` and `ResumeStream` together) one user may hold on one "
        "Agent (`0`: no limit); one more is RESOURCE_EXHAUSTED naming this setting, before anything else is "
        "done for the call. With auth off everyone is the one user `anonymous`",
        least=0,
    )
    watchers_per_session: int = setting(
        "PALIMPSEST_WATCHERS_PER_SESSION",
        24,
        "the same for one session, whoever follows it (`0`: no limit)",
        least=0,
    )
    compressor_retry_s: float = setting(
        "PALIMPSEST_COMPRESSOR_RETRY_SECONDS",
        2.0,
        "after the Compressor left a call unanswered (its deadline passed, or UNAVAILABLE), turns go on "
        "without it while a health check asks it again this often; see Identity and errors",
        unit="seconds",
        old=("PALIMPSEST_COMPRESSOR_RETRY_S",),
        least=0.1,
    )
    memory_prompt_tokens: int = setting(
        "PALIMPSEST_MEMORY_PROMPT_TOKENS",
        1_200,
        "the Agent: the memory message at most this many tokens, counted at 1.8 characters a token (a memory "
        "as full as the default caps allow fits); past it the newest entries are left out of the prompt, and "
        "a last line says how many",
        unit="tokens",
        least=0,
    )
    stream_first_chunk_timeout: float = setting(
        "PALIMPSEST_STREAM_FIRST_CHUNK_TIMEOUT_SECONDS",
        90.0,
        "seconds to wait for the first token (Stop is honoured at least every second meanwhile)",
        unit="seconds",
        old=("LLM_STREAM_FIRST_CHUNK_TIMEOUT",),
        least=0.001,
    )
    stream_chunk_timeout: float = setting(
        "PALIMPSEST_STREAM_CHUNK_TIMEOUT_SECONDS",
        60.0,
        "seconds allowed between tokens",
        unit="seconds",
        old=("LLM_STREAM_CHUNK_TIMEOUT",),
        least=0.001,
    )

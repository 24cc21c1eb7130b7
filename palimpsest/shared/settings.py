"""Configuration from environment variables, each with a working default (docs/settings.md lists them all)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise SystemExit(f"{name} must be an integer, got {raw!r}") from None


def _env_optional_int(name: str) -> int | None:
    """Unset or empty: None (the feature is off)."""
    raw = os.environ.get(name, "").strip()
    return None if raw == "" else _env_int(name, 0)


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise SystemExit(f"{name} must be a number, got {raw!r}") from None


def _env_at_least(name: str, default: float, least: float) -> float:
    """A finite number, ``least`` or more."""
    value = _env_float(name, default)
    if not (math.isfinite(value) and value >= least):
        raise SystemExit(f"{name} must be a number of at least {least:g}, got {os.environ.get(name)!r}")
    return value


def _env_count(name: str, default: int) -> int:
    """A whole number, 0 or more."""
    value = _env_int(name, default)
    if value < 0:
        raise SystemExit(f"{name} must be 0 or more, got {value}")
    return value


def _share_file_roots(raw: str, data_dir: Path) -> tuple[Path, ...]:
    """PALIMPSEST_SHARE_FILE_ROOTS: absolute folders, separated by the OS path separator."""
    if not raw.strip():
        return (data_dir / "workspace",)
    roots = tuple(Path(p.strip()) for p in raw.split(os.pathsep) if p.strip())
    relative = [str(p) for p in roots if not p.is_absolute()]
    if relative:
        raise SystemExit(f"PALIMPSEST_SHARE_FILE_ROOTS must list absolute folders, got {', '.join(relative)}")
    return roots


# PALIMPSEST_SANDBOX: what the operator says of commands' sandbox (palimpsest/agent/sandbox/policy.py).
SANDBOX_MODES = ("auto", "off", "required")


def _env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = os.environ.get(name, "").strip().lower() or default
    if raw not in choices:
        raise SystemExit(f"{name} must be one of {', '.join(choices)}, got {os.environ.get(name)!r}")
    return raw


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


def default_data_dir() -> Path:
    """Where Palimpsest keeps its embedded database and files.

    As root the embedded PostgreSQL must run as its own system user, which needs to traverse every
    parent folder; a folder made for it under /var/lib keeps home directories closed.
    """
    if os.name == "posix" and os.geteuid() == 0:
        return Path("/var/lib/palimpsest")
    return Path(platformdirs.user_data_dir("palimpsest"))


@dataclass(frozen=True)
class Settings:
    database_url: str = ""
    data_dir: Path = field(default_factory=default_data_dir)
    files_root: Path = field(default_factory=lambda: default_data_dir() / "session_files")
    ollama_host: str = "http://127.0.0.1:11434"
    store_addr: str = "127.0.0.1:50051"
    compressor_addr: str = "127.0.0.1:50052"
    agent_addr: str = "127.0.0.1:50053"
    profiles_path: str = ""
    auth_enabled: bool = False
    jwt_secret: str = ""
    stream_first_chunk_timeout: float = 90.0
    stream_chunk_timeout: float = 60.0
    # gRPC transport
    max_message_bytes: int = 64 * 1024 * 1024
    # The request limit of every RPC that carries no conversation content (the others take
    # max_message_bytes): gRPC's own default; such a request holds a few kilobytes.
    max_small_request_bytes: int = 4 * 1024 * 1024
    keepalive_time_ms: int = 30_000
    keepalive_timeout_ms: int = 10_000
    grace_seconds: float = 5.0
    # Servers ask each client to reconnect after this long (0: never); calls in flight finish first.
    # Clients then resolve a `dns:///` name again and reach replicas started since.
    max_connection_age_s: float = 0.0
    # Deadlines of calls between the services (when the caller sets none) and of one SQL statement.
    rpc_timeout_s: float = 30.0
    compress_timeout_s: float = 600.0
    db_command_timeout_s: float = 30.0
    # How long the Agent keeps retrying the write that stores a turn's answer (the store restarting).
    reply_write_deadline_s: float = 30.0
    # How long a turn waits for a client's answer to one of its tools' calls (a request may ask for
    # another wait, up to the maximum).
    client_tool_timeout_s: int = 300
    client_tool_max_timeout_s: int = 3600
    session_titles: bool = True
    # Prometheus /metrics on this port, on the host the service listens on (None: off; 0: a free port).
    metrics_port: int | None = None
    # Traces go over OTLP to this collector (empty: no tracing at all).
    otlp_endpoint: str = ""
    # TLS of every gRPC server (certificate and key, PEM files), and mutual TLS when a client CA is
    # set: callers must then present a certificate it signed. Channels use TLS when a CA is set,
    # trusting servers it signed, and present the certificate and key (when set) as the caller's.
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    tls_ca: str = ""
    agent_warm_mb: int = 64  # the Agent's warm sessions, at most this many megabytes
    # Turns claimed in the store so one session never runs two at once across Agent replicas (two
    # more calls per turn); a dead replica's claim runs out after turn_claim_ttl_s.
    turn_claims: bool = False
    turn_claim_ttl_s: int = 30
    # Stop and WatchSession across Agent replicas, through the store's session bus (PostgreSQL
    # LISTEN/NOTIFY): every event of every turn is published once more, so off for one Agent.
    replica_events: bool = False
    # A turn's events kept for ResumeStream: while it runs and this long after it ends, and all
    # turns' together within stream_keep_bytes (ended turns go first).
    stream_keep_s: float = 300.0
    stream_keep_bytes: int = 64 * 1024 * 1024
    # Streams that follow a session (WatchSession, ResumeStream) one Agent serves at once, per user
    # and per session (0: no limit): each is a write per event of every turn it follows.
    watchers_per_user: int = 48
    watchers_per_session: int = 24
    # After the Compressor left a call unanswered, turns go on without it while one health check
    # at a time asks it again, this often, until it answers.
    compressor_retry_s: float = 2.0
    # share_file: the Agent's local folders files may be copied from, and its own size cap.
    share_file_roots: tuple[Path, ...] = field(default_factory=lambda: (default_data_dir() / "workspace",))
    share_file_max_bytes: int = 1024 * 1024 * 1024
    # Commands: "auto" (each profile's "sandbox" decides), "off" (never sandboxed: lifts sessions'
    # sandbox pins), "required" (always sandboxed, whatever the profile says).
    sandbox_mode: str = "auto"
    # SessionStore
    files_max_bytes: int = 200 * 1024 * 1024
    # One stored message (content, thinking, tool calls, images) at most: a read always holds a
    # whole message, so this stays within a response's budget (half the gRPC limit).
    message_max_bytes: int = 16 * 1024 * 1024
    hot_window_messages: int = 2000
    hot_window_bytes: int = 32 * 1024 * 1024
    file_sweep_interval_s: float = 3600.0
    # Per owner (0: no limit): sessions, and bytes of messages and files over all of them.
    owner_max_sessions: int = 10_000
    owner_max_bytes: int = 10 * 1024 * 1024 * 1024
    # What the agent remembers about each owner: at most this many entries and characters in all,
    # and this many writes of tainted conversations waiting for the owner's approval.
    memory_max_entries: int = 40
    memory_max_chars: int = 2_000
    memory_max_pending: int = 20
    # The memory message in the prompt at most this many tokens (at the heuristic 1.8 chars a token,
    # which a full memory of the default caps stays under).
    memory_prompt_tokens: int = 1_200
    # Share links are derived from this key; empty: the key in <data_dir>/share.key, made once.
    share_key: str = ""
    # Memory search by meaning (the store embeds chunks with Ollama's /api/embed; "" turns it off).
    embed_model: str = "nomic-embed-text"
    embed_timeout_s: float = 2.0
    embed_retry_s: float = 30.0
    # A session's messages are embedded once it has been quiet this long: not during its turn, when
    # the embedder would share Ollama with the model answering.
    embed_messages_quiet_s: float = 10.0
    # The cosine similarity below which a chunk is not counted as near in meaning: about what
    # unrelated texts reach with the model (nomic-embed-text: 0.4–0.5).
    embed_min_similarity: float = 0.5
    # Compression (seed defaults)
    compression_enabled: bool = True
    compression_threshold: float = 0.90
    compression_target: float = 0.65
    compression_prune_tool_results: bool = True
    # A turn's tool results pruned to previews when the turn ends (not in the seed: see departures).
    compression_prune_after_turn: bool = True
    # What compressions drop is indexed as memory chunks (000: "indexing is gated by memory_search_enabled").
    memory_search_enabled: bool = True
    # An automatic compression must free at least this share of the window, or it is not run.
    compression_min_freed: float = 0.05
    keep_recent: int = 4
    summary_temperature: float = 0.3
    summary_max_tokens: int = 6000
    output_reserve_tokens: int = 2048
    message_token_budget: int = 0
    image_tokens_fallback: int = 1024
    ollama_num_ctx: int = 8192
    # num_ctx of a separate summarizer model; 0: ollama_num_ctx
    summarizer_num_ctx: int = 0

    @classmethod
    def from_env(cls) -> "Settings":
        data_dir = Path(_env("PALIMPSEST_DATA_DIR", str(default_data_dir())))
        return cls(
            database_url=_env("DATABASE_URL", ""),
            data_dir=data_dir,
            files_root=Path(_env("PALIMPSEST_FILES_ROOT", str(data_dir / "session_files"))),
            ollama_host=_normalize_ollama_host(_env("OLLAMA_HOST", "http://127.0.0.1:11434")),
            store_addr=_env("PALIMPSEST_STORE_ADDR", "127.0.0.1:50051"),
            compressor_addr=_env("PALIMPSEST_COMPRESSOR_ADDR", "127.0.0.1:50052"),
            agent_addr=_env("PALIMPSEST_AGENT_ADDR", "127.0.0.1:50053"),
            profiles_path=_env("PALIMPSEST_PROFILES", ""),
            auth_enabled=_env_bool("PALIMPSEST_AUTH_ENABLED", False),
            jwt_secret=_env("PALIMPSEST_JWT_SECRET", ""),
            stream_first_chunk_timeout=_env_float("LLM_STREAM_FIRST_CHUNK_TIMEOUT", 90.0),
            stream_chunk_timeout=_env_float("LLM_STREAM_CHUNK_TIMEOUT", 60.0),
            max_message_bytes=_env_int("PALIMPSEST_MAX_MESSAGE_BYTES", 64 * 1024 * 1024),
            max_small_request_bytes=_env_int("PALIMPSEST_MAX_SMALL_REQUEST_BYTES", 4 * 1024 * 1024),
            keepalive_time_ms=_env_int("PALIMPSEST_KEEPALIVE_TIME_MS", 30_000),
            keepalive_timeout_ms=_env_int("PALIMPSEST_KEEPALIVE_TIMEOUT_MS", 10_000),
            grace_seconds=_env_float("PALIMPSEST_GRACE_SECONDS", 5.0),
            max_connection_age_s=_env_float("PALIMPSEST_MAX_CONNECTION_AGE_S", 0.0),
            rpc_timeout_s=_env_float("PALIMPSEST_RPC_TIMEOUT_S", 30.0),
            compress_timeout_s=_env_float("PALIMPSEST_COMPRESS_TIMEOUT_S", 600.0),
            db_command_timeout_s=_env_float("PALIMPSEST_DB_COMMAND_TIMEOUT_S", 30.0),
            reply_write_deadline_s=_env_float("PALIMPSEST_REPLY_WRITE_DEADLINE_S", 30.0),
            client_tool_timeout_s=_env_int("PALIMPSEST_CLIENT_TOOL_TIMEOUT_S", 300),
            client_tool_max_timeout_s=_env_int("PALIMPSEST_CLIENT_TOOL_MAX_TIMEOUT_S", 3600),
            session_titles=_env_bool("PALIMPSEST_SESSION_TITLES", True),
            metrics_port=_env_optional_int("PALIMPSEST_METRICS_PORT"),
            otlp_endpoint=(
                _env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "") or _env("OTEL_EXPORTER_OTLP_ENDPOINT", "")
            ).strip(),
            tls_cert=_env("PALIMPSEST_TLS_CERT", "").strip(),
            tls_key=_env("PALIMPSEST_TLS_KEY", "").strip(),
            tls_client_ca=_env("PALIMPSEST_TLS_CLIENT_CA", "").strip(),
            tls_ca=_env("PALIMPSEST_TLS_CA", "").strip(),
            agent_warm_mb=_env_int("PALIMPSEST_AGENT_WARM_MB", 64),
            turn_claims=_env_bool("PALIMPSEST_TURN_CLAIMS", False),
            replica_events=_env_bool("PALIMPSEST_REPLICA_EVENTS", False),
            stream_keep_s=_env_at_least("PALIMPSEST_STREAM_KEEP_S", 300.0, 0),
            stream_keep_bytes=int(_env_at_least("PALIMPSEST_STREAM_KEEP_MB", 64, 1) * 1024 * 1024),
            watchers_per_user=_env_count("PALIMPSEST_WATCHERS_PER_USER", 48),
            watchers_per_session=_env_count("PALIMPSEST_WATCHERS_PER_SESSION", 24),
            compressor_retry_s=_env_at_least("PALIMPSEST_COMPRESSOR_RETRY_S", 2.0, 0.1),
            turn_claim_ttl_s=_env_int("PALIMPSEST_TURN_CLAIM_TTL_S", 30),
            share_file_roots=_share_file_roots(_env("PALIMPSEST_SHARE_FILE_ROOTS", ""), data_dir),
            share_file_max_bytes=_env_int("SHARE_FILE_MAX_SIZE_MB", 1024) * 1024 * 1024,
            sandbox_mode=_env_choice("PALIMPSEST_SANDBOX", "auto", SANDBOX_MODES),
            files_max_bytes=_env_int("PALIMPSEST_FILES_MAX_MB", 200) * 1024 * 1024,
            message_max_bytes=_env_int("PALIMPSEST_MESSAGE_MAX_MB", 16) * 1024 * 1024,
            hot_window_messages=_env_int("PALIMPSEST_HOT_WINDOW_MESSAGES", 2000),
            hot_window_bytes=_env_int("PALIMPSEST_HOT_WINDOW_MB", 32) * 1024 * 1024,
            file_sweep_interval_s=_env_float("PALIMPSEST_FILE_SWEEP_INTERVAL_S", 3600.0),
            share_key=_env("PALIMPSEST_SHARE_KEY", ""),
            embed_model=_env("PALIMPSEST_EMBED_MODEL", "nomic-embed-text").strip(),
            embed_timeout_s=_env_float("PALIMPSEST_EMBED_TIMEOUT_S", 2.0),
            embed_retry_s=_env_float("PALIMPSEST_EMBED_RETRY_S", 30.0),
            embed_messages_quiet_s=_env_float("PALIMPSEST_EMBED_MESSAGES_QUIET_S", 10.0),
            embed_min_similarity=_env_float("PALIMPSEST_EMBED_MIN_SIMILARITY", 0.5),
            owner_max_sessions=_env_int("PALIMPSEST_OWNER_MAX_SESSIONS", 10_000),
            owner_max_bytes=_env_int("PALIMPSEST_OWNER_MAX_MB", 10 * 1024) * 1024 * 1024,
            memory_max_entries=_env_int("PALIMPSEST_MEMORY_MAX_ENTRIES", 40),
            memory_max_chars=_env_int("PALIMPSEST_MEMORY_MAX_CHARS", 2_000),
            memory_max_pending=_env_int("PALIMPSEST_MEMORY_MAX_PENDING", 20),
            memory_prompt_tokens=_env_int("PALIMPSEST_MEMORY_PROMPT_TOKENS", 1_200),
            compression_enabled=_env_bool("CONTEXT_COMPRESSION_ENABLED", True),
            compression_threshold=_env_float("CONTEXT_COMPRESSION_THRESHOLD", 0.90),
            compression_target=_env_float("CONTEXT_COMPRESSION_TARGET", 0.65),
            compression_prune_tool_results=_env_bool("CONTEXT_COMPRESSION_PRUNE_TOOL_RESULTS", True),
            compression_prune_after_turn=_env_bool("CONTEXT_COMPRESSION_PRUNE_AFTER_TURN", True),
            memory_search_enabled=_env_bool("PALIMPSEST_MEMORY_SEARCH_ENABLED", True),
            compression_min_freed=_env_float("CONTEXT_COMPRESSION_MIN_FREED", 0.05),
            keep_recent=_env_int("CONTEXT_KEEP_RECENT", 4),
            summary_temperature=_env_float("CONTEXT_SUMMARY_TEMPERATURE", 0.3),
            summary_max_tokens=_env_int("CONTEXT_SUMMARY_MAX_TOKENS", 6000),
            output_reserve_tokens=_env_int("OUTPUT_RESERVE_TOKENS", 2048),
            message_token_budget=_env_int("CONTEXT_MESSAGE_TOKEN_BUDGET", 0),
            image_tokens_fallback=_env_int("CONTEXT_IMAGE_TOKENS", 1024),
            ollama_num_ctx=_env_int("OLLAMA_NUM_CTX", 8192),
            summarizer_num_ctx=_env_int("CONTEXT_SUMMARIZER_NUM_CTX", 0),
        )

    @property
    def read_budget_bytes(self) -> int:
        """What one response may carry in messages: half the gRPC limit leaves room for the
        fields around them and for encoding overhead."""
        return self.max_message_bytes // 2


def _normalize_ollama_host(raw: str) -> str:
    """Accept Ollama's own forms: `host`, `host:port`, `0.0.0.0`, with or without a scheme."""
    host = raw.strip().rstrip("/")
    if "://" not in host:
        host = "http://" + host
    scheme, rest = host.split("://", 1)
    if ":" not in rest.split("/", 1)[0]:
        rest = rest + ":11434"
    return f"{scheme}://{rest.replace('0.0.0.0', '127.0.0.1')}"

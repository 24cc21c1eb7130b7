"""Settings every service reads: addresses, the gRPC transport, auth, TLS and observability."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from palimpsest.shared.settings.declare import Env, setting, setting_from
from palimpsest.shared.settings.paths import default_data_dir


@dataclass(frozen=True)
class ServiceSettings:
    """Every service"""

    store_addr: str = setting(
        "PALIMPSEST_STORE_ADDR",
        "127.0.0.1:50051",
        "SessionStore address (listen and dial)",
    )
    compressor_addr: str = setting(
        "PALIMPSEST_COMPRESSOR_ADDR",
        "127.0.0.1:50052",
        "Compressor address; a comma list names replicas, balanced round-robin",
    )
    compressor_listen: str = setting(
        "PALIMPSEST_COMPRESSOR_LISTEN",
        "",
        "where one Compressor replica listens",
        derive=lambda s: s.compressor_addr.split(",")[0].strip(),
        default_doc="first of `PALIMPSEST_COMPRESSOR_ADDR`",
    )
    agent_addr: str = setting(
        "PALIMPSEST_AGENT_ADDR",
        "127.0.0.1:50053",
        "Agent address",
    )
    auth_enabled: bool = setting(
        "PALIMPSEST_AUTH_ENABLED",
        False,
        "require `authorization: Bearer <JWT>` (HS256, claims `sub` and `role`)",
    )
    jwt_secret: str = setting(
        "PALIMPSEST_JWT_SECRET",
        "",
        "the shared HS256 secret",
    )
    max_message_bytes: int = setting(
        "PALIMPSEST_MAX_MESSAGE_BYTES",
        64 * 1024 * 1024,
        "gRPC message size limit, both directions; as a request, only for the RPCs whose requests carry a "
        "conversation's content (the store's `AppendMessages`, `AppendStream`, `CommitCompression`, "
        "`IndexChunks`, `PutFile`, `PublishSessionMessages`; the Compressor's `EstimateTokens`, "
        "`CheckContextSize`; the Agent's `RunStream`, `Run`, `RunEphemeral`). A read of a session carries at "
        "most half of it in messages (32 MB): `GetSession` returns the newest display messages that fit "
        "(`has_more_messages`: older ones through `GetHistoryPage`) and the context in parts "
        "(`has_more_context`, continue with `context_offset`), `GetHistoryPage`, `GetArchivedMessages` and "
        "`GetShared` stop early and say `has_more`",
        unit="bytes",
        least=1024,
    )
    max_small_request_bytes: int = setting(
        "PALIMPSEST_MAX_SMALL_REQUEST_BYTES",
        4 * 1024 * 1024,
        "the largest request of every other RPC (gRPC's own default; such a request holds a few kilobytes: "
        "ids, a query, settings). A larger one is RESOURCE_EXHAUSTED naming the method, its limit and this "
        "setting, refused before it is decoded — but after it was received: gRPC has one receive limit per "
        "server, `PALIMPSEST_MAX_MESSAGE_BYTES`, so this one is applied to the bytes it received (Identity "
        "and errors)",
        unit="bytes",
        least=1024,
    )
    keepalive_time_ms: int = setting(
        "PALIMPSEST_KEEPALIVE_TIME_MS",
        30_000,
        "gRPC keepalive: how often a ping is sent on an idle connection",
        unit="ms",
        least=1,
    )
    keepalive_timeout_ms: int = setting(
        "PALIMPSEST_KEEPALIVE_TIMEOUT_MS",
        10_000,
        "gRPC keepalive: how long a ping waits for its answer before the connection is closed",
        unit="ms",
        least=1,
    )
    grace_seconds: float = setting(
        "PALIMPSEST_GRACE_SECONDS",
        5.0,
        "graceful-stop grace on SIGTERM: health turns NOT_SERVING, new calls are refused, calls in flight get "
        "this long to finish (the Agent stops turns still running a second before it ends, so their streams "
        "end with `stream_end`)",
        unit="seconds",
        least=0,
    )
    max_connection_age_s: float = setting(
        "PALIMPSEST_MAX_CONNECTION_AGE_SECONDS",
        0.0,
        "servers send each client connection away (HTTP/2 GOAWAY) after this long, ±10%; calls in flight run "
        "to their end and new ones go on a new connection, for which the client resolves a `dns:///` address "
        "again — so replicas started since get their share. Set in the Kubernetes manifests (300)",
        unit="seconds",
        old=("PALIMPSEST_MAX_CONNECTION_AGE_S",),
        least=0,
        default_doc="`0` (never)",
    )
    rpc_timeout_s: float = setting(
        "PALIMPSEST_RPC_TIMEOUT_SECONDS",
        30.0,
        "deadline of a call between the services when the caller sets none (a Compressor that lets one pass "
        "is skipped by the next turns: Identity and errors)",
        unit="seconds",
        old=("PALIMPSEST_RPC_TIMEOUT_S",),
        least=0.001,
    )
    compress_timeout_s: float = setting(
        "PALIMPSEST_COMPRESS_TIMEOUT_SECONDS",
        600.0,
        "the same for `Compress` (it waits for a summary) and file streams",
        unit="seconds",
        old=("PALIMPSEST_COMPRESS_TIMEOUT_S",),
        least=0.001,
    )
    metrics_port: int | None = setting(
        "PALIMPSEST_METRICS_PORT",
        None,
        "serve Prometheus metrics at `/metrics` on this port, on the host the service listens on (`0`: any "
        "free port, logged). Off by default so that nothing opens a port you did not ask for; the Kubernetes "
        "manifests set 9464. `make run` gives the store this port, the Compressor the next and the Agent the "
        "one after (Observing, below)",
        least=0,
        default_doc="*(unset: off)*",
    )
    otlp_endpoint: str = setting(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "",
        "send OpenTelemetry traces over OTLP/gRPC to this collector, e.g. `http://otel-collector:4317` "
        "(`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` wins when both are set). Unset, nothing of OpenTelemetry is "
        "loaded. The exporter's other `OTEL_*` settings (headers, certificate, `OTEL_SERVICE_NAME`, "
        "`OTEL_TRACES_SAMPLER`) apply as OpenTelemetry documents them",
        also=("OTEL_EXPORTER_OTLP_ENDPOINT",),
        default_doc="*(unset: off)*",
    )
    tls_cert: str = setting(
        "PALIMPSEST_TLS_CERT",
        "",
        "PEM certificate (chain): every gRPC server serves TLS with it and its key, and channels present them as "
        "the caller's certificate when the server asks (mutual TLS)",
        default_doc="*(unset: plaintext)*",
    )
    tls_key: str = setting(
        "PALIMPSEST_TLS_KEY",
        "",
        "the key of `PALIMPSEST_TLS_CERT` (PEM)",
        default_doc="*(unset: plaintext)*",
    )
    tls_client_ca: str = setting(
        "PALIMPSEST_TLS_CLIENT_CA",
        "",
        "PEM CA: servers accept only callers with a certificate it signed (mutual TLS; needs the two above)",
    )
    tls_ca: str = setting(
        "PALIMPSEST_TLS_CA",
        "",
        "PEM CA: channels (between the services, and `pal`'s) use TLS and trust servers whose certificate it signed",
        default_doc="*(unset: plaintext)*",
    )
    data_dir: Path = setting_from(
        "PALIMPSEST_DATA_DIR",
        default_data_dir,
        "embedded database, session files, and the Compressor's tokenizers built from Ollama's vocabularies "
        "(`tokenizers/`, one file per model digest). As root the database runs as its own user "
        "(`palimpsest-pg`) from binaries copied here; no existing folder's permissions are ever widened",
        default_doc="`~/.local/share/palimpsest`; `/var/lib/palimpsest` as root",
    )


# Read outside Settings: by clients, and before Settings is (to show why it could not be read).
TOKEN = Env("PALIMPSEST_TOKEN", "clients (`pal`, the Node client): the JWT to send", default_doc="*(empty)*")
DEBUG = Env(
    "PALIMPSEST_DEBUG",
    "`1`: a service that cannot start prints its traceback before its one-line reason (otherwise one line "
    "names the setting and the fix, e.g. `DATABASE_URL`, `PALIMPSEST_PROFILES`)",
)

-- Sessions: one row each; counters kept here so listing never reads history.
CREATE TABLE sessions (
    id                  uuid PRIMARY KEY,
    owner               text,                          -- NULL: legacy, admin-only
    profile_id          text        NOT NULL,
    name                text        NOT NULL DEFAULT '',
    pinned              boolean     NOT NULL DEFAULT false,
    provider            text        NOT NULL DEFAULT '',
    model               text        NOT NULL DEFAULT '',
    created_at          timestamptz NOT NULL DEFAULT now(),
    last_active         timestamptz NOT NULL DEFAULT now(),
    context_token_count bigint      NOT NULL DEFAULT 0,
    revision            bigint      NOT NULL DEFAULT 0,
    next_seq            bigint      NOT NULL DEFAULT 1,
    metadata            jsonb       NOT NULL DEFAULT '{}',
    external_refs       jsonb       NOT NULL DEFAULT '[]',
    untrusted_ingested  boolean     NOT NULL DEFAULT false,
    episode_untrusted   boolean     NOT NULL DEFAULT false,
    planning_logs       jsonb       NOT NULL DEFAULT '[]',
    display_count       bigint      NOT NULL DEFAULT 0,
    preview             text        NOT NULL DEFAULT '',
    hot_count           bigint      NOT NULL DEFAULT 0,
    hot_bytes           bigint      NOT NULL DEFAULT 0
);
CREATE INDEX sessions_owner_last_active ON sessions (owner, pinned DESC, last_active DESC);
CREATE INDEX sessions_last_active ON sessions (pinned DESC, last_active DESC);

-- One row per message: appending is O(new messages).
CREATE TABLE session_messages (
    session_id              uuid        NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    seq                     bigint      NOT NULL,
    role                    text        NOT NULL,
    content                 text        NOT NULL DEFAULT '',
    thinking                text        NOT NULL DEFAULT '',
    tool_calls              jsonb       NOT NULL DEFAULT '[]',
    tool_call_id            text        NOT NULL DEFAULT '',
    name                    text        NOT NULL DEFAULT '',
    images                  bytea[]     NOT NULL DEFAULT '{}',
    files                   text[]      NOT NULL DEFAULT '{}',
    metadata                jsonb       NOT NULL DEFAULT '{}',
    is_context              boolean     NOT NULL DEFAULT true,
    is_display              boolean     NOT NULL DEFAULT true,
    is_plan                 boolean     NOT NULL DEFAULT false,
    is_compression          boolean     NOT NULL DEFAULT false,
    is_summary              boolean     NOT NULL DEFAULT false,
    is_compression_critical boolean     NOT NULL DEFAULT false,
    is_recall               boolean     NOT NULL DEFAULT false,
    elapsed_seconds         double precision NOT NULL DEFAULT 0,
    tool_call_count         integer     NOT NULL DEFAULT 0,
    token_count             integer     NOT NULL DEFAULT 0,
    created_at              timestamptz NOT NULL DEFAULT now(),
    breadcrumbs             text[]      NOT NULL DEFAULT '{}',
    replaces_first          bigint,
    replaces_last           bigint,
    PRIMARY KEY (session_id, seq)
);
CREATE INDEX session_messages_context ON session_messages (session_id, seq) WHERE is_context;

-- Rows moved out of the hot table past the hot window; read back for history pages.
CREATE TABLE session_messages_archive (LIKE session_messages INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE session_messages_archive ADD PRIMARY KEY (session_id, seq);
ALTER TABLE session_messages_archive
    ADD CONSTRAINT session_messages_archive_session FOREIGN KEY (session_id) REFERENCES sessions (id) ON DELETE CASCADE;
ALTER TABLE session_messages_archive ADD COLUMN archived_at timestamptz NOT NULL DEFAULT now();
CREATE INDEX session_messages_archive_context ON session_messages_archive (session_id, seq) WHERE is_context;

-- Verbatim raw history dropped from the context by compression; append-only.
CREATE TABLE memory_chunks (
    id           bigserial   PRIMARY KEY,
    session_id   uuid        NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    content      text        NOT NULL,
    content_hash text        NOT NULL,
    first_seq    bigint      NOT NULL DEFAULT 0,
    last_seq     bigint      NOT NULL DEFAULT 0,
    first_at     timestamptz,
    last_at      timestamptz,
    breadcrumbs  text[]      NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (session_id, content_hash)
);

-- One read-only share link per session; looked up by the token's hash.
CREATE TABLE session_shares (
    session_id uuid        PRIMARY KEY REFERENCES sessions (id) ON DELETE CASCADE,
    token      text        NOT NULL,
    token_hash bytea       NOT NULL UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- (prompt chars, real prompt tokens) per model, for the Compressor's calibration line.
CREATE TABLE calibration_observations (
    id          bigserial   PRIMARY KEY,
    model       text        NOT NULL,
    chars       bigint      NOT NULL,
    tokens      bigint      NOT NULL,
    observed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX calibration_observations_model ON calibration_observations (model, id DESC);

-- The real prompt size of each session's last model call.
CREATE TABLE session_baselines (
    session_id        uuid        PRIMARY KEY REFERENCES sessions (id) ON DELETE CASCADE,
    tokens            bigint      NOT NULL,
    through_seq       bigint      NOT NULL,
    model             text        NOT NULL DEFAULT '',
    context_truncated boolean     NOT NULL DEFAULT false,
    recorded_at       timestamptz NOT NULL DEFAULT now()
);

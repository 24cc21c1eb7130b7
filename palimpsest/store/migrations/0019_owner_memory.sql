-- What the agent remembers about each owner across sessions: a few entries of text every session of
-- the owner receives in its prompt (a snapshot taken when the session is created and at each of its
-- compressions, kept on the session), and the writes held for the owner's approval.
CREATE TABLE IF NOT EXISTS owner_memory (
    owner      text        PRIMARY KEY,
    revision   bigint      NOT NULL DEFAULT 0,  -- applied changes; an edit naming another is ABORTED
    next_id    bigint      NOT NULL DEFAULT 1,  -- ids of entries and of held writes, one sequence
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS owner_memory_entries (
    owner      text        NOT NULL REFERENCES owner_memory (owner) ON DELETE CASCADE,
    id         bigint      NOT NULL,
    text       text        NOT NULL,
    session_id uuid,                            -- the session that wrote it; NULL: the owner
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (owner, id)
);

-- A tainted conversation's write: applied only when the owner approves it.
CREATE TABLE IF NOT EXISTS owner_memory_pending (
    owner      text        NOT NULL REFERENCES owner_memory (owner) ON DELETE CASCADE,
    id         bigint      NOT NULL,
    action     text        NOT NULL CHECK (action IN ('add', 'replace', 'remove')),
    entry_id   bigint,                          -- replace, remove: the entry it changes
    old_text   text        NOT NULL DEFAULT '', -- that entry's text when the write was held
    text       text        NOT NULL DEFAULT '',
    session_id uuid,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (owner, id)
);

-- The snapshot a session's prompts carry ({"revision", "entries"}); NULL: none taken yet.
ALTER TABLE sessions ADD COLUMN IF NOT EXISTS memory_snapshot jsonb;

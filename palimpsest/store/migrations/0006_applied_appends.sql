-- Appends already applied, by the key their writer chose: a retry after a lost acknowledgement
-- (the store stopped, the network cut between commit and answer) gets the first answer back
-- instead of storing the messages twice. Written in the append's own transaction.
CREATE TABLE applied_appends (
    session_id uuid        NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    key        text        NOT NULL,
    seqs       bigint[]    NOT NULL,
    revision   bigint      NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, key)
);

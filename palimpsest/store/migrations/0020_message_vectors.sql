-- Sessions by meaning from their messages, not only their summaries: a session never compressed has
-- no summary, so 0011 alone left it to the lexical query. Where 0011 made the vector tables (pgvector
-- present), each displayed user or assistant message with text gets one embedding per space.
DO $$
BEGIN
    IF to_regclass('memory_vector_spaces') IS NULL THEN
        RETURN;  -- no pgvector: 0011 said so; sessions are searched by their words only
    END IF;
    CREATE TABLE IF NOT EXISTS message_vectors (
        session_id uuid   NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        seq        bigint NOT NULL,
        model      text   NOT NULL REFERENCES memory_vector_spaces (model) ON DELETE CASCADE,
        embedding  vector NOT NULL,
        PRIMARY KEY (session_id, model, seq)
    );
    -- How far each session's messages are embedded in a space: the indexer's question "what is left"
    -- reads the sessions (one row each, next_seq against this mark), never every message.
    CREATE TABLE IF NOT EXISTS message_vector_marks (
        session_id  uuid   NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        model       text   NOT NULL REFERENCES memory_vector_spaces (model) ON DELETE CASCADE,
        through_seq bigint NOT NULL,
        PRIMARY KEY (session_id, model)
    );
END
$$;

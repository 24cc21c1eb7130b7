-- Memory search by meaning: one embedding per (chunk, embedding model), ranked by cosine similarity
-- beside the lexical scores. pgvector is optional, like pg_trgm in 0009: a server without it (or a
-- role that may not create it) still runs the store, whose memory search then serves the lexical
-- tier only; the store says so once at start (it looks for memory_vectors).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'vector') THEN
        RAISE WARNING 'pgvector is not available: memory search is lexical only';
        RETURN;
    END IF;
    BEGIN
        CREATE EXTENSION IF NOT EXISTS vector;
    EXCEPTION WHEN insufficient_privilege THEN
        RAISE WARNING 'pgvector may not be created by this role (%): memory search is lexical only', SQLERRM;
        RETURN;
    END;
    -- The spaces the index is kept in: the store's embedding model (from_settings) and any model a
    -- profile names, each with the dimensions its vectors were built in. A model answering with other
    -- dimensions than recorded (re-pulled, or another model under the name) has its vectors rebuilt
    -- once; a settings model replaced by another is dropped at start (the new one is built in the
    -- background); a profile's model no search asked for in 30 days is dropped.
    CREATE TABLE IF NOT EXISTS memory_vector_spaces (
        model         text PRIMARY KEY,
        dimensions    integer CHECK (dimensions > 0),
        from_settings boolean NOT NULL DEFAULT false,
        searched_at   timestamptz NOT NULL DEFAULT now()
    );
    -- `vector` without a dimension: the space (model, dimensions) is the store's setting, not the
    -- schema's, and changing it must not need a migration. A search is within one session, whose
    -- few hundred chunks an exact scan ranks in milliseconds, so no ANN index (which would need a
    -- fixed dimension and would filter by session after the fact) is built.
    CREATE TABLE IF NOT EXISTS memory_vectors (
        chunk_id   bigint NOT NULL REFERENCES memory_chunks (id) ON DELETE CASCADE,
        -- A space dropped (its model replaced) takes its vectors along; a replica still on the old
        -- settings cannot add vectors to a space that is gone.
        model      text   NOT NULL REFERENCES memory_vector_spaces (model) ON DELETE CASCADE,
        session_id uuid   NOT NULL,
        embedding  vector NOT NULL,
        PRIMARY KEY (chunk_id, model)
    );
    CREATE INDEX IF NOT EXISTS memory_vectors_session ON memory_vectors (session_id, model);
    -- Sessions by meaning (ListSessions' query, the session_search tool): each summary a compression
    -- wrote, embedded; a session matches when one of its summaries is near the query. Sessions never
    -- compressed have no summary: their words are all still in their messages, which the lexical
    -- query reads.
    CREATE TABLE IF NOT EXISTS summary_vectors (
        session_id uuid   NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        seq        bigint NOT NULL,
        model      text   NOT NULL REFERENCES memory_vector_spaces (model) ON DELETE CASCADE,
        embedding  vector NOT NULL,
        PRIMARY KEY (session_id, seq, model)
    );
    -- The indexer's question, "which summaries have no vector yet", without reading every message.
    CREATE INDEX IF NOT EXISTS session_messages_summaries ON session_messages (session_id, seq) WHERE is_summary;
    CREATE INDEX IF NOT EXISTS session_messages_archive_summaries
        ON session_messages_archive (session_id, seq) WHERE is_summary;
END
$$;

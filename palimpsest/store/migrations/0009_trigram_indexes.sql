-- Substring search (ListSessions' query, SearchMatches) on trigram GIN indexes. Until this
-- migration the store created them on every start, outside the migrations (db._ensure_trigram);
-- the schema now lives here only. IF NOT EXISTS: a database from before already has them.
-- pg_trgm ships with PostgreSQL's contrib, but a server without contrib, or a role that may not
-- create it, still runs the store: substring search then scans, slower but the same answers.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm') THEN
        RAISE WARNING 'pg_trgm is not available: substring search works without trigram indexes, slower';
        RETURN;
    END IF;
    BEGIN
        CREATE EXTENSION IF NOT EXISTS pg_trgm;
    EXCEPTION WHEN insufficient_privilege THEN
        RAISE WARNING 'pg_trgm may not be created by this role (%): substring search scans, slower', SQLERRM;
        RETURN;
    END;
    CREATE INDEX IF NOT EXISTS session_messages_content_trgm ON session_messages USING gin (content gin_trgm_ops);
    CREATE INDEX IF NOT EXISTS session_messages_archive_content_trgm
        ON session_messages_archive USING gin (content gin_trgm_ops);
    CREATE INDEX IF NOT EXISTS sessions_name_trgm ON sessions USING gin (name gin_trgm_ops);
END
$$;

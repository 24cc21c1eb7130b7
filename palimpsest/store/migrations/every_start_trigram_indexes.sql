-- Run on every start, after the versioned migrations (db.migrate). 0009 runs once: a store first
-- started where its role could not create pg_trgm never got the trigram indexes, and every
-- substring search stayed a sequential scan. Once pg_trgm is installed (an operator's
-- CREATE EXTENSION pg_trgm, as the warning advises), the next start builds the missing ones.
-- to_regclass before each CREATE: IF NOT EXISTS alone would still lock the table on every start.
DO $$
DECLARE
    wanted text[][] := ARRAY[
        ['session_messages_content_trgm', 'session_messages', 'content'],
        ['session_messages_archive_content_trgm', 'session_messages_archive', 'content'],
        ['sessions_name_trgm', 'sessions', 'name'],
        ['memory_chunks_content_trgm', 'memory_chunks', 'content']];
    i integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm') THEN
        IF NOT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm') THEN
            RAISE WARNING 'pg_trgm is not available: substring search works without trigram indexes, slower';
            RETURN;
        END IF;
        BEGIN
            CREATE EXTENSION IF NOT EXISTS pg_trgm;  -- the role may have been granted CREATE since
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING 'pg_trgm is not installed and this role may not create it (%): substring search '
                          'scans, slower; as a superuser run CREATE EXTENSION pg_trgm in this database, and the '
                          'next store start builds the indexes', SQLERRM;
            RETURN;
        END;
    END IF;
    FOR i IN 1 .. array_length(wanted, 1) LOOP
        IF to_regclass(wanted[i][1]) IS NULL THEN
            RAISE WARNING 'building trigram index % (pg_trgm is installed now); writes to % wait until it is built',
                          wanted[i][1], wanted[i][2];
            EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I USING gin (%I gin_trgm_ops)',
                           wanted[i][1], wanted[i][2], wanted[i][3]);
        END IF;
    END LOOP;
END
$$;

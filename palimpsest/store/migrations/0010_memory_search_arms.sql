-- Memory search asks three things of a session's chunks: any of the query's words (memory_chunks_tsv),
-- the whole query as a substring, the whole query as a breadcrumb. OR'ed in one WHERE they used no
-- index and read every chunk of the session; as separate arms each needs an index of its own.
CREATE INDEX IF NOT EXISTS memory_chunks_breadcrumbs ON memory_chunks USING gin (breadcrumbs);
-- The substring arm on trigrams where 0009 could create pg_trgm; without it, that arm reads the
-- session's chunks (through the (session_id, content_hash) index), as before.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm') THEN
        CREATE INDEX IF NOT EXISTS memory_chunks_content_trgm ON memory_chunks USING gin (content gin_trgm_ops);
    END IF;
END
$$;

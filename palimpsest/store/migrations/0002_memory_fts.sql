-- Memory search by full-text candidates: word similarity over long chunks cost ~1 ms per chunk,
-- so a session with a thousand chunks took seconds; a GIN index over lexemes picks candidates in ms.
ALTER TABLE memory_chunks ADD COLUMN tsv tsvector GENERATED ALWAYS AS (to_tsvector('simple', content)) STORED;
CREATE INDEX memory_chunks_tsv ON memory_chunks USING gin (tsv);
-- Made by the first release's start-up code (db._ensure_trigram, outside the migrations), hence IF EXISTS;
-- since 0009 every index is made by a migration (0010 makes this one again, for memory search's substring arm).
DROP INDEX IF EXISTS memory_chunks_content_trgm;

-- What each session stores, kept with every write, so a per-owner quota is a sum over the owner's
-- sessions and never reads history. Files uploaded before this migration are not counted.
ALTER TABLE sessions
    ADD COLUMN message_bytes bigint NOT NULL DEFAULT 0,
    ADD COLUMN file_bytes    bigint NOT NULL DEFAULT 0;
UPDATE sessions s SET message_bytes = (
    SELECT coalesce(sum(octet_length(content) + octet_length(thinking) + octet_length(tool_calls::text)
                        + coalesce((SELECT sum(octet_length(i)) FROM unnest(images) i), 0)), 0)
      FROM (SELECT content, thinking, tool_calls, images FROM session_messages WHERE session_id = s.id
            UNION ALL
            SELECT content, thinking, tool_calls, images FROM session_messages_archive WHERE session_id = s.id) m);

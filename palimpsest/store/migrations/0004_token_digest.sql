-- A message's exact token count (token_count, content plus tool calls) and the tokenizer that made
-- it: counted once by the Compressor, then a context's size is a sum the store adds up.
ALTER TABLE session_messages ADD COLUMN token_digest text NOT NULL DEFAULT '';
ALTER TABLE session_messages_archive ADD COLUMN token_digest text NOT NULL DEFAULT '';

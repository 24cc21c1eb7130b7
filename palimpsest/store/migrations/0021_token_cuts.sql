-- The view's cut of a row over a message budget, beside its count (token_count): where the size check
-- cut it and what the cut costs, as {"digest", "head_tokens", "tail_tokens", "head_chars",
-- "tail_chars", "tokens", "md5"}. A Compressor replica that never saw the session cuts and counts
-- a long tool result from this instead of encoding it again; the digest names the tokenizer that
-- made it (a re-pulled model's count does not clear it: a read asks for its own digest).
ALTER TABLE session_messages ADD COLUMN IF NOT EXISTS token_cut jsonb;
ALTER TABLE session_messages_archive ADD COLUMN IF NOT EXISTS token_cut jsonb;

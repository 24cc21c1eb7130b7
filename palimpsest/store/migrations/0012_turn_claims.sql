-- A session's turn claimed by one Agent replica (ClaimTurn): who holds it and until when. An
-- expired claim is free; a crashed holder's claim runs out on its own.
ALTER TABLE sessions ADD COLUMN IF NOT EXISTS turn_holder text NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN IF NOT EXISTS turn_until timestamptz;

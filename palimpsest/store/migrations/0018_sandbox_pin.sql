-- A session whose commands ran in the sandbox keeps them there (the Agent's sandbox pin): sticky,
-- never cleared by the store.
ALTER TABLE sessions ADD COLUMN IF NOT EXISTS sandboxed boolean NOT NULL DEFAULT false;

-- Share tokens are no longer stored: each is derived from the server's share key and this row's
-- nonce, and looked up by its hash, so a database dump alone opens no link.
ALTER TABLE session_shares ADD COLUMN nonce bytea;
-- Links made before keep working through their hash. Such a row has no nonce; its next CreateShare
-- gives it one (a new link) and keeps the old hash here, so both links lead to the session.
ALTER TABLE session_shares ADD COLUMN legacy_token_hash bytea UNIQUE;
ALTER TABLE session_shares DROP COLUMN token;

"""Share links: one read-only link per session, derived from the server's key and the row's nonce
(share_links makes and hashes the tokens; this module keeps their rows)."""

from __future__ import annotations

import hmac
import uuid
from datetime import datetime

import asyncpg

from palimpsest.shared.auth import Identity
from palimpsest.shared.errors import FailedPrecondition, NotFound
from palimpsest.store import share_links
from palimpsest.store.repository.access import lock_session


class Shares:
    def __init__(self, pool: asyncpg.Pool, share_key: bytes) -> None:
        self.pool = pool
        self.share_key = share_key

    async def create_share(self, identity: Identity, session_id: uuid.UUID) -> tuple[str, datetime]:
        """The session's one link, the same on every call (recomputed from the key and the row's
        nonce). A row from before tokens were derived has no nonce: it gets one, so a new link,
        and its old link keeps working through the hash kept aside."""
        async with self.pool.acquire() as conn, conn.transaction():
            row = await lock_session(conn, session_id, identity, None)
            if row["next_seq"] <= 1:
                raise FailedPrecondition(f"session {session_id} has no messages yet; share it after the first one")
            existing = await conn.fetchrow(
                "SELECT nonce, created_at FROM session_shares WHERE session_id = $1", session_id
            )
            if existing is not None and existing["nonce"] is not None:
                return share_links.share_token(self.share_key, session_id, existing["nonce"]), existing["created_at"]
            nonce, token = share_links.new_share(self.share_key, session_id)
            created_at = await conn.fetchval(
                "INSERT INTO session_shares (session_id, nonce, token_hash) VALUES ($1, $2, $3)"
                " ON CONFLICT (session_id) DO UPDATE SET nonce = $2, token_hash = $3,"
                "     legacy_token_hash = session_shares.token_hash"
                " RETURNING created_at",
                session_id,
                nonce,
                share_links.token_hash(token),
            )
            return token, created_at

    async def shared_session(self, token: str) -> asyncpg.Record:
        # Looked up by hash; then the token must be the one this server's key makes for the row
        # (compared in constant time), so a link outlives neither its session nor the key.
        digest = share_links.token_hash(token)
        row = await self.pool.fetchrow(
            "SELECT sh.nonce, sh.token_hash = $1 AS current, s.id, s.name, s.profile_id, s.created_at, s.last_active"
            " FROM session_shares sh JOIN sessions s ON s.id = sh.session_id"
            " WHERE sh.token_hash = $1 OR sh.legacy_token_hash = $1",
            digest,
        )
        if row is None or not _share_matches(row, token, self.share_key):
            raise NotFound("share link not found (the session may have been deleted)")
        return row


def _share_matches(row: asyncpg.Record, token: str, key: bytes) -> bool:
    """A link made from the key and the row's nonce, or (rows from before keys) one whose stored
    hash matched: that hash was the only record of it."""
    if not row["current"] or row["nonce"] is None:
        return True
    expected = share_links.share_token(key, row["id"], row["nonce"])
    return hmac.compare_digest(expected.encode(), token.encode())

"""Share tokens derived from a server key, so the database never holds a working link.

A token is HMAC-SHA256(key, session id ‖ nonce) in URL-safe base64. The row keeps only the nonce
and the token's SHA-256: a dump of the database alone opens nothing, and asking for the link again
recomputes the same token. Rotating the key revokes every link made with the old one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import uuid
from pathlib import Path

NONCE_BYTES = 16
KEY_BYTES = 32  # 256 bits, as the tokens
# A key given by hand shorter than this is a password, not a key.
MIN_KEY_CHARS = 32
KEY_FILE = "share.key"


def share_token(key: bytes, session_id: uuid.UUID, nonce: bytes) -> str:
    digest = hmac.new(key, session_id.bytes + nonce, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def token_hash(token: str) -> bytes:
    """What a share is looked up by."""
    return hashlib.sha256(token.encode()).digest()


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def new_share(key: bytes, session_id: uuid.UUID) -> tuple[bytes, str]:
    """(nonce, token) for a new link, its token never beginning with '-': one in 64 did (URL-safe
    base64), and `pal shared -Xb…` read it as an option, as most command lines would."""
    while True:
        nonce = new_nonce()
        token = share_token(key, session_id, nonce)
        if not token.startswith("-"):
            return nonce, token


def load_key(configured: str, data_dir: Path) -> bytes:
    """The configured key (PALIMPSEST_SHARE_KEY), else the one in `<data_dir>/share.key`, made on
    first use. Every store replica must use the same key, or links made by one fail on another."""
    if configured:
        if len(configured) < MIN_KEY_CHARS:
            raise SystemExit(
                f"PALIMPSEST_SHARE_KEY must be at least {MIN_KEY_CHARS} characters (e.g. `openssl rand -hex 32`)"
            )
        return configured.encode()
    return _key_file(data_dir / KEY_FILE)


def _key_file(path: Path) -> bytes:
    """Read the key file, creating it (mode 0600) when absent. The key is written to a private temp
    file and linked into place, so two replicas starting at once agree on one key and none ever
    reads a half-written file."""
    try:
        return _read_key(path)
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(KEY_BYTES) + "\n")
        try:
            os.link(temp, path)
        except FileExistsError:
            pass  # another replica won: use its key
    finally:
        temp.unlink(missing_ok=True)
    return _read_key(path)


def _read_key(path: Path) -> bytes:
    text = path.read_text().strip()
    if len(text) < MIN_KEY_CHARS:
        raise SystemExit(
            f"{path} holds no usable share key; delete it to make a new one (every existing share link stops working)"
        )
    return text.encode()

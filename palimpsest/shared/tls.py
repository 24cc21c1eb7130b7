"""TLS and mutual TLS credentials from PEM files: one place for the servers, the services' channels
and `pal`. Plain grpc, so the CLI can import it without the services' dependencies.

A server with a certificate and key serves TLS; with a client CA as well, it serves only callers that
present a certificate that CA signed (mutual TLS). A channel with a CA uses TLS and trusts servers
that CA signed; with a certificate and key as well, it presents them (what a mutual-TLS server asks).
"""

from __future__ import annotations

import grpc

# The settings as the environment names them, for messages that say what to fix.
CERT_ENV, KEY_ENV, CLIENT_CA_ENV, CA_ENV = (
    "PALIMPSEST_TLS_CERT",
    "PALIMPSEST_TLS_KEY",
    "PALIMPSEST_TLS_CLIENT_CA",
    "PALIMPSEST_TLS_CA",
)


class TlsSettingError(ValueError):
    """A TLS setting that cannot be used: the message names it and says why."""


def _read(path: str, setting: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise TlsSettingError(f"{setting}: cannot read {path}: {exc.strerror}") from None
    if b"-----BEGIN" not in data:
        raise TlsSettingError(f"{setting}: {path} is not a PEM file")
    return data


def _key_pair(cert: str, key: str) -> tuple[bytes, bytes] | None:
    if bool(cert) != bool(key):
        missing = KEY_ENV if cert else CERT_ENV
        raise TlsSettingError(
            f"{missing} is required with {CERT_ENV if cert else KEY_ENV}: a certificate goes with its key"
        )
    if not cert:
        return None
    return _read(key, KEY_ENV), _read(cert, CERT_ENV)


def server_credentials(cert: str, key: str, client_ca: str = "") -> grpc.ServerCredentials | None:
    """None: plaintext (no certificate set)."""
    pair = _key_pair(cert, key)
    if pair is None:
        if client_ca:
            raise TlsSettingError(f"{CLIENT_CA_ENV} needs {CERT_ENV} and {KEY_ENV}: mutual TLS is TLS first")
        return None
    roots = _read(client_ca, CLIENT_CA_ENV) if client_ca else None
    return grpc.ssl_server_credentials([pair], root_certificates=roots, require_client_auth=roots is not None)


def channel_credentials(ca: str, cert: str = "", key: str = "") -> grpc.ChannelCredentials | None:
    """None: plaintext (no CA set). The certificate and key are offered only over TLS."""
    if not ca:
        return None
    pair = _key_pair(cert, key)
    return grpc.ssl_channel_credentials(
        root_certificates=_read(ca, CA_ENV),
        private_key=pair[0] if pair else None,
        certificate_chain=pair[1] if pair else None,
    )

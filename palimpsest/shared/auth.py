"""Caller identity from request metadata (`authorization: Bearer <JWT>`, HS256, claims sub and role)."""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import grpc
import jwt

from palimpsest.shared.errors import PermissionDenied, Unauthenticated

ANONYMOUS = "anonymous"
ADMIN_ROLE = "admin"
# The services' own identity: what they learn about models (calibration reports, baselines) is
# written under it, never under an end user's token, so no user can bend another's counts.
SERVICE_ROLE = "service"
SERVICE_SUB = "palimpsest-services"


@dataclass(frozen=True)
class Identity:
    sub: str
    role: str = "user"
    # With auth off every session belongs to `anonymous` and access checks are skipped.
    enforced: bool = True

    @property
    def is_admin(self) -> bool:
        return self.role == ADMIN_ROLE

    @property
    def is_service(self) -> bool:
        """Auth off, or a token of the services themselves (or an admin's)."""
        return not self.enforced or self.role in (SERVICE_ROLE, ADMIN_ROLE)

    def require_service(self, what: str) -> None:
        if not self.is_service:
            raise PermissionDenied(f"{what} is written by the Palimpsest services only")

    def can_access(self, owner: str | None) -> bool:
        """Owners see their sessions, admins and the services see all, ownerless (legacy) sessions are
        admin-only."""
        if not self.enforced or self.is_admin or self.role == SERVICE_ROLE:
            return True
        return bool(owner) and owner == self.sub

    def require_access(self, owner: str | None, session_id: str) -> None:
        if not self.can_access(owner):
            raise PermissionDenied(f"session {session_id} belongs to another owner")

    @property
    def owner_for_new_session(self) -> str:
        return self.sub


AUTH_OFF = Identity(sub=ANONYMOUS, role=ADMIN_ROLE, enforced=False)


# A call's metadata as gRPC hands it over (grpc.aio.Metadata, or pairs): values are str, or bytes for -bin keys.
Metadata = Iterable[tuple[str, str | bytes]]


def bearer_token(metadata: Metadata | None) -> str | None:
    for key, value in metadata or ():
        if key.lower() == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            scheme, _, token = text.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Unauthenticated("authorization metadata must be 'Bearer <token>'")
            return token.strip()
    return None


def identity_from_metadata(metadata: Metadata | None, *, enabled: bool, secret: str) -> Identity:
    if not enabled:
        return AUTH_OFF
    token = bearer_token(metadata)
    if token is None:
        raise Unauthenticated("missing authorization metadata: send 'authorization: Bearer <JWT>'")
    try:
        claims = jwt.decode(token, secret, algorithms=["HS256"], options={"require": ["sub"]})
    except jwt.ExpiredSignatureError:
        raise Unauthenticated("token expired") from None
    except jwt.InvalidTokenError as exc:
        raise Unauthenticated(f"invalid token: {exc}") from None
    sub = str(claims["sub"]).strip()
    if not sub:
        raise Unauthenticated("invalid token: empty sub claim")
    return Identity(sub=sub, role=str(claims.get("role") or "user"))


# Who the call being served is, verified by the server's interceptor before it read the request
# (palimpsest/shared/server.py): servicers ask ``caller()`` and the token is decoded once per call.
_served: contextvars.ContextVar[Identity | None] = contextvars.ContextVar("palimpsest_identity", default=None)


def serve_identity(identity: Identity) -> None:
    """The verified caller of the call being served (in its task, and the tasks it starts)."""
    _served.set(identity)


def caller() -> Identity:
    """The caller of the call being served; refused when none was verified (a method the server
    lets in without credentials, such as GetShared, has no caller)."""
    identity = _served.get()
    if identity is None:
        raise Unauthenticated("this call carries no verified credentials")
    return identity


def forwarded_metadata(context: grpc.aio.ServicerContext | None) -> tuple[tuple[str, str], ...]:
    """The caller's credentials, passed on to the services this one calls."""
    return _authorization(context.invocation_metadata() if context is not None else None)


def _authorization(metadata: Metadata | None) -> tuple[tuple[str, str], ...]:
    for key, value in metadata or ():
        if key.lower() == "authorization":
            return (("authorization", value if isinstance(value, str) else value.decode()),)
    return ()


# The credentials of the call being served, set by the server's guard for every RPC (tasks the
# handler starts copy them): the client interceptor puts them on every call this service makes
# while serving it. SERVICE_CREDENTIALS instead: the call is made on the services' own behalf.
SERVICE_CREDENTIALS = None
_credentials: contextvars.ContextVar[tuple[tuple[str, str], ...] | None] = contextvars.ContextVar(
    "palimpsest_credentials", default=()
)


def serve_caller(invocation_metadata: Metadata | None) -> None:
    """From here on (in this task and the tasks it starts) outgoing calls carry the credentials of
    the caller whose request metadata this is."""
    _credentials.set(_authorization(invocation_metadata))


@contextlib.contextmanager
def as_service() -> Iterator[None]:
    """Calls made inside carry the services' own token: what they learn about models (calibration
    reports, baselines) is never written under an end user's name."""
    token = _credentials.set(SERVICE_CREDENTIALS)
    try:
        yield
    finally:
        _credentials.reset(token)


def serving_credentials() -> tuple[tuple[str, str], ...] | None:
    """Whose credentials calls made now carry: the served caller's (their metadata), or None
    under ``as_service()``."""
    return _credentials.get()


def outgoing_credentials(enabled: bool, secret: str) -> tuple[tuple[str, str], ...]:
    """What an outgoing call carries now: the served caller's credentials, or the services' own."""
    found = _credentials.get()
    return service_metadata(enabled, secret) if found is SERVICE_CREDENTIALS else found


# A call the services make for a user carries the user's token, so the user's access is what is
# checked; what only the services may write with it (a model report folded into the Agent's
# append of a reply) is vouched for by the services' own token in this header beside it.
SERVICE_VOUCH_HEADER = "x-palimpsest-service"


@functools.lru_cache(maxsize=4)
def vouching_metadata(enabled: bool, secret: str) -> tuple[tuple[str, str], ...]:
    """The services' vouch to send beside a user's credentials (empty with auth off)."""
    if not enabled:
        return ()
    return ((SERVICE_VOUCH_HEADER, make_token(SERVICE_SUB, secret, SERVICE_ROLE)),)


def vouched_by_services(metadata: Metadata | None, *, enabled: bool, secret: str) -> bool:
    """True when the call carries a valid services' vouch (always, with auth off)."""
    if not enabled:
        return True
    for key, value in metadata or ():
        if key.lower() == SERVICE_VOUCH_HEADER:
            token = value.decode() if isinstance(value, bytes) else value
            try:
                claims = jwt.decode(token, secret, algorithms=["HS256"], options={"require": ["sub"]})
            except jwt.InvalidTokenError:
                return False
            return claims.get("role") == SERVICE_ROLE
    return False


@functools.lru_cache(maxsize=4)  # signed once per process, not on every report
def service_metadata(enabled: bool, secret: str) -> tuple[tuple[str, str], ...]:
    """Credentials for a call the services make on their own behalf (empty with auth off)."""
    if not enabled:
        return ()
    return (("authorization", f"Bearer {make_token(SERVICE_SUB, secret, SERVICE_ROLE)}"),)


def make_token(sub: str, secret: str, role: str = "user", ttl_seconds: int | None = None) -> str:
    """A signed HS256 token: the services' own (``service_metadata``) and the tests'. No command mints one
    for users; sign it with the secret, e.g. ``python -c "from palimpsest.shared.auth import make_token;
    print(make_token('alice', 'SECRET'))"``, and set it as ``PALIMPSEST_TOKEN``."""
    import time

    claims: dict[str, object] = {"sub": sub, "role": role, "iat": int(time.time())}
    if ttl_seconds:
        claims["exp"] = int(time.time()) + ttl_seconds
    return jwt.encode(claims, secret, algorithm="HS256")

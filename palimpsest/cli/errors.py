"""Failures the CLI reports as one readable line: gRPC statuses translated into what a user does next."""

from __future__ import annotations

import re

import grpc

# gRPC's own wording for transport failures: the service never answered. Matched at the start only,
# because a service that did answer may quote such a message about one of *its* dependencies.
_UNREACHABLE = re.compile(
    r"(failed to connect|connection refused|errors resolving|dns resolution|name resolution|no address|"
    r"empty address list|connections to all backends failing)",
    re.IGNORECASE,
)
_DROPPED = re.compile(r"(socket closed|connection reset|goaway|broken pipe|stream removed)", re.IGNORECASE)


# Exit statuses a script can act on, from sysexits.h: 1 is any other failure, 2 a usage error, 130 a
# turn stopped with Ctrl-C.
EXIT_FAILED = 1
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: the service is not there, or dropped the call
EXIT_TEMPFAIL = 75  # EX_TEMPFAIL: the same command may work when tried again
EXIT_NOPERM = 77  # EX_NOPERM: the credentials (PALIMPSEST_TOKEN) do not allow it
EXIT_CODES = {
    grpc.StatusCode.UNAVAILABLE: EXIT_UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: EXIT_TEMPFAIL,
    grpc.StatusCode.ABORTED: EXIT_TEMPFAIL,
    grpc.StatusCode.UNAUTHENTICATED: EXIT_NOPERM,
    grpc.StatusCode.PERMISSION_DENIED: EXIT_NOPERM,
}


# Statuses whose details our services write for people (they name the limit, the owner, the state):
# (what to say when a server gave none, what to add after either).
_QUOTED = {
    grpc.StatusCode.UNAUTHENTICATED: ("not authenticated", " (set PALIMPSEST_TOKEN to a valid token)"),
    grpc.StatusCode.PERMISSION_DENIED: ("not allowed", " (PALIMPSEST_TOKEN says who you are: is it the right one?)"),
    # The store's quotas and size limits: its own details say what to delete.
    grpc.StatusCode.RESOURCE_EXHAUSTED: (
        "{where} refused: a quota or size limit was reached; delete or trim sessions, or send less",
        "",
    ),
    grpc.StatusCode.ABORTED: ("another change to the session got there first", ": try again"),
    grpc.StatusCode.FAILED_PRECONDITION: ("{where} refused the call in the session's present state", ""),
}


class CliError(Exception):
    """A failure already phrased for the user; `exit_code` becomes the process status."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class ServiceError(CliError):
    """A gRPC call failed; keeps the status code so commands can react to specific ones."""

    def __init__(self, message: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(message, EXIT_CODES.get(code, EXIT_FAILED))
        self.code = code
        self.details = details

    def interrupted_turn(self, session_id: str) -> ServiceError:
        """This failure, said of a turn that had begun: what arrived was shown, the session kept the rest."""
        kept = f" · what the session kept: pal sessions show {session_id}" if session_id else ""
        return ServiceError(f"the turn was interrupted: {self}{kept}", self.code, self.details)


def describe_rpc_error(err: grpc.RpcError, service: str, address: str) -> ServiceError:
    """The one line a user should read for a failed call to `service` at `address`: what happened and
    what to do. A service's own details are quoted where they are meant for people (ours are), with
    pal's hint where the details alone may not say what to do."""
    code: grpc.StatusCode = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details: str = (err.details() if hasattr(err, "details") else "") or ""
    where = f"the {service} at {address}"
    if code == grpc.StatusCode.UNAVAILABLE and _UNREACHABLE.match(details):
        message = f"cannot reach {where}: is it running? (make run)"
    elif code == grpc.StatusCode.UNAVAILABLE and _DROPPED.match(details):
        message = f"lost the connection to {where}: did it stop?"
    elif code == grpc.StatusCode.UNAVAILABLE:
        # The service answered: one of its own dependencies is down, and its message names it.
        message = details or f"{where} is unavailable"
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
        message = f"{where} did not answer in time: is it overloaded or stuck? try again"
    elif code in _QUOTED:
        without_details, hint = _QUOTED[code]
        message = (details or without_details.format(where=where)) + hint
    elif code == grpc.StatusCode.UNIMPLEMENTED:
        message = f"{where} does not implement this call: is that the right address?"
    elif code == grpc.StatusCode.CANCELLED:
        message = "cancelled"
    elif (
        code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS)
        and details
    ):
        message = details
    else:
        message = f"{service} failed ({code.name}): {details or 'no details'}"
    return ServiceError(message, code, details)

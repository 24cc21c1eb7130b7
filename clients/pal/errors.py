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


class CliError(Exception):
    """A failure already phrased for the user; `exit_code` becomes the process status."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class ServiceError(CliError):
    """A gRPC call failed; keeps the status code so commands can react to specific ones."""

    def __init__(self, message: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(message)
        self.code = code
        self.details = details


def describe_rpc_error(err: grpc.RpcError, service: str, address: str) -> ServiceError:
    """The one line a user should read for a failed call to `service` at `address`."""
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
        message = f"{where} did not answer in time"
    elif code == grpc.StatusCode.UNAUTHENTICATED:
        message = f"{details or 'not authenticated'} (set PALIMPSEST_TOKEN to a valid token)"
    elif code == grpc.StatusCode.UNIMPLEMENTED:
        message = f"{where} does not implement this call: is that the right address?"
    elif code == grpc.StatusCode.CANCELLED:
        message = "cancelled"
    elif code in (
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
    ) and details:
        message = details
    else:
        message = f"{service} failed ({code.name}): {details or 'no details'}"
    return ServiceError(message, code, details)

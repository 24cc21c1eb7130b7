"""Errors every service raises; the server interceptor maps each to its gRPC status code."""

import grpc


class PalimpsestError(Exception):
    """Base: a known failure with a message meant for the caller."""

    code = grpc.StatusCode.UNKNOWN


class InvalidArgument(PalimpsestError):
    """Bad input; the message names the field."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field


class NotFound(PalimpsestError):
    code = grpc.StatusCode.NOT_FOUND


class PermissionDenied(PalimpsestError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(PalimpsestError):
    code = grpc.StatusCode.UNAUTHENTICATED


class Aborted(PalimpsestError):
    """A revision conflict: another writer got there first."""

    code = grpc.StatusCode.ABORTED


class ResourceExhausted(PalimpsestError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(PalimpsestError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Unavailable(PalimpsestError):
    """A dependency is down; the message carries its address."""

    code = grpc.StatusCode.UNAVAILABLE

"""Errors every service raises; the server interceptor maps each to its gRPC status code."""

import grpc


class PalimpsestError(Exception):
    """Base: a known failure with a message meant for the caller."""

    code = grpc.StatusCode.UNKNOWN


class InvalidArgument(PalimpsestError):
    """Bad input; the message names the field."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, problem: str) -> None:
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


class OutOfRange(PalimpsestError):
    """A position past what exists or is kept; the message names the field."""

    code = grpc.StatusCode.OUT_OF_RANGE

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


class Unavailable(PalimpsestError):
    """A dependency is down; the message carries its address."""

    code = grpc.StatusCode.UNAVAILABLE


# How our services say that a dependency is down ("SessionStore at … is not answering", and the same of
# PostgreSQL and Ollama). A status carrying it was answered by the service called, about one of its own.
NOT_ANSWERING = "is not answering"


class NotAnswering(Unavailable):
    """The service called did not answer at all (its deadline passed, or it could not be reached),
    as opposed to a status it sent."""

    def __init__(self, service: str, address: str, details: str) -> None:
        super().__init__(f"{service} at {address} {NOT_ANSWERING}: {details}")
        self.details = details


_BY_CODE: dict[grpc.StatusCode, type[PalimpsestError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        PermissionDenied,
        Unauthenticated,
        Aborted,
        ResourceExhausted,
        FailedPrecondition,
        Unavailable,
    )
}


def from_rpc_error(exc: grpc.aio.AioRpcError, service: str, address: str) -> PalimpsestError:
    """A downstream service's status, passed on to our caller: UNAVAILABLE names who and where."""
    if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        if NOT_ANSWERING in (exc.details() or ""):
            # Not "<service> is not answering": it answered, naming the dependency that is down.
            return Unavailable(f"{exc.details()} (said the {service} at {address})")
        return NotAnswering(service, address, exc.details() or exc.code().name)
    cls = _BY_CODE.get(exc.code())
    if cls is InvalidArgument:
        return InvalidArgument("request", exc.details() or "")
    error = (cls or PalimpsestError)(exc.details() or f"{service} failed")
    if cls is None:
        error.code = exc.code()
    return error

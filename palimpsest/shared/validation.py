"""Checks every request passes before any servicer sees it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, cast

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

NUL = "\x00"
# An error quotes at most this much of what it was given: a 100 KB id must not come back in a
# status message (gRPC refuses metadata past its limit and the caller gets RESOURCE_EXHAUSTED).
MAX_ERROR_CHARS = 1_000


def first_nul(message: Message, *, deep: bool, prefix: str = "") -> str | None:
    """The path of the first string field holding a NUL character, or None.

    PostgreSQL text cannot store NUL, so a request carrying one would fail deep inside the store as
    an internal error. ``deep`` walks nested messages too (the store, where every string is kept);
    otherwise only the request's own strings are looked at (ids, model names, a turn's text), so a
    2,000-message size check is not walked on the way to the first token.
    """
    for field, value in message.ListFields():
        name = prefix + field.name
        if field.type == field.TYPE_STRING:
            values = value if field.is_repeated else [value]
            for index, text in enumerate(values):
                if NUL in text:
                    return f"{name}[{index}]" if field.is_repeated else name
        elif field.type == field.TYPE_MESSAGE and deep:
            found = _first_nul_in_message_field(field, value, name)
            if found:
                return found
    return None


def _first_nul_in_message_field(field: FieldDescriptor, value: Any, name: str) -> str | None:
    entry = field.message_type  # (a message field: called for those only)
    if entry is not None and entry.GetOptions().map_entry:
        for key, item in value.items():
            if isinstance(key, str) and NUL in key:
                return f"{name}[{key[:40]!r}]"
            if isinstance(item, str):
                if NUL in item:
                    return f"{name}[{key[:40]!r}]"
            elif isinstance(item, Message):
                found = first_nul(item, deep=True, prefix=f"{name}[{key[:40]!r}].")
                if found:
                    return found
        return None
    items = value if field.is_repeated else [value]
    for index, item in enumerate(items):
        found = first_nul(item, deep=True, prefix=f"{name}[{index}]." if field.is_repeated else f"{name}.")
        if found:
            return found
    return None


# Limits on the identifying strings of a request (documented in docs/identity-and-errors.md): a name or an id of
# a megabyte is a mistake or an attack, never a name. Message content has its own size limits.
MAX_CHARS = {
    "session_id": 64,
    "profile_id": 128,
    "model": 256,
    "provider": 64,
    "summarizer_model": 256,
    "name": 500,
    "query": 2_000,
    "token": 256,
    "token_digest": 256,
    "filename": 255,
    "idempotency_key": 128,
}


def first_too_long(message: Message) -> tuple[str, int] | None:
    """(field, limit) of the first of the request's own identifying strings over its limit."""
    for field, value in message.ListFields():
        limit = MAX_CHARS.get(field.name)
        if limit is None or field.type != field.TYPE_STRING:
            continue
        values = value if field.is_repeated else [value]
        for index, text in enumerate(values):
            if len(text) > limit:
                return (f"{field.name}[{index}]" if field.is_repeated else field.name), limit
    return None


def capped(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` cut to ``limit`` chars, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit} more chars]"


# The times a request may carry (and the store reads back; see convert.timestamp): none of a
# conversation's times predates the Unix epoch, and the last day of year 9999 is left out so a
# time converted to any local zone stays inside Python's datetime, and asyncpg never takes
# datetime.max for PostgreSQL's 'infinity' (it stores year 1 as '-infinity' the same way).
EARLIEST = datetime(1970, 1, 1, tzinfo=timezone.utc)
LATEST = datetime(9999, 12, 31, tzinfo=timezone.utc)
_EARLIEST_S, _LATEST_S = 0, int(LATEST.timestamp())
TIMESTAMP_RANGE = "must be from 1970-01-01T00:00:00Z to 9999-12-31T00:00:00Z (a zero Timestamp means unset)"


def timestamp_problem(ts: Timestamp) -> str:
    """Why a Timestamp cannot be taken ("" when it can)."""
    if not 0 <= ts.nanos <= 999_999_999:
        return f"nanos must be 0–999999999, got {ts.nanos}"
    if not _EARLIEST_S <= ts.seconds <= _LATEST_S:
        return f"{TIMESTAMP_RANGE}; got seconds={ts.seconds}"
    return ""


def first_out_of_range(message: Message, prefix: str = "") -> tuple[str, str] | None:
    """(field, problem) of the first Timestamp outside the range above, or enum value the proto does
    not define, anywhere in ``message``; None when there is none. Only the fields that can hold one
    are looked at (a message's ``created_at``, never its content), with a quick pass first: the
    path is only worked out for a request that has a bad one."""
    check = _checker(cast(Descriptor, message.DESCRIPTOR))  # (upb's own Descriptor class, the same API)
    if check is None or check(message):
        return None
    return _first_bad(message, prefix)


def _timestamp_ok(ts: Timestamp) -> bool:
    return _EARLIEST_S <= ts.seconds <= _LATEST_S and 0 <= ts.nanos <= 999_999_999


Check = Callable[[Message], bool]
_CHECKERS: dict[str, Check | None] = {}


def _checker(descriptor: Descriptor) -> Check | None:
    """True for a message whose times and enums are all fine; None for a type that holds neither.
    Only Palimpsest's own types are walked into: Struct's null_value is google's enum, and Struct is
    checked on its own (check_struct)."""
    if descriptor.full_name in _CHECKERS:
        return _CHECKERS[descriptor.full_name]
    _CHECKERS[descriptor.full_name] = None  # a type that holds itself is walked once, not forever
    checks = [check for check in map(_field_check, descriptor.fields) if check is not None]
    checker = None if not checks else checks[0] if len(checks) == 1 else (lambda m: all(c(m) for c in checks))
    _CHECKERS[descriptor.full_name] = checker
    return checker


def _field_check(field: FieldDescriptor) -> Check | None:
    name = field.name
    if field.enum_type is not None:
        if not _ours(field.enum_type.full_name):
            return None
        values = field.enum_type.values_by_number
        if field.is_repeated:
            return lambda m: all(v in values for v in getattr(m, name))
        return lambda m: getattr(m, name) in values
    if field.message_type is None or field.message_type.GetOptions().map_entry:
        return None  # (no map of ours holds a time or an enum)
    if field.message_type.full_name == Timestamp.DESCRIPTOR.full_name:
        item: Check = _timestamp_ok  # type: ignore[assignment]
    elif _ours(field.message_type.full_name):
        inner = _checker(field.message_type)
        if inner is None:
            return None
        item = inner
    else:
        return None
    if field.is_repeated:
        return lambda m: all(map(item, getattr(m, name)))
    return lambda m: not m.HasField(name) or item(getattr(m, name))


def _first_bad(message: Message, prefix: str) -> tuple[str, str] | None:
    """The slow walk, for a message the quick pass found fault with: where, and what."""
    for field, value in message.ListFields():
        name = prefix + field.name
        values = list(value) if field.is_repeated else [value]
        for index, item in enumerate(values):
            path = f"{name}[{index}]" if field.is_repeated else name
            if field.enum_type is not None and _ours(field.enum_type.full_name):
                if item not in field.enum_type.values_by_number:
                    return path, f"{item} is not a value of {field.enum_type.name}"
            elif field.message_type is not None and field.message_type.full_name == Timestamp.DESCRIPTOR.full_name:
                problem = timestamp_problem(item)
                if problem:
                    return path, problem
            elif field.message_type is not None and _ours(field.message_type.full_name):
                found = _first_bad(item, path + ".")
                if found:
                    return found
    return None


def _ours(full_name: str) -> bool:
    return full_name.startswith("palimpsest.")

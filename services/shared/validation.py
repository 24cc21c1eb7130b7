"""Checks every request passes before any servicer sees it."""

from __future__ import annotations

from google.protobuf.message import Message

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


def _first_nul_in_message_field(field, value, name: str) -> str | None:
    if field.message_type.GetOptions().map_entry:
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


# Limits on the identifying strings of a request (documented in the README): a name or an id of
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

"""What a share link shows: a session's display history with nothing that leads back to the session,
its owner, the owner's other sessions, or the machines it ran on. Pure functions.

A share is a read-only capability handed to anyone. Every string of every message is scrubbed (the
walk goes over the protobuf's fields, so a field added later is scrubbed too):

- every id shaped like a session id (a UUID, with or without dashes) is masked: this session's
  reads ``[this session]``, any other ``[id]`` — where auth is off, an id opens its session;
- every absolute path (``/home/alice/out/report.pdf``, also in ``file://`` URLs) keeps only its
  file name (``…/report.pdf``; a folder's name goes too): paths name users, folders and the layout
  of the Agent's host;
- results of tools that may carry the owner's other sessions (``session_search``; ``spawn_agent``,
  whose sub-agent may have read them; ``memory_search``, whose passages may quote such a result) are
  replaced by a note that they were left out, with their calls' arguments;
- a compression marker keeps its headline, not the summary of everything the model read.

The assistant's own words stay (masked as above): what it wrote about a session it read is part of
the conversation its owner chose to share.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from pathlib import PurePath
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message as ProtoMessage

from palimpsest.v1 import common_pb2

THIS_SESSION = "[this session]"
OTHER_ID = "[id]"
# Tools whose results may hold the owner's other sessions (names, titles, ids, text): session_search
# reads them, a sub-agent may have, and memory_search returns this session's compressed-out history
# verbatim, tool results the share leaves out among it (what else it holds, the share shows anyway).
LEFT_OUT_TOOLS = frozenset({"session_search", "spawn_agent", "memory_search"})
LEFT_OUT = "[{tool} result left out of this share: it may hold the owner's other sessions]"

_HEX = "[0-9a-fA-F]"
# Dashed anywhere; undashed only as a whole run of 32 (a longer run, a SHA-256, matches whole and is
# kept). One leading character class: the engine skips to candidates in C (2–3x faster than lookbehinds).
_SESSION_ID = re.compile(rf"{_HEX}(?:{_HEX}{{7}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}|{_HEX}{{31,}})")
_PART = r"[^\s/\"'`<>|:;,()\[\]{}]+"
# Two parts or more from a root (/srv/x, not /tmp), the first slash not after a word, a dot or a
# URL's host (https://host/a/b is a link, src/a/b.py is relative) unless it is file:///'s.
_HOST_PATH = re.compile(rf"/(?:(?<![\w.~/\]-]/)|(?<=file:///))(?:{_PART}/)+{_PART}")
# A last part with an extension reads as a file's name; any other last part is a folder's.
_FILE_NAME = re.compile(r".+\.\w{1,10}")


def shared_message(message: common_pb2.Message, session_id: str) -> common_pb2.Message:
    """The copy of ``message`` a share holder reads."""
    copy = common_pb2.Message()
    copy.CopyFrom(message)
    names = [PurePath(path).name for path in copy.files]  # rows of old kept `<root>/<session>/<name>`
    del copy.files[:]
    copy.files.extend(names)
    if copy.role == "tool" and copy.name in LEFT_OUT_TOOLS:
        copy.content = LEFT_OUT.format(tool=copy.name)
        for field in ("metadata", "files", "images"):
            copy.ClearField(field)
    for call in copy.tool_calls:
        if call.name in LEFT_OUT_TOOLS:
            call.arguments_json = "{}"
    if copy.is_compression:
        copy.content = copy.content.partition("\n")[0]
    _scrub(copy, lambda text: scrubbed(text, session_id))
    return copy


def scrubbed(text: str, session_id: str) -> str:
    """``text`` with session ids masked and absolute paths cut to their file names."""
    this = uuid.UUID(session_id)

    def mask(match: re.Match[str]) -> str:
        if "-" not in match[0] and len(match[0]) != 32:
            return match[0]
        return THIS_SESSION if uuid.UUID(match[0]) == this else OTHER_ID

    return _HOST_PATH.sub(_file_name_only, _SESSION_ID.sub(mask, text))


def _file_name_only(match: re.Match[str]) -> str:
    last = match[0].rsplit("/", 1)[1]
    return f"…/{last}" if _FILE_NAME.fullmatch(last) else "…"


def _scrub(message: ProtoMessage, text: Callable[[str], str]) -> None:
    """Apply ``text`` to every string in ``message``, map keys and nested messages included."""
    for field, value in message.ListFields():
        if field.type == FieldDescriptor.TYPE_STRING:
            if field.is_repeated:
                value[:] = [text(v) for v in value]
            else:
                setattr(message, field.name, text(value))
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            entry = field.message_type
            if entry is not None and entry.GetOptions().map_entry:
                _scrub_map(value, entry, text)
            else:
                for item in value if field.is_repeated else [value]:
                    _scrub(item, text)


def _scrub_map(entries: Any, entry: Descriptor, text: Callable[[str], str]) -> None:
    """A map's keys and values: a Struct's keys may be ids or paths too."""
    key_type, value_type = entry.fields_by_name["key"].type, entry.fields_by_name["value"].type
    same = lambda v: v
    new_key = text if key_type == FieldDescriptor.TYPE_STRING else same
    if value_type == FieldDescriptor.TYPE_MESSAGE:
        items = []
        for key in list(entries):
            value = type(entries[key])()
            value.CopyFrom(entries[key])
            _scrub(value, text)
            items.append((new_key(key), value))
        entries.clear()
        for key, value in items:
            entries[key].CopyFrom(value)
    else:
        new_value = text if value_type == FieldDescriptor.TYPE_STRING else same
        scrubbed_items = {new_key(key): new_value(value) for key, value in entries.items()}
        entries.clear()
        entries.update(scrubbed_items)

"""External state references: operator-supplied pointers to state outside Palimpsest.

A ref names a CI run, a dashboard, an object-store key...  The store keeps it
verbatim (after secret redaction, the store's own step) and NEVER resolves it:
nothing in this module or anywhere else fetches, opens or even parses the URI
for resolution, so a ref cannot become an SSRF or exfiltration path.
Validation is purely textual, and shared: the Agent checks a turn's refs before
the turn begins, `pal` checks a flag before anything is sent, the store checks
again before it writes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Iterable, Sequence

from palimpsest.shared.errors import InvalidArgument, ResourceExhausted
from palimpsest.shared.validation import timestamp_problem
from palimpsest.v1 import common_pb2

KIND_MAX_CHARS = 64
URI_MAX_CHARS = 2048
CREATED_BY_MAX_CHARS = 128
# A turn points at a few things (a CI run, a dashboard, a ticket); a session's refs come back with
# every read of it, so thousands of them would weigh on each turn (a ref is up to ~2.3 KB).
MAX_REFS_PER_REQUEST = 100
MAX_REFS_PER_SESSION = 1_000
CLI_CREATED_BY = "cli"
FLAG_NAME = "--ref"  # pal run/continue/chat

_KIND = re.compile(r"[a-z0-9_-]+")
# C0 controls (which include tab, CR and LF), DEL, and the C1 range: any of
# them in a stored URI could forge log lines or terminal output when shown.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_FLAG_KEYS = ("kind", "uri", "created_by", "read_only")
# In the long form, a comma only separates fields when a known key follows;
# URIs legitimately contain commas (matrix params, query lists).
_FLAG_FIELD_SPLIT = re.compile(r",(?=(?:%s)=)" % "|".join(_FLAG_KEYS))
_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


@dataclass(frozen=True)
class ExternalRef:
    kind: str
    uri: str
    created_by: str
    read_only: bool = False
    created_at: datetime | None = None

    def dedupe_key(self) -> tuple[str, str, str]:
        """The identity two refs share when they are the same ref."""
        return (self.kind, self.uri, self.created_by)


def validate_ref(ref: ExternalRef, index: int = 0, *, now: datetime | None = None) -> ExternalRef:
    """Return ``ref`` checked, with ``created_at`` stamped.

    Errors name the field as ``external_refs[<index>].<field>`` so a caller
    sending several refs learns which one is wrong.
    """
    return _validated(ref, f"external_refs[{index}]", now)


def _validated(ref: ExternalRef, prefix: str, now: datetime | None) -> ExternalRef:
    _check_kind(ref.kind, f"{prefix}.kind")
    _check_uri(ref.uri, f"{prefix}.uri")
    _check_created_by(ref.created_by, f"{prefix}.created_by")
    if not isinstance(ref.read_only, bool):
        raise InvalidArgument(f"{prefix}.read_only", "must be a boolean")
    if ref.created_at is not None and not isinstance(ref.created_at, datetime):
        raise InvalidArgument(f"{prefix}.created_at", "must be a datetime")
    # Length limits apply to what the operator sent; the store keeps the URI
    # redacted (masking can lengthen a short secret slightly).
    return replace(ref, created_at=_utc(ref.created_at, now))


def refs_from_proto(
    refs: Sequence[common_pb2.ExternalRef], *, field: str = "external_refs", now: datetime | None = None
) -> list[ExternalRef]:
    """The refs of a request, each validated (errors name ``<field>[<index>]``), at most
    MAX_REFS_PER_REQUEST of them."""
    if len(refs) > MAX_REFS_PER_REQUEST:
        raise ResourceExhausted(f"{field}: {len(refs):,} refs in one request; at most {MAX_REFS_PER_REQUEST}")
    validated = []
    for i, ref in enumerate(refs):
        prefix = f"{field}[{i}]"
        problem = timestamp_problem(ref.created_at)
        if problem:
            raise InvalidArgument(f"{prefix}.created_at", problem)
        stamped = ref.HasField("created_at") and (ref.created_at.seconds or ref.created_at.nanos)
        created = ref.created_at.ToDatetime(tzinfo=timezone.utc) if stamped else None  # the epoch: unset
        validated.append(
            _validated(ExternalRef(ref.kind, ref.uri, ref.created_by, ref.read_only, created), prefix, now)
        )
    return validated


def ref_to_proto(ref: ExternalRef) -> common_pb2.ExternalRef:
    message = common_pb2.ExternalRef(kind=ref.kind, uri=ref.uri, created_by=ref.created_by, read_only=ref.read_only)
    if ref.created_at is not None:
        message.created_at.FromDatetime(ref.created_at)
    return message


def _check_kind(kind: object, field: str) -> None:
    if not isinstance(kind, str) or not kind:
        raise InvalidArgument(field, "must be a non-empty string")
    if len(kind) > KIND_MAX_CHARS:
        raise InvalidArgument(field, f"must be at most {KIND_MAX_CHARS} characters, got {len(kind)}")
    if not _KIND.fullmatch(kind):
        raise InvalidArgument(field, "may only contain lower-case letters, digits, '_' and '-'")


def _check_uri(uri: object, field: str) -> None:
    if not isinstance(uri, str) or not uri:
        raise InvalidArgument(field, "must be a non-empty string")
    if len(uri) > URI_MAX_CHARS:
        raise InvalidArgument(field, f"must be at most {URI_MAX_CHARS} characters, got {len(uri)}")
    bad = _CONTROL.search(uri)
    if bad:
        raise InvalidArgument(field, f"contains control character U+{ord(bad[0]):04X} at {bad.start()}")


def _check_created_by(created_by: object, field: str) -> None:
    if not isinstance(created_by, str) or not created_by:
        raise InvalidArgument(field, "must be a non-empty string")
    if len(created_by) > CREATED_BY_MAX_CHARS:
        raise InvalidArgument(field, f"must be at most {CREATED_BY_MAX_CHARS} characters, got {len(created_by)}")
    # Not in the original rules, but created_by is echoed into audit lines just
    # like the URI, so the same forging concern applies.
    bad = _CONTROL.search(created_by)
    if bad:
        raise InvalidArgument(field, f"contains control character U+{ord(bad[0]):04X}")


def _utc(created_at: datetime | None, now: datetime | None) -> datetime:
    if created_at is None:
        return now if now is not None else datetime.now(timezone.utc)
    if created_at.tzinfo is None:
        # A naive timestamp from a client is taken to be UTC (the wire format
        # is a protobuf Timestamp, which has no zone) rather than local time.
        return created_at.replace(tzinfo=timezone.utc)
    return created_at.astimezone(timezone.utc)


def merge_refs(
    existing: Iterable[ExternalRef], new: Iterable[ExternalRef], *, field: str = "external_refs"
) -> list[ExternalRef]:
    """Return ``existing`` followed by the refs of ``new`` not already present.

    Merging only ever adds: a continue that omits a ref does not drop it.  The
    first occurrence of a (kind, uri, created_by) wins, so an existing ref keeps
    its original created_at and read_only flag.  Refs that would take the
    session past MAX_REFS_PER_SESSION are refused (see check_room).
    """
    merged: dict[tuple[str, str, str], ExternalRef] = {}
    for ref in existing:
        merged.setdefault(ref.dedupe_key(), ref)
    stored = len(merged)
    for ref in new:
        merged.setdefault(ref.dedupe_key(), ref)
    check_room(stored, len(merged) - stored, field)
    return list(merged.values())


def check_room(stored: int, adding: int, field: str = "external_refs") -> None:
    """Refuse ``adding`` new refs to a session holding ``stored`` when that passes
    MAX_REFS_PER_SESSION; a session already past it (refs stored before the cap) keeps them."""
    if adding and stored + adding > MAX_REFS_PER_SESSION:
        raise ResourceExhausted(
            f"{field}: the session holds {stored:,} refs and this adds {adding:,}; a session "
            f"keeps at most {MAX_REFS_PER_SESSION:,} (refs are never removed)"
        )


def parse_ref_flag(text: str, *, now: datetime | None = None) -> ExternalRef:
    """Return the validated ref described by one ``--ref`` value.

    Long form:  ``kind=ci-run,uri=https://...,created_by=ci,read_only=true``
    Shorthand:  ``ci-run=https://...`` (created_by defaults to "cli")

    Any problem is an InvalidArgument naming the flag: the operator asked for
    this ref explicitly, so dropping it silently would be a surprise.
    """
    try:
        fields = _long_form_fields(text)
        ref = _ref_from_fields(fields) if fields is not None else _ref_from_shorthand(text)
        return _validated(ref, FLAG_NAME, now)
    except InvalidArgument as exc:
        if exc.field == FLAG_NAME:
            raise
        raise InvalidArgument(FLAG_NAME, f"{text!r}: {exc}") from exc


def _long_form_fields(text: str) -> dict[str, str] | None:
    """The key/value fields of a long-form flag, or None for the shorthand."""
    parts = _FLAG_FIELD_SPLIT.split(text)
    keys = [part.partition("=")[0] for part in parts]
    # "kind=https://x" is the shorthand for a ref whose kind is literally
    # "kind"; only a value that spells out uri= is the long form.
    if keys[0] not in _FLAG_KEYS or "uri" not in keys:
        return None
    fields: dict[str, str] = {}
    for key, part in zip(keys, parts):
        if key in fields:
            raise InvalidArgument(FLAG_NAME, f"{key} given more than once")
        fields[key] = part.partition("=")[2]
    return fields


def _ref_from_fields(fields: dict[str, str]) -> ExternalRef:
    if "kind" not in fields:
        raise InvalidArgument(FLAG_NAME, "kind= is required")
    return ExternalRef(
        kind=fields["kind"],
        uri=fields["uri"],
        created_by=fields.get("created_by", CLI_CREATED_BY),
        read_only=_flag_bool(fields.get("read_only", "false")),
    )


def _ref_from_shorthand(text: str) -> ExternalRef:
    kind, sep, uri = text.partition("=")
    if not sep:
        raise InvalidArgument(FLAG_NAME, "expected kind=uri or kind=...,uri=...")
    return ExternalRef(kind=kind, uri=uri, created_by=CLI_CREATED_BY)


def _flag_bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise InvalidArgument(FLAG_NAME, f"read_only must be true or false, got {value!r}")

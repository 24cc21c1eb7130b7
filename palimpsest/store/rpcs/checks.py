"""The SessionStore's request checks and limits: what a request must be before the repository sees it."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from google.protobuf import struct_pb2

from palimpsest.shared.errors import InvalidArgument, ResourceExhausted
from palimpsest.shared.external_refs import ExternalRef, refs_from_proto
from palimpsest.store import convert
from palimpsest.store.redaction import redact_uri
from palimpsest.store.repository.calibration import EXACT_FIELDS
from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as pb

MAX_PAGE = 500
DEFAULT_PAGE = 50
# Ollama's model names ("nomic-embed-text", "hf.co/org/repo:Q4_K_M") are far shorter.
MAX_MODEL_NAME = 200
# A tool's name, a turn's or a tool call's id (Ollama's are short; custom tools' names are identifiers).
MAX_TOOL_NAME = 200


def page_size(value: int, field: str, default: int = DEFAULT_PAGE, maximum: int = MAX_PAGE) -> int:
    if value == 0:
        return default
    if value < 0 or value > maximum:
        raise InvalidArgument(field, f"must be between 1 and {maximum}, got {value}")
    return value


def request_refs(refs: Sequence[common_pb2.ExternalRef], field: str = "external_refs") -> list[ExternalRef]:
    """A request's refs validated, as stored: URIs redacted."""
    return [replace(ref, uri=redact_uri(ref.uri)) for ref in refs_from_proto(refs, field=field)]


def refs_from_json(items: Iterable[dict[str, Any]]) -> list[ExternalRef]:
    from datetime import datetime

    return [
        ExternalRef(
            r["kind"],
            r["uri"],
            r["created_by"],
            bool(r.get("read_only")),
            datetime.fromisoformat(r["created_at"]) if r.get("created_at") else None,
        )
        for r in items
    ]


def view_budgets(view: int, budget: int) -> tuple[int, int]:
    """(display, context) bytes of a GetSession response by view; 0: that part is not read."""
    if view == pb.SESSION_VIEW_FULL:
        return budget // 2, budget // 2
    return (budget if view == pb.SESSION_VIEW_DISPLAY else 0), (budget if view == pb.SESSION_VIEW_CONTEXT else 0)


def check_message_size(message: common_pb2.Message, field: str, limit: int) -> None:
    """One message must fit in any read of it; its encoded size is what a read will carry."""
    size = message.ByteSize()
    if size > limit:
        raise ResourceExhausted(
            f"{field} is {size:,} bytes; one message may hold at most {limit:,} "
            "(PALIMPSEST_MESSAGE_MAX_MB): store large content as a file (PutFile)"
        )


def checked_observation(obs: pb.Observation, field: str) -> tuple[str, int, int, dict[str, int]]:
    """(model, chars, tokens, exact shape) of a valid observation, for the calibration table."""
    if not obs.model:
        raise InvalidArgument(f"{field}.model", "required")
    exact = {name: getattr(obs.exact, name) for name in EXACT_FIELDS}
    if obs.tokens <= 0 or (obs.chars <= 0 and obs.exact.content_tokens <= 0):
        raise InvalidArgument(field, "tokens and either chars or exact.content_tokens must be positive")
    if any(value < 0 for value in exact.values()):
        raise InvalidArgument(f"{field}.exact", "counts must not be negative")
    # An exact shape replaces chars; a calibrated one (characters by class) goes beside them.
    return obs.model, 0 if obs.exact.content_tokens else obs.chars, obs.tokens, exact


def check_token_counts(
    digest: str, counts: Sequence[common_pb2.TokenCount], prefix: str, field: str = "token_counts"
) -> None:
    if counts and not digest:
        raise InvalidArgument(f"{prefix}token_digest", "required: a count means nothing without its tokenizer")
    if any(c.seq <= 0 or c.tokens < 0 for c in counts):
        raise InvalidArgument(f"{prefix}{field}", "seq must be positive and tokens not negative")
    if any(not re.fullmatch(r"[0-9a-f]{32}", c.content_md5) for c in counts):
        raise InvalidArgument(
            f"{prefix}{field}", "content_md5 must be the md5 (32 lowercase hex) of the counted content"
        )
    cuts = [c.cut for c in counts if c.HasField("cut")]
    if any(min(c.head_tokens, c.tail_tokens, c.head_chars, c.tail_chars, c.tokens) < 0 for c in cuts):
        raise InvalidArgument(f"{prefix}{field}", "a cut's tokens and characters must not be negative")
    if any(not re.fullmatch(r"[0-9a-f]{32}", c.content_md5) for c in cuts):
        raise InvalidArgument(f"{prefix}{field}", "a cut's content_md5 must be the md5 (32 lowercase hex) of the cut")


def validate_messages(messages: Sequence[common_pb2.Message], max_bytes: int) -> None:
    if not messages:
        raise InvalidArgument("messages", "at least one message is required")
    for i, m in enumerate(messages):
        if m.seq:
            raise InvalidArgument(f"messages[{i}].seq", "is assigned by the store; leave it 0")
        check_message(m, f"messages[{i}]", max_bytes)


def check_message(m: common_pb2.Message, field: str, max_bytes: int) -> None:
    """A message the store is to write (an append's, a compression's): what PostgreSQL could not
    hold or a chat template could not read is refused, naming it (its times are the interceptor's:
    validation.first_out_of_range)."""
    check_message_size(m, field, max_bytes)
    if m.role not in convert.VALID_ROLES:
        raise InvalidArgument(f"{field}.role", f"must be one of system, user, assistant, tool; got {m.role!r}")
    if "\x00" in m.content:
        raise InvalidArgument(f"{field}.content", "must not contain NUL characters")
    if not math.isfinite(m.elapsed_seconds):
        raise InvalidArgument(f"{field}.elapsed_seconds", "must be a finite number")
    if m.HasField("metadata"):
        check_struct(m.metadata, f"{field}.metadata")


def check_struct(struct: struct_pb2.Struct, field: str) -> None:
    """JSON can hold neither NaN nor infinities; PostgreSQL's jsonb refuses them."""

    def walk(value: struct_pb2.Value) -> None:
        kind = value.WhichOneof("kind")
        if kind == "number_value" and not math.isfinite(value.number_value):
            raise InvalidArgument(field, "numbers must be finite (no NaN or infinity)")
        if kind == "struct_value":
            for v in value.struct_value.fields.values():
                walk(v)
        if kind == "list_value":
            for v in value.list_value.values:
                walk(v)

    for v in struct.fields.values():
        walk(v)


# The writes that may name the revision they expect.
RevisedRequest = (
    pb.AppendMessagesRequest
    | pb.UpdateSessionRequest
    | pb.SetContextFlagRequest
    | pb.CommitCompressionRequest
    | pb.EditMemoryRequest
    | pb.ApproveMemoryWriteRequest
)


def expected_revision(request: RevisedRequest) -> int | None:
    return request.expected_revision if request.HasField("expected_revision") else None


def checked_model(raw: str) -> str:
    """An `embed_model` field: empty (the store's), or an Ollama model name."""
    model = raw.strip()
    if len(model) > MAX_MODEL_NAME or any(c.isspace() or not c.isprintable() for c in model):
        raise InvalidArgument(
            "embed_model", f"must be an Ollama model name (at most {MAX_MODEL_NAME} characters, no spaces)"
        )
    return model

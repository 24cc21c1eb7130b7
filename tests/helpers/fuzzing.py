"""Requests generated from the protos' descriptors, for fuzzing every RPC."""

from __future__ import annotations

import asyncio
import os
import uuid

import grpc
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.waiting import call_to_end

UNACCEPTABLE = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
_INT_EDGES = [0, 1, -1, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63), 10**12]


# Times around what the store takes (1970 to 9999-12-31), year 1 and 2^40 seconds among them.
_TIMESTAMPS = st.fixed_dictionaries(
    {
        "seconds": st.sampled_from([0, 1, 1_700_000_000, 253_402_214_400, 253_402_300_799, -62_135_596_800, 2**40, -1]),
        "nanos": st.sampled_from([0, 999_999_999, -1, 10**9]),
    }
)
_TEXT = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        ["", "\x00", "a\x00b", "x" * 5000, str(uuid.uuid4()), "00000000-0000-0000-0000-000000000000", "qwen3.6"]
    ),
)


def _scalar(field: FieldDescriptor):
    t = field.type
    if t == field.TYPE_STRING:
        return _TEXT
    if t == field.TYPE_BYTES:
        return st.binary(max_size=64)
    if t == field.TYPE_BOOL:
        return st.booleans()
    if t in (field.TYPE_DOUBLE, field.TYPE_FLOAT):
        return st.floats(allow_nan=True, allow_infinity=True, width=32 if t == field.TYPE_FLOAT else 64)
    if t == field.TYPE_ENUM:
        return st.sampled_from([v.number for v in field.enum_type.values] + [999])
    bits = (
        64
        if t in (field.TYPE_INT64, field.TYPE_SINT64, field.TYPE_SFIXED64, field.TYPE_UINT64, field.TYPE_FIXED64)
        else 32
    )
    unsigned = t in (field.TYPE_UINT32, field.TYPE_UINT64, field.TYPE_FIXED32, field.TYPE_FIXED64)
    low, high = (0, 2**bits - 1) if unsigned else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    return st.one_of(st.integers(low, high), st.sampled_from([v for v in _INT_EDGES if low <= v <= high]))


def messages(descriptor, session_ids: tuple[str, ...] = (), depth: int = 0):
    """Requests of one type: each field left out or given a value, nested messages two levels deep.
    A `session_id` is mostly one of ``session_ids`` (real sessions), so calls get past the lookup."""
    if depth > 2:
        return st.just({})
    fields = {}
    for field in descriptor.fields:
        if field.message_type is not None:
            if field.message_type.full_name == "google.protobuf.Timestamp":
                value = _TIMESTAMPS
            elif field.message_type.GetOptions().map_entry or field.message_type.full_name.startswith("google."):
                continue
            else:
                value = messages(field.message_type, session_ids, depth + 1)
        elif field.name == "session_id" and session_ids:
            value = st.one_of(st.sampled_from(session_ids), st.sampled_from(session_ids), _TEXT)
        else:
            value = _scalar(field)
        if field.is_repeated:
            value = st.lists(value, max_size=3)
        fields[field.name] = st.one_of(st.none(), value)
    return st.fixed_dictionaries(fields).map(lambda d: {k: v for k, v in d.items() if v is not None})


def build(cls, values: dict):
    message = cls()
    for name, value in values.items():
        field = cls.DESCRIPTOR.fields_by_name[name]
        if field.message_type is not None:
            sub = field.message_type._concrete_class
            if field.is_repeated:
                getattr(message, name).extend(build(sub, v) for v in value)
            else:
                getattr(message, name).CopyFrom(build(sub, value))
        elif field.is_repeated:
            getattr(message, name).extend(value)
        else:
            setattr(message, name, value)
    return message


async def _call(stub, method, request) -> None:
    try:
        await call_to_end(stub, method, request, timeout=20)
    except grpc.aio.AioRpcError as error:
        assert error.code() not in UNACCEPTABLE, f"{method.name}({request!r:.300}) → {error.code()}: {error.details()}"


def _fuzz(method, session_ids: tuple[str, ...]):
    request_class = method.input_type._concrete_class

    # In CI the same examples every run (a landing must not hinge on a draw); locally new ones, and
    # FUZZ_EXAMPLES=200 for a deeper look.
    @settings(
        max_examples=int(os.environ.get("FUZZ_EXAMPLES", "25")),
        deadline=None,
        derandomize=bool(os.environ.get("CI")),
        suppress_health_check=list(HealthCheck),
    )
    @given(values=messages(method.input_type, session_ids))
    def run(values, loop, stub):
        asyncio.run_coroutine_threadsafe(_call(stub, method, build(request_class, values)), loop).result(60)

    return run

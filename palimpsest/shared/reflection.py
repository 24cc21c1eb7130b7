"""Server reflection that serves the protos' comments: `grpcurl describe` shows the contract's own
documentation. The generated modules carry descriptors without source info; `make protos` also
writes palimpsest/v1/palimpsest.binpb (a descriptor set with it), and its files are served in
their place. Every other file (health, reflection, well-known types) is served as before."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool


@lru_cache(maxsize=1)
def documented_files() -> dict[str, descriptor_pb2.FileDescriptorProto]:
    """Our .proto files with their comments, by file name; empty when the set is not there."""
    try:
        data = (resources.files("palimpsest.v1") / "palimpsest.binpb").read_bytes()
    except (FileNotFoundError, ModuleNotFoundError):
        return {}
    files = descriptor_pb2.FileDescriptorSet.FromString(data).file
    return {f.name: f for f in files}


class _DocumentedFile:
    """A FileDescriptor whose CopyToProto carries source info (all the reflection servicer calls)."""

    def __init__(self, descriptor: Any, documented: dict[str, descriptor_pb2.FileDescriptorProto]) -> None:
        self._descriptor = descriptor
        self._documented = documented

    @property
    def name(self) -> str:
        return self._descriptor.name

    @property
    def dependencies(self) -> list[_DocumentedFile]:
        return [_DocumentedFile(d, self._documented) for d in self._descriptor.dependencies]

    def CopyToProto(self, proto: descriptor_pb2.FileDescriptorProto) -> None:  # noqa: N802 — protobuf's name
        documented = self._documented.get(self.name)
        if documented is None:
            self._descriptor.CopyToProto(proto)
            return
        # The served file must be the one the server runs: same messages, fields and services.
        plain = descriptor_pb2.FileDescriptorProto()
        self._descriptor.CopyToProto(plain)
        served = _without_json_names(documented)
        shape = descriptor_pb2.FileDescriptorProto()
        shape.CopyFrom(served)
        shape.ClearField("source_code_info")
        proto.CopyFrom(served if shape == _without_json_names(plain) else plain)


def _without_json_names(file: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    """The file as the generated modules describe it: protoc's set adds each field's JSON name,
    with which grpcurl would print `streamEnd` where it prints the .proto's `stream_end` today."""
    shape = descriptor_pb2.FileDescriptorProto()
    shape.CopyFrom(file)
    messages = list(shape.message_type)
    while messages:
        message = messages.pop()
        for field in (*message.field, *message.extension):
            field.ClearField("json_name")
        messages.extend(message.nested_type)
    for field in shape.extension:
        field.ClearField("json_name")
    return shape


class DocumentedPool:
    """The default descriptor pool, handing out files that carry their comments."""

    def __init__(self, pool: Any = None) -> None:
        self._pool = pool or descriptor_pool.Default()
        self._documented = documented_files()

    def FindFileByName(self, name: str) -> _DocumentedFile:  # noqa: N802
        return _DocumentedFile(self._pool.FindFileByName(name), self._documented)

    def FindFileContainingSymbol(self, symbol: str) -> _DocumentedFile:  # noqa: N802
        return _DocumentedFile(self._pool.FindFileContainingSymbol(symbol), self._documented)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

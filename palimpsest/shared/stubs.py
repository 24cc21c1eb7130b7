"""The generated stubs as the services' own grpc.aio clients are typed.

mypy-protobuf's .pyi types `SessionStoreStub(aio_channel)` as `SessionStoreAsyncStub`, whose calls are
awaited and whose streams are async iterators. That class exists only in the .pyi (type_check_only), so
annotations name it through these aliases, which at runtime are the generated classes themselves.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from palimpsest.v1.compressor_pb2_grpc import CompressorAsyncStub as AsyncCompressorStub
    from palimpsest.v1.session_store_pb2_grpc import SessionStoreAsyncStub as AsyncStoreStub
else:
    from palimpsest.v1.compressor_pb2_grpc import CompressorStub as AsyncCompressorStub
    from palimpsest.v1.session_store_pb2_grpc import SessionStoreStub as AsyncStoreStub

__all__ = ["AsyncCompressorStub", "AsyncStoreStub"]

"""The Compressor gRPC servicer. It keeps no session state: what it decides on is loaded from the
store per request (a model's template reports may be up to 5 s old; tokenizers are cached per model
digest), so replicas answer alike and a replica can die mid-request losing nothing.

Its RPCs live in palimpsest/compressor/rpcs/: the size checks and compression; this class joins them."""

from __future__ import annotations

from palimpsest.compressor.rpcs.compressing import CompressRpcs
from palimpsest.compressor.rpcs.sizing import SizeRpcs
from palimpsest.v1 import compressor_pb2_grpc


class CompressorServicer(SizeRpcs, CompressRpcs, compressor_pb2_grpc.CompressorServicer):
    """Every Compressor RPC (the generated base answers UNIMPLEMENTED for any not written)."""

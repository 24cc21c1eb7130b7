"""The SessionStore gRPC servicer: validates requests, resolves the caller, calls the repository.

Its RPCs live in palimpsest/store/rpcs/, one class by what they serve; this class joins them."""

from __future__ import annotations

from palimpsest.store.rpcs.bus import BusRpcs
from palimpsest.store.rpcs.calibration import CalibrationRpcs
from palimpsest.store.rpcs.files import FileRpcs
from palimpsest.store.rpcs.memory import MemoryRpcs
from palimpsest.store.rpcs.messages import MessageRpcs
from palimpsest.store.rpcs.sessions import SessionRpcs
from palimpsest.v1 import session_store_pb2_grpc


class SessionStoreServicer(
    SessionRpcs,
    MessageRpcs,
    MemoryRpcs,
    BusRpcs,
    CalibrationRpcs,
    FileRpcs,
    session_store_pb2_grpc.SessionStoreServicer,
):
    """Every SessionStore RPC (the generated base answers UNIMPLEMENTED for any not written)."""

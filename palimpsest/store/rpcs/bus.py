"""Messages between Agent replicas, for the Palimpsest services only."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from palimpsest.shared.auth import caller
from palimpsest.shared.errors import InvalidArgument, PermissionDenied, ResourceExhausted, Unavailable
from palimpsest.store.repository.access import parse_session_id
from palimpsest.store.rpcs.base import StoreRpcs
from palimpsest.store.session_bus import MAX_PAYLOAD_BYTES, ListenerGone, SessionBus
from palimpsest.v1 import session_store_pb2 as pb

MAX_BUS_MESSAGES = 1000  # one PublishSessionMessages
# How long a new ListenSessionMessages waits for this replica's listen connection (reconnecting).
LISTEN_READY_S = 5.0


class BusRpcs(StoreRpcs):
    """Messages between Agent replicas, for the Palimpsest services only."""

    def _bus(self, context: grpc.aio.ServicerContext[Any, Any]) -> SessionBus:
        if not caller().is_service:
            raise PermissionDenied("the session bus carries every session's events: the Palimpsest services only")
        if self.bus is None:
            raise Unavailable("this store replica has no session bus")
        return self.bus

    async def PublishSessionMessages(
        self,
        request: pb.PublishSessionMessagesRequest,
        context: grpc.aio.ServicerContext[pb.PublishSessionMessagesRequest, pb.PublishSessionMessagesResponse],
    ) -> pb.PublishSessionMessagesResponse:
        bus = self._bus(context)
        if not 1 <= len(request.messages) <= MAX_BUS_MESSAGES:
            raise InvalidArgument("messages", f"1–{MAX_BUS_MESSAGES} messages, got {len(request.messages)}")
        for i, message in enumerate(request.messages):
            parse_session_id(message.session_id, f"messages[{i}].session_id")
            if not message.origin.strip() or len(message.origin) > 128:
                raise InvalidArgument(f"messages[{i}].origin", "required, at most 128 characters")
            if len(message.payload) > MAX_PAYLOAD_BYTES:
                raise ResourceExhausted(
                    f"messages[{i}].payload: {len(message.payload):,} bytes, at most {MAX_PAYLOAD_BYTES:,}"
                )
        await bus.publish(list(request.messages))
        return pb.PublishSessionMessagesResponse()

    async def ListenSessionMessages(
        self,
        request: pb.ListenSessionMessagesRequest,
        context: grpc.aio.ServicerContext[pb.ListenSessionMessagesRequest, pb.ListenSessionMessagesResponse],
    ) -> AsyncIterator[pb.ListenSessionMessagesResponse]:
        bus = self._bus(context)
        try:
            listener = await bus.listen(LISTEN_READY_S)
        except asyncio.TimeoutError:
            raise Unavailable("this store replica is not listening to PostgreSQL yet: listen again") from None
        try:
            yield pb.ListenSessionMessagesResponse()  # in place: nothing published from now on is missed
            while True:
                yield pb.ListenSessionMessagesResponse(messages=await listener.next_batch())
        except ListenerGone as gone:
            raise Unavailable(f"{gone}: listen again") from None
        finally:
            bus.leave(listener)

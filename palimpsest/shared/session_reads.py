"""Reading a session's whole context from the store, in as many parts as its size needs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from palimpsest.shared.errors import Aborted
from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as store_pb

# A write between two parts starts the read over; a session written this often mid-read is busy
# enough that the caller should try again later.
READ_ATTEMPTS = 3

GetSession = Callable[[store_pb.GetSessionRequest], Awaitable[store_pb.GetSessionResponse]]


async def whole_context(get_session: GetSession, session_id: str) -> common_pb2.Session:
    """The session in the CONTEXT view with its whole context. One response carries at most half
    the gRPC limit; a bigger context comes in parts, all of one revision."""
    for _ in range(READ_ATTEMPTS):
        reply = await get_session(store_pb.GetSessionRequest(session_id=session_id, view=store_pb.SESSION_VIEW_CONTEXT))
        session, more = reply.session, reply.has_more_context
        while more:
            part = await get_session(
                store_pb.GetSessionRequest(
                    session_id=session_id, view=store_pb.SESSION_VIEW_CONTEXT, context_offset=len(session.context)
                )
            )
            if part.session.revision != session.revision:
                break
            session.context.extend(part.session.context)
            more = part.has_more_context
        if not more:
            return session
    raise Aborted(f"session {session_id} changed {READ_ATTEMPTS} times while its context was read; try again")

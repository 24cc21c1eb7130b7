"""Memory: raw chunks and their search, and what the agent remembers about the caller."""

from __future__ import annotations

import grpc

from palimpsest.shared.auth import caller
from palimpsest.shared.errors import InvalidArgument
from palimpsest.store import convert
from palimpsest.store.repository.access import parse_session_id
from palimpsest.store.repository.owner_memory import MemoryEdit, checked_text
from palimpsest.store.rpcs.base import StoreRpcs
from palimpsest.store.rpcs.checks import (
    checked_model,
    expected_revision,
    page_size,
)
from palimpsest.v1 import session_store_pb2 as pb

MEMORY_ACTIONS = {pb.MEMORY_ACTION_ADD: "add", pb.MEMORY_ACTION_REPLACE: "replace", pb.MEMORY_ACTION_REMOVE: "remove"}


class MemoryRpcs(StoreRpcs):
    """Memory: raw chunks and their search, and what the agent remembers about the caller."""

    async def SearchMemory(
        self,
        request: pb.SearchMemoryRequest,
        context: grpc.aio.ServicerContext[pb.SearchMemoryRequest, pb.SearchMemoryResponse],
    ) -> pb.SearchMemoryResponse:
        identity = caller()
        session_id = parse_session_id(request.session_id)
        if not request.query.strip():
            raise InvalidArgument("query", "required")
        limit = page_size(request.limit, "limit", default=5, maximum=50)
        if not 0 <= request.min_similarity <= 1:
            raise InvalidArgument("min_similarity", "must be between 0 and 1")
        embed_model = checked_model(request.embed_model)
        rows, semantic = await self.repo.memory.search_memory(
            identity, session_id, request.query.strip(), limit, request.min_similarity, self.memory_index, embed_model
        )
        return pb.SearchMemoryResponse(chunks=[convert.chunk_from_row(r) for r in rows], semantic=semantic)

    async def IndexChunks(
        self,
        request: pb.IndexChunksRequest,
        context: grpc.aio.ServicerContext[pb.IndexChunksRequest, pb.IndexChunksResponse],
    ) -> pb.IndexChunksResponse:
        identity = caller()
        session_id = parse_session_id(request.session_id)
        for i, chunk in enumerate(request.chunks):
            if not chunk.content:
                raise InvalidArgument(f"chunks[{i}].content", "required")
        indexed = await self.repo.memory.index_chunks(identity, session_id, request.chunks)
        if indexed:
            self._chunks_committed()
        return pb.IndexChunksResponse(indexed=indexed)

    # -- what the agent remembers about the caller -------------------------------------------
    async def GetMemory(
        self, request: pb.GetMemoryRequest, context: grpc.aio.ServicerContext[pb.GetMemoryRequest, pb.GetMemoryResponse]
    ) -> pb.GetMemoryResponse:
        owner = caller().sub
        memory = await self.repo.owner_memory.read(owner)
        caps = self.repo.owner_memory.caps
        return pb.GetMemoryResponse(
            revision=memory.revision,
            entries=[convert.memory_entry(r) for r in memory.entries],
            pending=[convert.pending_memory_write(r) for r in memory.pending],
            max_entries=caps.max_entries,
            max_chars=caps.max_chars,
            chars=sum(len(r["text"]) for r in memory.entries),
        )

    async def EditMemory(
        self,
        request: pb.EditMemoryRequest,
        context: grpc.aio.ServicerContext[pb.EditMemoryRequest, pb.EditMemoryResponse],
    ) -> pb.EditMemoryResponse:
        identity = caller()
        action = MEMORY_ACTIONS.get(request.action)
        if action is None:
            raise InvalidArgument("action", "MEMORY_ACTION_ADD, MEMORY_ACTION_REPLACE or MEMORY_ACTION_REMOVE")
        text = checked_text(request.text) if action != "remove" else ""
        if action != "add" and request.entry_id < 0:
            raise InvalidArgument("entry_id", "must not be negative")
        session_id, hold = None, request.hold
        if request.session_id:
            session_id = parse_session_id(request.session_id)
            # A write from a conversation that has taken in outside content waits for the owner,
            # whoever asks for it: an order planted in that content reads like the user's own.
            hold = hold or (await self.repo.sessions.get_session(identity, session_id))["untrusted_ingested"]
        result = await self.repo.owner_memory.edit(
            identity.sub,
            MemoryEdit(action, text, request.entry_id, request.old_text),
            expected_revision=expected_revision(request),
            session_id=session_id,
            hold=hold,
        )
        response = pb.EditMemoryResponse(revision=result.revision)
        if result.entry is not None:
            response.entry.CopyFrom(convert.memory_entry(result.entry))
        if result.held is not None:
            response.held.CopyFrom(convert.pending_memory_write(result.held))
        return response

    async def ApproveMemoryWrite(
        self,
        request: pb.ApproveMemoryWriteRequest,
        context: grpc.aio.ServicerContext[pb.ApproveMemoryWriteRequest, pb.ApproveMemoryWriteResponse],
    ) -> pb.ApproveMemoryWriteResponse:
        owner = caller().sub
        result = await self.repo.owner_memory.approve(owner, held_id(request.id), expected_revision(request))
        response = pb.ApproveMemoryWriteResponse(revision=result.revision)
        if result.entry is not None:
            response.entry.CopyFrom(convert.memory_entry(result.entry))
        return response

    async def RejectMemoryWrite(
        self,
        request: pb.RejectMemoryWriteRequest,
        context: grpc.aio.ServicerContext[pb.RejectMemoryWriteRequest, pb.RejectMemoryWriteResponse],
    ) -> pb.RejectMemoryWriteResponse:
        owner = caller().sub
        await self.repo.owner_memory.reject(owner, held_id(request.id))
        return pb.RejectMemoryWriteResponse()


def held_id(value: int) -> int:
    if value <= 0:
        raise InvalidArgument("id", "required: the held write's id (GetMemory lists them under pending)")
    return value

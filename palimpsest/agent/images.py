"""Images pasted into a turn: stored as session files, sent to the model while they fit, and
named in a notice on the context copy of the message (the user's copy stays as typed), beside the
notice of the turn's uploaded files."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from palimpsest.agent.attachments import upload_requests, uploads_notice
from palimpsest.shared.errors import PalimpsestError
from palimpsest.shared.image_tokens import image_tokens
from palimpsest.shared.stubs import AsyncCompressorStub, AsyncStoreStub
from palimpsest.v1 import common_pb2
from palimpsest.v1 import compressor_pb2 as cpb
from palimpsest.v1 import session_store_pb2 as store_pb

log = logging.getLogger("palimpsest.agent.images")

Message = common_pb2.Message

# Images may take what is left of 80% of the window once the context is counted.
IMAGE_BUDGET_SHARE = 0.8


@dataclass(frozen=True)
class ImageTarget:
    """Where a turn's pictures go and what they may take: the session (stored or a sub-agent's,
    which keeps no files) and its model's window."""

    session_id: str
    stored: bool
    store: AsyncStoreStub
    compressor: AsyncCompressorStub
    model: str
    window: int
    settings: cpb.CompressionSettings
    image_fallback: int
    # What the model gets besides the stored context (system prompt, memory message; tool schemas),
    # so the context's count is the prompt's, as the next call will be sent.
    preamble: Sequence[Message] = ()
    tool_schemas: Sequence[str] = ()


def images_within_budget(images: Sequence[bytes], budget: int, fallback: int) -> int:
    """How many of the images, in order, fit the budget when each is priced by its own area."""
    spent = 0
    for count, data in enumerate(images):
        cost = image_tokens(data, fallback)
        if spent + cost > budget:
            return count
        spent += cost
    return len(images)


def notice(paths: Sequence[str | None], sent: int) -> str:
    """Where the images landed (their names among the session's files); the ones past the budget
    are named for image_view. `paths[i]` is None for an image that could not be stored."""
    total = len(paths)
    stored = [p for p in paths if p]
    if not stored:
        return ""
    if sent == total:
        return (
            f"[{total} image(s) attached inline — already in your context, no extra loading needed.\n"
            f"Stored with this session as: {', '.join(stored)}]"
        )
    rest = [p for p in paths[sent:] if p]
    return (
        f"[{total} image(s) attached inline — {sent} in your context, the rest were not loaded;\n"
        f"open them with image_view: {', '.join(rest) or '(they could not be stored)'}]"
    )


async def _store_image(target: ImageTarget, data: bytes) -> str | None:
    header = store_pb.PutFileHeader(session_id=target.session_id, kind=store_pb.FILE_KIND_IMAGE)
    try:
        reply = await target.store.PutFile(upload_requests(header, data))
        return reply.file.path
    except PalimpsestError as exc:
        # A picture that cannot be stored never costs the turn.
        log.warning("agent.image_save_failed session=%s: %s", target.session_id, exc)
        return None


async def _context_tokens(target: ImageTarget) -> int:
    if not target.stored:
        return 0
    try:
        reply = await target.compressor.EstimateTokens(
            cpb.EstimateTokensRequest(
                session_id=target.session_id,
                model=target.model,
                window=target.window,
                settings=target.settings,
                preamble=target.preamble,
                tool_schemas=target.tool_schemas,
            )
        )
        return reply.tokens
    except PalimpsestError:
        return 0


async def user_messages(
    target: ImageTarget, text: str, images: Sequence[bytes], hidden: bool, files: Sequence[str] = ()
) -> list[Message]:
    """The message(s) to append for this input: one row, or a display row (as typed, with the
    turn's files) and a context row (with the notices saying where images and files are)."""
    images = list(images)
    if hidden:
        # Machine payloads: nothing is stored as files and nothing is displayed.
        return [
            Message(role="user", content=text, images=images, explicit_flags=True, is_context=True, is_display=False)
        ]
    if not images and not files:
        return [Message(role="user", content=text)]
    paths: list[str | None] = [await _store_image(target, data) for data in images] if target.stored else []
    sent = 0
    if images:
        budget = int(IMAGE_BUDGET_SHARE * target.window) - await _context_tokens(target)
        # Pillow reads every header: in a thread, so other sessions' streams do not wait on it.
        sent = await asyncio.to_thread(images_within_budget, images, max(0, budget), target.image_fallback)
    notes = [note for note in (notice(paths, sent), uploads_notice(target.session_id, files)) if note]
    attached = [*(p for p in paths if p), *files]
    shown = Message(role="user", content=text, files=attached, explicit_flags=True, is_context=False, is_display=True)
    context_copy = Message(
        role="user",
        content="\n\n".join([text, *notes]) if text.strip() else "\n\n".join(notes),
        images=images[:sent],
        files=attached,
        explicit_flags=True,
        is_context=True,
        is_display=False,
    )
    return [shown, context_copy]

"""The scratchpad: findings and errors the agent notes as it works, which a re-plan (the plan tool
with a `reason`) packs beside the todo, so the revised plan knows what was learned and what failed.

Notes live with the session (its metadata, "scratchpad"), written through at once; a sub-agent
writes its parent's (it works for that session), and one with no session to write keeps its own
in its turn's state. Capped: a full scratchpad refuses the next note rather than dropping one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from palimpsest.agent.tools.base import Reach, ToolContext, ToolResult
from palimpsest.agent.tools.common import ToolInputError, error, from_struct, text_arg
from palimpsest.v1 import session_store_pb2 as store_pb

METADATA_KEY = "scratchpad"
KINDS = ("finding", "error")
MAX_NOTES = 50
NOTE_CHARS = 1_000


def notes_from_metadata(metadata: dict[str, Any]) -> list[dict[str, str]]:
    """The stored notes; malformed entries are skipped rather than failing the turn."""
    notes = []
    for entry in metadata.get(METADATA_KEY) or []:
        if isinstance(entry, dict) and isinstance(entry.get("text"), str) and entry["text"].strip():
            kind = entry.get("kind") if entry.get("kind") in KINDS else "finding"
            notes.append({"kind": kind, "text": entry["text"]})
    return notes


def render(notes: Sequence[dict[str, str]]) -> str:
    if not notes:
        return "The scratchpad is empty."
    return "\n".join(
        [f"Scratchpad ({len(notes)} note{'s' if len(notes) != 1 else ''}):"]
        + [f"{n}. [{note['kind']}] {note['text']}" for n, note in enumerate(notes, 1)]
    )


def _persistent(ctx: ToolContext) -> bool:
    return bool(ctx.session_id) and ctx.update_session is not None


async def load_notes(ctx: ToolContext) -> list[dict[str, str]]:
    """The session's notes as stored (a sub-agent's parent's), or the turn's own without a session."""
    if not _persistent(ctx):
        return list(ctx.state.scratchpad)
    reply = await ctx.store.GetSession(
        store_pb.GetSessionRequest(session_id=ctx.session_id, view=store_pb.SESSION_VIEW_SUMMARY)
    )
    return notes_from_metadata(from_struct(reply.session.metadata))


async def save_notes(ctx: ToolContext, notes: list[dict[str, str]]) -> None:
    if _persistent(ctx):
        assert ctx.update_session is not None
        await ctx.update_session(metadata={METADATA_KEY: notes or None})  # None: the key goes
    ctx.state.scratchpad = list(notes)


class ScratchpadTool:
    name = "scratchpad"
    reach = Reach.SESSION  # its own session (a sub-agent: its parent's) and the model only
    description = (
        "Notes of what you found and what failed, which a re-plan (plan with a reason) reads: add a "
        "`note` (`kind` finding or error), list, clear."
    )
    parameters = {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["add", "list", "clear"]},
            "note": {"type": "string"},
            "kind": {"type": "string", "enum": list(KINDS)},
        },
        "required": ["action"],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            return await self._run(args, ctx)
        except ToolInputError as exc:
            return error(f"scratchpad: {exc}")

    async def _run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        action = text_arg(args, "action", required=True)
        if action == "list":
            return self._result(await load_notes(ctx))
        if action == "clear":
            await save_notes(ctx, [])
            return self._result([])
        if action != "add":
            raise ToolInputError(f"unknown action {action!r}: use add, list or clear")
        text = text_arg(args, "note", required=True)
        if len(text) > NOTE_CHARS:
            raise ToolInputError(
                f"a note holds at most {NOTE_CHARS:,} characters, this one {len(text):,}: keep what matters"
            )
        kind = text_arg(args, "kind", default="finding")
        if kind not in KINDS:
            raise ToolInputError(f"'kind' must be one of {', '.join(KINDS)}")
        notes = await load_notes(ctx)
        if len(notes) >= MAX_NOTES:
            raise ToolInputError(
                f"the scratchpad is full ({MAX_NOTES} notes): clear it once a re-plan has used "
                "them, or fold several into one"
            )
        notes.append({"kind": kind, "text": text})
        await save_notes(ctx, notes)
        return self._result(notes)

    @staticmethod
    def _result(notes: Sequence[dict[str, str]]) -> ToolResult:
        return ToolResult(content=render(notes), untrusted=False, metadata={"notes": len(notes)})

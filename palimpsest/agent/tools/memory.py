"""The memory tool: what the agent keeps about the user across sessions (the owner's memory in the
SessionStore: a few entries of text, with a revision).

Every session of the owner receives the memory in its prompt, as the session holds it: taken when
the session was made and again at each of its compressions. So a write reaches new sessions at
once and this one at its next compression, and the prompt's beginning never moves in between.

A tainted conversation's writes are held for the owner's approval (``pal memory approve``), never
refused and never applied: an order planted in outside content reads exactly like the user's own,
and memory reaches every later session. A sub-agent that has taken in outside content cannot write
memory at all (its call reaches outside, and the taint rule refuses it).
"""

from __future__ import annotations

from typing import Any

from palimpsest.agent.tools.base import Reach, ToolContext, ToolResult
from palimpsest.agent.tools.common import ToolInputError, error, int_arg, shorten, text_arg
from palimpsest.shared.errors import Aborted, FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from palimpsest.v1 import session_store_pb2 as store_pb

ACTIONS = ("view", "add", "replace", "remove")
_WRITES = {
    "add": store_pb.MEMORY_ACTION_ADD,
    "replace": store_pb.MEMORY_ACTION_REPLACE,
    "remove": store_pb.MEMORY_ACTION_REMOVE,
}
# What the model can correct from the store's answer; anything else is the registry's failure.
_CORRECTABLE = (InvalidArgument, NotFound, ResourceExhausted, Aborted, FailedPrecondition)
QUOTED_CHARS = 200
WHEN_SEEN = (
    "New sessions see it at once; this session's prompt shows the memory as it was when the session began "
    "or was last compressed, and takes the change at its next compression."
)


def render(memory: store_pb.GetMemoryResponse) -> str:
    """The memory as ``view`` shows it: each entry with its id, the room left, and what waits for
    the user's approval."""
    if not memory.entries:
        lines = ["Memory is empty."]
    else:
        lines = [
            f"Memory ({len(memory.entries)} of {memory.max_entries} entries, {memory.chars:,} of "
            f"{memory.max_chars:,} characters):"
        ]
        lines += [f"[{e.id}] {e.text}" for e in memory.entries]
    if memory.pending:
        lines.append(
            f"{len(memory.pending)} write(s) wait for the user's approval: "
            + "; ".join(f"#{p.id} {_held_words(p)}" for p in memory.pending)
        )
    return "\n".join(lines)


def _held_words(held: store_pb.PendingMemoryWrite) -> str:
    action = store_pb.MemoryAction.Name(held.action).removeprefix("MEMORY_ACTION_").lower()
    target = f" entry {held.entry_id}" if held.entry_id else ""
    return f"{action}{target}" + (f": {shorten(held.text, QUOTED_CHARS)}" if held.text else "")


class MemoryTool:
    name = "memory"
    # At its farthest it reaches the owner's other sessions, so a clamped sub-agent loses it; each
    # call says how far it reaches (reach_of).
    reach = Reach.OUTSIDE
    description = (
        "Durable facts about the user you keep across sessions (each session starts with them). view: the "
        "entries and ids; add: `text`; replace: the entry by `id` (or `old_text` it contains) gets `text`; "
        "remove: by `id` or `old_text`. One short fact per entry, no secrets."
    )
    parameters = {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": list(ACTIONS)},
            "text": {"type": "string"},
            "id": {"type": "integer"},
            "old_text": {"type": "string"},
        },
        "required": ["action"],
    }

    def reach_of(self, args: dict[str, Any], ctx: ToolContext) -> Reach:
        """A view stays in the conversation. A tainted conversation's write is held (nothing changes
        until the owner approves), except a sub-agent's: it reaches outside, and is refused."""
        if args.get("action") == "view" or (ctx.untrusted and not ctx.is_subagent):
            return Reach.SESSION
        return Reach.OUTSIDE

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            return await self._run(args, ctx)
        except ToolInputError as exc:
            return error(f"memory: {exc}")
        except _CORRECTABLE as exc:
            return error(f"memory: {exc}. Call memory with action 'view' to see the entries and their ids.")

    async def _run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        action = text_arg(args, "action", required=True)
        if action == "view":
            memory = await ctx.store.GetMemory(store_pb.GetMemoryRequest())
            return ToolResult(content=render(memory), untrusted=False, metadata={"revision": memory.revision})
        if action not in _WRITES:
            raise ToolInputError(f"unknown action {action!r}: use {', '.join(ACTIONS)}")
        request = store_pb.EditMemoryRequest(action=_WRITES[action], session_id=ctx.session_id, hold=ctx.untrusted)
        if action != "remove":
            request.text = text_arg(args, "text", required=True)
        if action != "add":
            request.entry_id = int_arg(args, "id", default=0, low=0, high=2**62)
            request.old_text = text_arg(args, "old_text")
            if not (request.entry_id or request.old_text):
                raise ToolInputError(f"{action} needs the entry's 'id' (view shows them) or 'old_text' it contains")
        reply = await ctx.store.EditMemory(request)
        if reply.HasField("held"):
            held = reply.held.id
            return ToolResult(
                content=(
                    f"Held for the user's approval as write #{held}, not remembered yet: this conversation has "
                    "taken in content from outside, which may carry instructions someone planted, so changes "
                    f"to memory wait until the user approves them (`pal memory approve {held}`) or rejects "
                    "them. Tell the user what you asked to remember and why."
                ),
                untrusted=False,
                metadata={"held": held},
            )
        entry = reply.entry
        done = {
            "add": f"Remembered as entry {entry.id}: {shorten(entry.text, QUOTED_CHARS)}",
            "replace": f"Entry {entry.id} now reads: {shorten(entry.text, QUOTED_CHARS)}",
            "remove": f"Forgot entry {entry.id}: {shorten(entry.text, QUOTED_CHARS)}",
        }[action]
        return ToolResult(
            content=f"{done}\n{WHEN_SEEN}", untrusted=False, metadata={"entry": entry.id, "revision": reply.revision}
        )

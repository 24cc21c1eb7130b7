"""The todo list: the agent's own record of progress, and the loop's anti-stall signal.

The list lives in the turn's state and, for a stored session, in the session's metadata under
"todo", so the next turn (a fresh TurnState) picks it up again. Every change is written through at
once, which is why an empty in-memory list can always be (re)loaded from the store: it can never
hold unsaved work. A sub-agent keeps its own list in memory only: it runs under its parent's
session id, and its plan must not overwrite the parent's list.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from palimpsest.agent.tools.base import Reach, ToolContext, ToolResult
from palimpsest.agent.tools.common import ToolInputError, error, from_struct, text_arg
from palimpsest.v1 import agent_pb2
from palimpsest.v1 import session_store_pb2 as store_pb

TodoItem = agent_pb2.TodoItem

METADATA_KEY = "todo"
STATUSES = ("pending", "in_progress", "done")
_RANK = {status: i for i, status in enumerate(STATUSES)}
_MARK = {"pending": "[ ]", "in_progress": "[~]", "done": "[x]"}


# -- plain functions over the list -------------------------------------------------------------
def item_to_dict(item: TodoItem) -> dict[str, str]:
    return {"id": item.id, "text": item.text, "status": item.status, "validation": item.validation}


def items_from_metadata(metadata: dict[str, Any]) -> list[TodoItem]:
    """The stored list; malformed entries are skipped rather than failing the turn."""
    items: list[TodoItem] = []
    for entry in metadata.get(METADATA_KEY) or []:
        if not isinstance(entry, dict) or not entry.get("text"):
            continue
        status = entry.get("status") if entry.get("status") in STATUSES else "pending"
        items.append(
            TodoItem(
                id=str(entry.get("id") or len(items) + 1),
                text=str(entry["text"]),
                status=status,
                validation=str(entry.get("validation") or ""),
            )
        )
    return items


def next_id(items: Iterable[TodoItem]) -> str:
    numbers = [int(i.id) for i in items if i.id.isdigit()]
    return str(max(numbers, default=0) + 1)


def render(items: list[TodoItem]) -> str:
    if not items:
        return "The todo list is empty."
    done = sum(1 for i in items if i.status == "done")
    lines = [f"Todo ({done}/{len(items)} done):"]
    for item in items:
        line = f"{_MARK.get(item.status, '[ ]')} {item.id}. {item.text}"
        if item.validation:
            line += f" (validated: {item.validation})"
        lines.append(line)
    return "\n".join(lines)


def is_forward(old: str, new: str) -> bool:
    return _RANK.get(new, 0) > _RANK.get(old, 0)


# -- state and persistence ---------------------------------------------------------------------
def _persistent(ctx: ToolContext) -> bool:
    return bool(ctx.session_id) and not ctx.is_subagent


async def load_todo(ctx: ToolContext) -> list[TodoItem]:
    """The turn's list, read from the session's metadata when the turn holds none yet."""
    if not ctx.state.todo and _persistent(ctx):
        reply = await ctx.store.GetSession(
            store_pb.GetSessionRequest(session_id=ctx.session_id, view=store_pb.SESSION_VIEW_SUMMARY)
        )
        ctx.state.todo = items_from_metadata(from_struct(reply.session.metadata))
    return ctx.state.todo


async def save_todo(ctx: ToolContext, items: list[TodoItem]) -> None:
    """Make `items` the list: in the turn's state, in the session, and flagged for TodoUpdated."""
    if _persistent(ctx) and ctx.update_session is not None:
        await ctx.update_session(metadata={METADATA_KEY: [item_to_dict(i) for i in items]})
    ctx.state.todo = list(items)
    ctx.state.todo_changed = True


async def replace_todo(ctx: ToolContext, texts: Iterable[str]) -> list[TodoItem]:
    """A fresh list of pending items (the plan tool fills the todo this way)."""
    items = [TodoItem(id=str(n), text=text, status="pending") for n, text in enumerate(texts, 1)]
    await save_todo(ctx, items)
    return items


# -- the tool ----------------------------------------------------------------------------------
def _new_items(raw: Any, start: int, validation_required: bool) -> list[TodoItem]:
    if not isinstance(raw, list) or not raw:
        raise ToolInputError("'items' must be a non-empty list of step descriptions")
    items = []
    for n, entry in enumerate(raw):
        if isinstance(entry, str):
            entry = {"text": entry}
        if not isinstance(entry, dict) or not str(entry.get("text") or "").strip():
            raise ToolInputError(f"items[{n}] needs a 'text'")
        status = str(entry.get("status") or "pending")
        if status not in STATUSES:
            raise ToolInputError(f"items[{n}].status must be one of {', '.join(STATUSES)}")
        validation = str(entry.get("validation") or "").strip()
        if status == "done" and validation_required and not validation:
            raise ToolInputError(f"items[{n}] is marked done without a 'validation': say how the step was checked")
        items.append(TodoItem(id=str(start + n), text=str(entry["text"]).strip(), status=status, validation=validation))
    return items


class TodoTool:
    name = "todo"
    reach = Reach.SESSION  # its own session and the model only: a clamped sub-agent keeps it
    description = (
        "Keep the todo list current: set (replace with items), add (append items), update (one item's status "
        "by id; say how you checked it in validation when marking done), list."
    )
    parameters = {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["set", "add", "update", "list"]},
            "items": {
                "type": "array",
                "description": "Steps, one action each.",
                "items": {"type": "string"},
            },
            "id": {"type": "string"},
            "status": {"type": "string", "enum": list(STATUSES)},
            "validation": {"type": "string", "description": "Evidence that the step is really done."},
        },
        "required": ["action"],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            return await self._run(args, ctx)
        except ToolInputError as exc:
            return error(f"todo: {exc}")

    async def _run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        action = text_arg(args, "action", required=True)
        validation_required = ctx.profile.step_validation_enabled
        items = list(await load_todo(ctx))
        if action == "list":
            return self._result(items)
        if action == "set":
            items = _new_items(args.get("items"), 1, validation_required)
        elif action == "add":
            items += _new_items(args.get("items"), int(next_id(items)), validation_required)
        elif action == "update":
            items = self._updated(items, args, ctx, validation_required)
        else:
            raise ToolInputError(f"unknown action {action!r}: use set, add, update or list")
        await save_todo(ctx, items)
        return self._result(items)

    @staticmethod
    def _updated(
        items: list[TodoItem], args: dict[str, Any], ctx: ToolContext, validation_required: bool
    ) -> list[TodoItem]:
        item_id = text_arg(args, "id", required=True)
        status = text_arg(args, "status", required=True)
        if status not in STATUSES:
            raise ToolInputError(f"'status' must be one of {', '.join(STATUSES)}")
        validation = text_arg(args, "validation")
        position = next((n for n, i in enumerate(items) if i.id == item_id), None)
        if position is None:
            known = ", ".join(i.id for i in items) or "none: the list is empty"
            raise ToolInputError(f"no item with id {item_id!r} (ids: {known})")
        old = items[position]
        if status == "done" and validation_required and not (validation or old.validation):
            raise ToolInputError(
                "this profile requires a 'validation' to mark a step done: say how you checked the result"
            )
        if is_forward(old.status, status):
            ctx.state.todo_progress += 1
        items[position] = TodoItem(id=old.id, text=old.text, status=status, validation=validation or old.validation)
        return items

    @staticmethod
    def _result(items: list[TodoItem]) -> ToolResult:
        return ToolResult(content=render(items), untrusted=False, metadata={"todo": [item_to_dict(i) for i in items]})

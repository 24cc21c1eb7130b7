"""`pal memory [add|edit|remove|pending|approve|reject]`: what the agent remembers about you across
sessions, and the writes of tainted conversations waiting for your approval."""

from __future__ import annotations

import argparse

from rich.table import Table

from palimpsest.cli.app import App
from palimpsest.cli.commands import Subparsers
from palimpsest.v1 import session_store_pb2 as pb

ACTION_WORDS = {pb.MEMORY_ACTION_ADD: "add", pb.MEMORY_ACTION_REPLACE: "replace", pb.MEMORY_ACTION_REMOVE: "remove"}
WHEN_SEEN = "new sessions see it at once; a session under way at its next compaction (pal chat: /compact)"


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    memory = sub.add_parser(
        "memory",
        parents=[common],
        help="what the agent remembers about you: view it (no action), edit it, approve held writes",
    )
    memory.set_defaults(handler=view)
    actions = memory.add_subparsers(dest="action", metavar="ACTION")

    def with_revision(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument(
            "--revision",
            type=int,
            default=None,
            metavar="N",
            help="refuse the change unless the memory is still at revision N (pal memory shows it)",
        )
        return p

    p = with_revision(actions.add_parser("add", help="remember a new entry", parents=[common]))
    p.add_argument("text", nargs="+")
    p.set_defaults(handler=add)

    p = with_revision(actions.add_parser("edit", help="give an entry new text", parents=[common]))
    p.add_argument("id", type=int)
    p.add_argument("text", nargs="+")
    p.set_defaults(handler=edit)

    p = with_revision(actions.add_parser("remove", help="forget an entry", parents=[common]))
    p.add_argument("id", type=int)
    p.set_defaults(handler=remove)

    p = actions.add_parser(
        "pending", help="writes of tainted conversations waiting for your approval", parents=[common]
    )
    p.set_defaults(handler=pending)

    p = with_revision(actions.add_parser("approve", help="apply a held write", parents=[common]))
    p.add_argument("id", type=int)
    p.set_defaults(handler=approve)

    p = actions.add_parser("reject", help="drop a held write", parents=[common])
    p.add_argument("id", type=int)
    p.set_defaults(handler=reject)


def _get(app: App) -> pb.GetMemoryResponse:
    return app.conn.store().GetMemory(pb.GetMemoryRequest())


def view(app: App, args: argparse.Namespace) -> int:
    memory = _get(app)
    if app.out.json:
        app.out.emit(memory)
        return 0
    app.out.console.print(
        f"memory at revision {memory.revision}: {len(memory.entries)} of {memory.max_entries} "
        f"entries, {memory.chars:,} of {memory.max_chars:,} characters",
        style="bold",
        markup=False,
    )
    if memory.entries:
        table = Table("id", "entry", "written by", box=None)
        for entry in memory.entries:
            table.add_row(str(entry.id), entry.text, f"session {entry.session_id}" if entry.session_id else "you")
        app.out.console.print(table)
    if memory.pending:
        app.out.note(f"{len(memory.pending)} held write(s) wait for your approval: pal memory pending")
    return 0


def _edit(app: App, args: argparse.Namespace, request: pb.EditMemoryRequest) -> int:
    if args.revision is not None:
        request.expected_revision = args.revision
    reply = app.conn.store().EditMemory(request)
    if app.out.json:
        app.out.emit(reply)
        return 0
    done = {pb.MEMORY_ACTION_ADD: "remembered", pb.MEMORY_ACTION_REPLACE: "changed", pb.MEMORY_ACTION_REMOVE: "forgot"}[
        request.action
    ]
    app.out.console.print(f"{done} entry {reply.entry.id}: {reply.entry.text}", markup=False)
    app.out.note(f"memory at revision {reply.revision}; {WHEN_SEEN}")
    return 0


def add(app: App, args: argparse.Namespace) -> int:
    return _edit(app, args, pb.EditMemoryRequest(action=pb.MEMORY_ACTION_ADD, text=" ".join(args.text)))


def edit(app: App, args: argparse.Namespace) -> int:
    return _edit(
        app, args, pb.EditMemoryRequest(action=pb.MEMORY_ACTION_REPLACE, entry_id=args.id, text=" ".join(args.text))
    )


def remove(app: App, args: argparse.Namespace) -> int:
    return _edit(app, args, pb.EditMemoryRequest(action=pb.MEMORY_ACTION_REMOVE, entry_id=args.id))


def pending(app: App, args: argparse.Namespace) -> int:
    held = _get(app).pending
    if app.out.json:
        for write in held:
            app.out.emit(write)
        return 0
    if not held:
        app.out.note("no writes wait for your approval")
        return 0
    table = Table("id", "action", "text", "from session", box=None)
    for write in held:
        action = ACTION_WORDS.get(write.action, "?")
        if write.entry_id:
            action += f" entry {write.entry_id}"
        text = write.text if not write.old_text else f"{write.text}  (was: {write.old_text})".strip()
        table.add_row(str(write.id), action, text, write.session_id)
    app.out.console.print(table)
    app.out.note("apply one with `pal memory approve ID`, drop it with `pal memory reject ID`")
    return 0


def approve(app: App, args: argparse.Namespace) -> int:
    request = pb.ApproveMemoryWriteRequest(id=args.id)
    if args.revision is not None:
        request.expected_revision = args.revision
    reply = app.conn.store().ApproveMemoryWrite(request)
    if app.out.json:
        app.out.emit(reply)
        return 0
    app.out.console.print(f"approved write {args.id} (entry {reply.entry.id}: {reply.entry.text})", markup=False)
    app.out.note(f"memory at revision {reply.revision}; {WHEN_SEEN}")
    return 0


def reject(app: App, args: argparse.Namespace) -> int:
    reply = app.conn.store().RejectMemoryWrite(pb.RejectMemoryWriteRequest(id=args.id))
    if app.out.json:
        app.out.emit(reply)
        return 0
    app.out.console.print(f"rejected write {args.id}: it never reaches the memory", markup=False)
    return 0

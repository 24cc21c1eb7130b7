"""`pal audit [ID]`: a session's audit log, every tool run of its turns and their sub-agents (the
most recent session without an ID)."""

from __future__ import annotations

import argparse

from palimpsest.cli.app import App
from palimpsest.cli.commands import Subparsers
from palimpsest.cli.commands.turns import most_recent_session
from palimpsest.cli.errors import CliError
from palimpsest.cli.views import tool_runs_table
from palimpsest.v1 import session_store_pb2 as pb
from palimpsest.v1.session_store_pb2_grpc import SessionStoreStub

# The store's own cap on one page.
MAX_PAGE = 500


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "audit", help="a session's audit log: every tool run, its outcome, time and bytes", parents=[common]
    )
    p.add_argument("session_id", nargs="?", default="", help="the session (default: the most recent one)")
    p.add_argument("--last", type=int, default=0, metavar="N", help="only the newest N runs (default: all)")
    p.set_defaults(handler=audit)


def tool_runs(store: SessionStoreStub, session_id: str, last: int = 0) -> list[pb.ToolRun]:
    """The session's runs, oldest first: all of them, or the newest `last`."""
    runs: list[pb.ToolRun] = []
    if last:
        before = 0
        while len(runs) < last:
            page = store.ListToolRuns(
                pb.ListToolRunsRequest(session_id=session_id, before_seq=before, limit=min(MAX_PAGE, last - len(runs)))
            )
            runs[:0] = page.runs
            if not page.has_more or not page.runs:
                break
            before = page.runs[0].seq
        return runs
    after = 0
    while True:
        page = store.ListToolRuns(pb.ListToolRunsRequest(session_id=session_id, after_seq=after, limit=MAX_PAGE))
        runs.extend(page.runs)
        if not page.has_more or not page.runs:
            return runs
        after = page.runs[-1].seq


def audit(app: App, args: argparse.Namespace) -> int:
    if args.last < 0:
        raise CliError("--last must not be negative", exit_code=2)
    store = app.conn.store()
    session_id = args.session_id.strip() or most_recent_session(store)
    if not args.session_id.strip():
        app.out.note(f"the most recent session: {session_id}")
    runs = tool_runs(store, session_id, args.last)
    if app.out.json:
        for run in runs:
            app.out.emit(run)
        return 0
    if not runs:
        app.out.console.print(f"no tool has run in session {session_id} yet")
        return 0
    app.out.console.print(tool_runs_table(runs))
    return 0

"""`pal sessions …`: list, show, delete, trim, cleanup, search, pin, rename, share."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Sequence

from rich.console import RenderableType
from rich.text import Text

from palimpsest.cli.app import App
from palimpsest.cli.commands import Subparsers
from palimpsest.cli.commands.turns import most_recent_session
from palimpsest.cli.errors import CliError
from palimpsest.cli.output import to_dict
from palimpsest.cli.views import message_view, session_header, sessions_table, shared_header
from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as pb

SORTS = {
    "active": pb.SORT_BY_LAST_ACTIVE,
    "created": pb.SORT_BY_CREATED_AT,
    "name": pb.SORT_BY_NAME,
    "messages": pb.SORT_BY_MESSAGE_COUNT,
}
# The store's own cap on one page.
MAX_PAGE = 500


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    sessions = sub.add_parser("sessions", help="list and manage sessions", parents=[common])
    actions = sessions.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = actions.add_parser("list", help="the newest sessions, pinned first", parents=[common])
    p.add_argument("-n", "--limit", type=int, default=20, help="how many (default 20, at most 500)")
    p.add_argument("--offset", type=int, default=0, help="skip this many (paging)")
    p.add_argument("--profile", default="", help="only sessions of this profile")
    p.add_argument("--sort", choices=sorted(SORTS), default="active", help="order (default: last active)")
    p.add_argument("--oldest-first", action="store_true", help="ascending order")
    p.set_defaults(handler=list_sessions)

    p = actions.add_parser(
        "show", help="a session and its display history (default: the most recent)", parents=[common]
    )
    p.add_argument("session_id", nargs="?", default="", help="the session (default: the most recently active one)")
    p.add_argument("--profile", default="", help="without an id: the most recent session of this profile")
    p.add_argument("--last", type=int, default=0, metavar="N", help="only the newest N messages")
    p.add_argument("--thinking", action="store_true", help="include the model's thinking")
    p.set_defaults(handler=show)

    p = actions.add_parser("delete", help="delete sessions with everything they own", parents=[common])
    p.add_argument("session_ids", nargs="+", metavar="session_id")
    p.set_defaults(handler=delete)

    p = actions.add_parser("trim", help="keep only the newest messages", parents=[common])
    p.add_argument("session_id")
    p.add_argument("--keep", type=int, required=True, help="messages kept (the first system message counts)")
    p.set_defaults(handler=trim)

    p = actions.add_parser("cleanup", help="delete sessions idle for a while", parents=[common])
    p.add_argument("--older-than", type=int, default=30, metavar="DAYS", help="idle days (default 30)")
    p.add_argument("--yes", action="store_true", help="confirm --older-than 0, which deletes every session")
    p.set_defaults(handler=cleanup)

    p = actions.add_parser(
        "search",
        help="sessions whose name or messages contain a text or two of its words, best match first",
        parents=[common],
    )
    p.add_argument("query", nargs="+")
    p.add_argument("-n", "--limit", type=int, default=20, help="how many sessions (default 20)")
    p.add_argument("--profile", default="", help="only sessions of this profile")
    p.set_defaults(handler=search)

    p = actions.add_parser("pin", help="pin a session to the top of the list", parents=[common])
    p.add_argument("session_id")
    p.add_argument("--off", action="store_true", help="unpin instead")
    p.set_defaults(handler=pin)

    p = actions.add_parser("rename", help="give a session a name", parents=[common])
    p.add_argument("session_id")
    p.add_argument("name", nargs="+")
    p.set_defaults(handler=rename)

    p = actions.add_parser("share", help="a read-only share token for a session", parents=[common])
    p.add_argument("session_id")
    p.set_defaults(handler=share)

    p = sub.add_parser("shared", help="read a session someone shared with you (its share token)", parents=[common])
    p.add_argument("token", nargs="?", default="", help="the token `pal sessions share ID` printed")
    # A link made before tokens avoided a leading '-' (see dashed_token_args) arrives here.
    p.add_argument("--token", dest="dashed_token", default="", help=argparse.SUPPRESS)
    p.add_argument(
        "--last", type=int, default=0, metavar="N", help=f"the newest N messages (default 50, at most {MAX_PAGE})"
    )
    p.add_argument("--before", type=int, default=0, metavar="SEQ", help="messages before #SEQ (older pages)")
    p.set_defaults(handler=shared)


def _page_size(limit: int) -> int:
    if not 1 <= limit <= MAX_PAGE:
        raise CliError(f"--limit must be between 1 and {MAX_PAGE}, got {limit}", exit_code=2)
    return limit


def list_sessions(app: App, args: argparse.Namespace) -> int:
    response = app.conn.store().ListSessions(
        pb.ListSessionsRequest(
            profile_id=args.profile,
            sort_by=SORTS[args.sort],
            descending=not args.oldest_first,
            page_size=_page_size(args.limit),
            offset=max(args.offset, 0),
        )
    )
    if app.out.json:
        app.out.emit(response)
        return 0
    if not response.sessions:
        app.out.console.print('no sessions yet: start one with [bold]pal chat[/] or [bold]pal run "…"[/]')
        return 0
    app.out.console.print(sessions_table(response.sessions))
    shown = args.offset + len(response.sessions)
    if response.has_more:
        app.out.note(f"{shown} of {response.total} shown · more with --limit or --offset {shown}")
    return 0


def show(app: App, args: argparse.Namespace) -> int:
    store = app.conn.store()
    args.session_id = args.session_id or most_recent_session(store, args.profile)
    if args.last > 0:
        session = store.GetSession(
            pb.GetSessionRequest(session_id=args.session_id, view=pb.SESSION_VIEW_SUMMARY)
        ).session
        page = store.GetHistoryPage(
            pb.GetHistoryPageRequest(session_id=args.session_id, limit=min(args.last, MAX_PAGE))
        )
        session.messages.extend(page.messages)
    else:
        session = store.GetSession(
            pb.GetSessionRequest(session_id=args.session_id, view=pb.SESSION_VIEW_DISPLAY)
        ).session
    if app.out.json:
        app.out.emit(session)
        return 0
    _print_history(app, session_header(session), session.messages, "no messages yet", show_thinking=args.thinking)
    return 0


def _print_history(
    app: App, header: RenderableType, messages: Iterable[common_pb2.Message], empty: str, show_thinking: bool = False
) -> None:
    console = app.out.console
    console.print(header)
    shown = 0
    for message in messages:
        console.print(message_view(message, show_thinking=show_thinking))
        shown += 1
    if not shown:
        console.print(Text(empty, style="dim"))


def delete(app: App, args: argparse.Namespace) -> int:
    store = app.conn.store()
    for session_id in args.session_ids:
        store.DeleteSession(pb.DeleteSessionRequest(session_id=session_id))
        if app.out.json:
            app.out.emit({"session_id": session_id, "deleted": True})
        else:
            app.out.console.print(f"deleted {session_id}")
    return 0


def trim(app: App, args: argparse.Namespace) -> int:
    if args.keep < 1:
        raise CliError("--keep must be at least 1", exit_code=2)
    response = app.conn.store().TrimSession(pb.TrimSessionRequest(session_id=args.session_id, keep=args.keep))
    if app.out.json:
        app.out.emit({"session_id": args.session_id, **to_dict(response)})
    else:
        app.out.console.print(
            f"kept {response.after} of {response.before} messages (dropped {response.dropped}) in {args.session_id}"
        )
    return 0


def cleanup(app: App, args: argparse.Namespace) -> int:
    if args.older_than < 0:
        raise CliError("--older-than must not be negative", exit_code=2)
    if args.older_than == 0 and not args.yes:
        raise CliError("--older-than 0 deletes every session you can see: add --yes to confirm", exit_code=2)
    response = app.conn.store().CleanupSessions(pb.CleanupSessionsRequest(older_than_days=args.older_than))
    if app.out.json:
        app.out.emit(response)
        return 0
    app.out.console.print(f"deleted {response.deleted} session(s) idle for more than {args.older_than} day(s)")
    for session_id in response.session_ids:
        app.out.console.print(f"  {session_id}", style="dim")
    return 0


def search(app: App, args: argparse.Namespace) -> int:
    query = " ".join(args.query).strip()
    if not query:
        raise CliError("search needs a query", exit_code=2)
    store = app.conn.store()
    found = store.ListSessions(
        pb.ListSessionsRequest(
            query=query, profile_id=args.profile, sort_by=pb.SORT_BY_RELEVANCE, page_size=_page_size(args.limit)
        )
    )
    matches: dict[str, pb.SessionMatch] = {}
    if found.sessions:
        response = store.SearchMatches(pb.SearchMatchesRequest(session_ids=[s.id for s in found.sessions], query=query))
        matches = {m.session_id: m for m in response.matches}
    if app.out.json:
        # `list`'s object (ListSessionsResponse: `total` an int64, so a string), each session with its matches.
        listed = to_dict(found)
        listed["sessions"] = [
            dict(to_dict(s), matches=to_dict(matches[s.id]) if s.id in matches else {}) for s in found.sessions
        ]
        app.out.emit({"query": query, **listed})
        return 0
    if not found.sessions:
        app.out.console.print(f"no session mentions {query!r}")
        return 0
    snippets = {sid: (len(m.display_indices), m.snippet) for sid, m in matches.items()}
    app.out.console.print(sessions_table(found.sessions, snippets))
    if found.has_more:
        app.out.note(f"{len(found.sessions)} of {found.total} shown · more with --limit")
    return 0


def _update(app: App, request: pb.UpdateSessionRequest) -> common_pb2.Session:
    response: pb.UpdateSessionResponse = app.conn.store().UpdateSession(request)
    return response.session


def pin(app: App, args: argparse.Namespace) -> int:
    session = _update(app, pb.UpdateSessionRequest(session_id=args.session_id, pinned=not args.off))
    if app.out.json:
        app.out.emit({"session_id": session.id, "pinned": session.pinned})
    else:
        app.out.console.print(f"{'pinned' if session.pinned else 'unpinned'} {session.id}")
    return 0


def rename(app: App, args: argparse.Namespace) -> int:
    name = " ".join(args.name).strip()
    if not name:
        raise CliError("the new name is empty", exit_code=2)
    session = _update(app, pb.UpdateSessionRequest(session_id=args.session_id, name=name))
    if app.out.json:
        app.out.emit({"session_id": session.id, "name": session.name})
    else:
        app.out.console.print(f"renamed {session.id} to {session.name!r}")
    return 0


def share(app: App, args: argparse.Namespace) -> int:
    response = app.conn.store().CreateShare(pb.CreateShareRequest(session_id=args.session_id))
    if app.out.json:
        app.out.emit(dict(to_dict(response), session_id=args.session_id))
        return 0
    # The bare token on stdout so `TOKEN=$(pal sessions share ID)` works; the hint goes to stderr.
    sys.stdout.write(response.token + "\n")
    sys.stdout.flush()
    app.out.errors.print(
        "read-only share token for this session; anyone holding it can read the history "
        "with `pal shared TOKEN` (SessionStore.GetShared)",
        style="dim",
    )
    return 0


def shared(app: App, args: argparse.Namespace) -> int:
    if args.before < 0:
        raise CliError("--before must not be negative", exit_code=2)
    token = (args.token or args.dashed_token).strip()
    if not token:
        raise CliError("the share token is empty", exit_code=2)
    response = app.conn.store().GetShared(
        pb.GetSharedRequest(token=token, before_seq=args.before, limit=_page_size(args.last) if args.last else 0)
    )
    if app.out.json:
        app.out.emit(response)
        return 0
    _print_history(app, shared_header(response), response.messages, "no messages")
    if response.has_more:
        app.out.note(f"older messages: pal shared TOKEN --before {response.messages[0].seq}")
    return 0


# A share token: 32 bytes in URL-safe base64, unpadded.
_TOKEN_SHAPE = re.compile(r"[A-Za-z0-9_-]{43}")


def dashed_token_args(argv: Sequence[str]) -> list[str]:
    """``argv`` with a share token that begins with '-' after ``shared`` passed as ``--token=…``:
    links made before the store stopped issuing such tokens (one in 64) would otherwise be read as
    an unknown option. No option of pal is 43 characters of the token's alphabet."""
    out = list(argv)
    if "shared" not in out:
        return out
    start = out.index("shared") + 1
    return out[:start] + [f"--token={a}" if a.startswith("-") and _TOKEN_SHAPE.fullmatch(a) else a for a in out[start:]]

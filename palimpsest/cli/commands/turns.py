"""`pal run` (a new session) and `pal continue` (the most recent one, or --id): one streamed turn."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import BinaryIO

from palimpsest.cli.app import App
from palimpsest.cli.client_tools import LocalTool, add_client_tools_flag, declare, runner_for
from palimpsest.cli.commands import Subparsers
from palimpsest.cli.errors import CliError
from palimpsest.cli.render import ContextMeter, renderer_for
from palimpsest.cli.streaming import StreamResult, stream_turn
from palimpsest.cli.uploads import local_file, new_session, upload
from palimpsest.shared.errors import InvalidArgument
from palimpsest.shared.external_refs import FLAG_NAME, parse_ref_flag, ref_to_proto
from palimpsest.v1 import agent_pb2, common_pb2
from palimpsest.v1 import session_store_pb2 as pb
from palimpsest.v1.session_store_pb2_grpc import SessionStoreStub

# ListSessions puts pinned sessions first, so the most recent one may sit below them.
_SCAN_PAGE = 100


def ref_flag(value: str) -> common_pb2.ExternalRef:
    """One --ref value, checked before anything is sent: a malformed ref the user asked for is a
    usage error naming the flag, never dropped."""
    try:
        return ref_to_proto(parse_ref_flag(value))
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{FLAG_NAME}: ")) from None


def add_ref_flag(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--ref",
        "--external-ref",
        dest="refs",
        action="append",
        default=[],
        type=ref_flag,
        metavar="KIND=URI",
        help=f"{what} a pointer to outside state, stored and never opened "
        "(repeatable; long form kind=…,uri=…,created_by=…,read_only=true)",
    )


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("run", help="run a task in a new session, streamed", parents=[common])
    p.add_argument("text", nargs="+", help="the task ('-' reads it from stdin)")
    p.add_argument("--profile", default="", help="agent profile (default: the Agent's default)")
    p.add_argument("--image", action="append", default=[], metavar="PATH", help="send an image (repeatable)")
    add_ref_flag(p, "give the session")
    p.add_argument(
        "--attach",
        action="append",
        default=[],
        metavar="FILE",
        help="upload a file to the session and tell the model where it is (repeatable)",
    )
    add_client_tools_flag(p)
    p.set_defaults(handler=run)

    p = sub.add_parser("continue", help="send a message to the most recent session, streamed", parents=[common])
    p.add_argument("text", nargs="+", help="the message ('-' reads it from stdin)")
    p.add_argument("--id", dest="session_id", default="", help="this session instead of the most recent")
    p.add_argument("--profile", default="", help="the most recent session of this profile")
    p.add_argument("--image", action="append", default=[], metavar="PATH", help="send an image (repeatable)")
    add_ref_flag(p, "add to the session")
    p.add_argument(
        "--attach",
        action="append",
        default=[],
        metavar="FILE",
        help="upload a file to the session and tell the model where it is (repeatable)",
    )
    add_client_tools_flag(p)
    p.set_defaults(handler=continue_)


def message_text(words: list[str]) -> str:
    text = sys.stdin.read() if words == ["-"] else " ".join(words)
    if not text.strip():
        raise CliError("the message is empty", exit_code=2)
    return text


def read_images(paths: list[str]) -> list[bytes]:
    images = []
    for raw in paths:
        path = Path(raw).expanduser()
        try:
            images.append(path.read_bytes())
        except OSError as err:
            raise CliError(f"cannot read image {raw}: {err.strerror or err}") from None
    return images


def most_recent_session(store: SessionStoreStub, profile_id: str = "") -> str:
    """The session with the newest activity, pinned or not."""
    best: tuple[int, str] | None = None
    offset = 0
    while True:
        page = store.ListSessions(
            pb.ListSessionsRequest(
                profile_id=profile_id,
                sort_by=pb.SORT_BY_LAST_ACTIVE,
                descending=True,
                page_size=_SCAN_PAGE,
                offset=offset,
            )
        )
        for summary in page.sessions:
            stamp = summary.last_active.ToNanoseconds()
            if best is None or stamp > best[0]:
                best = (stamp, summary.id)
            if not summary.pinned:
                # Unpinned rows are in last-active order: nothing after the first one is newer.
                return best[1]
        if not page.has_more:
            break
        offset += len(page.sessions)
    if best is None:
        where = f" of profile {profile_id!r}" if profile_id else ""
        raise CliError(f'no sessions{where} yet: start one with pal run "…"')
    return best[1]


def stream_one_turn(
    app: App, request: agent_pb2.RunStreamRequest, tools: list[LocalTool] | None = None
) -> StreamResult:
    agent = app.conn.agent()
    renderer = renderer_for(app.out, ContextMeter())
    declare(request, tools or [])
    result = stream_turn(
        agent,
        lambda: agent.RunStream(request),
        renderer,
        request.session_id,
        tools=runner_for(agent, tools or [], renderer.note),
    )
    if not app.out.json and result.outcome.session_id:
        app.out.note(f'session {result.outcome.session_id} · pal continue --id {result.outcome.session_id} "…"')
    return result


def attach_all(app: App, session_id: str, locals_: list[tuple[Path, BinaryIO]]) -> list[str]:
    """Upload the files to the session; their stored names, for the turn's `attachments`."""
    names = []
    for local in locals_:
        info = upload(app, session_id, local)
        app.out.note(f"attached {local[0]} as {info.name} ({info.size:,} bytes)")
        names.append(info.name)
    return names


def run(app: App, args: argparse.Namespace) -> int:
    text, images = message_text(args.text), read_images(args.image)
    files = [local_file(raw) for raw in args.attach]  # every file readable before anything is made
    session_id, names = "", []
    if files:
        # Files are uploaded to a session: it is made first, and removed again if one is refused.
        session_id = new_session(app, args.profile)
        app.out.note(f"started session {session_id} for the attached files")
        try:
            names = attach_all(app, session_id, files)
        except CliError:
            app.conn.store().DeleteSession(pb.DeleteSessionRequest(session_id=session_id))
            raise
    request = agent_pb2.RunStreamRequest(
        session_id=session_id,
        profile_id=args.profile,
        text=text,
        images=images,
        external_refs=args.refs,
        attachments=names,
    )
    return stream_one_turn(app, request, args.client_tools).exit_code


def continue_(app: App, args: argparse.Namespace) -> int:
    text = message_text(args.text)
    images = read_images(args.image)
    files = [local_file(raw) for raw in args.attach]
    session_id = args.session_id or most_recent_session(app.conn.store(), args.profile)
    request = agent_pb2.RunStreamRequest(
        session_id=session_id,
        text=text,
        images=images,
        external_refs=args.refs,
        attachments=attach_all(app, session_id, files),
    )
    return stream_one_turn(app, request, args.client_tools).exit_code

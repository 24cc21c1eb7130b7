"""`pal files list|get`: a session's files, and fetching one by the link a tool gave (share_file,
content_publish) or by session and name."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rich.table import Table

from palimpsest.cli.app import App
from palimpsest.cli.commands import Subparsers
from palimpsest.cli.errors import CliError
from palimpsest.shared.file_policy import parse_file_link
from palimpsest.v1 import session_store_pb2 as pb


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    files = sub.add_parser("files", help="a session's files: list them, fetch one", parents=[common])
    actions = files.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = actions.add_parser("list", help="the files of a session", parents=[common])
    p.add_argument("session_id")
    p.set_defaults(handler=list_files)

    p = actions.add_parser(
        "get", help="fetch a file: by its palimpsest:// link, or by session id and name", parents=[common]
    )
    p.add_argument("link", help="the palimpsest://sessions/…/files/… link, or a session id")
    p.add_argument("name", nargs="?", default="", help="the file's name (with a session id)")
    p.add_argument(
        "-o",
        "--output",
        default="",
        metavar="PATH",
        help="where to write it (default: its name in this folder; '-' for stdout)",
    )
    p.add_argument("--force", action="store_true", help="replace a file already at the output path")
    p.set_defaults(handler=get_file)


def list_files(app: App, args: argparse.Namespace) -> int:
    listed = app.conn.store().ListFiles(pb.ListFilesRequest(session_id=args.session_id))
    if app.out.json:
        for info in listed.files:
            app.out.emit(info)
        return 0
    if not listed.files:
        app.out.note("no files in this session")
        return 0
    table = Table("name", "size", "type", box=None)
    for info in listed.files:
        table.add_row(info.name, f"{info.size:,}", info.content_type)
    app.out.console.print(table)
    return 0


def target_of(link: str, name: str) -> tuple[str, str]:
    """(session id, name) from a link, or from a session id and a name."""
    linked = parse_file_link(link)
    if linked is not None:
        if name:
            raise CliError("give a link, or a session id and a name, not both", exit_code=2)
        return linked
    if link.startswith("palimpsest://"):
        raise CliError(f"{link!r} is not a file link (palimpsest://sessions/ID/files/NAME)", exit_code=2)
    if not name:
        raise CliError("which file? give its link, or the session id and the file's name", exit_code=2)
    return link, name


def get_file(app: App, args: argparse.Namespace) -> int:
    session_id, name = target_of(args.link, args.name)
    stream = iter(app.conn.store().GetFile(pb.GetFileRequest(session_id=session_id, name=name)))
    first = next(stream)  # the file's info: a wrong id or name fails here, before anything is written
    if args.output == "-":
        for part in stream:
            sys.stdout.buffer.write(part.chunk)
        sys.stdout.buffer.flush()
        return 0
    path = Path(args.output or first.info.name).expanduser()
    if path.is_dir():
        path = path / first.info.name
    partial = path.with_name(f".{path.name}.part")
    try:
        with partial.open("wb") as out:
            for part in stream:
                out.write(part.chunk)
        if args.force:
            os.replace(partial, path)
        else:
            os.link(partial, path)  # never replaces a file already there
            partial.unlink()
    except FileExistsError:
        partial.unlink(missing_ok=True)
        raise CliError(f"{path} already exists: choose another with -o, or replace it with --force") from None
    except OSError as err:
        partial.unlink(missing_ok=True)
        raise CliError(f"cannot write {path}: {err.strerror or err}") from None
    app.out.note(f"saved {path} ({first.info.size:,} bytes, {first.info.content_type})")
    return 0

"""`pal`: the command-line client of Palimpsest. Parses arguments and dispatches; commands live in commands/."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from palimpsest.cli.app import App
from palimpsest.cli.commands import audit, chat, files, info, memory, sessions, turns
from palimpsest.cli.connection import Connection
from palimpsest.cli.errors import CliError
from palimpsest.cli.output import Output
from palimpsest.cli.signals import route_sigint_to_main_thread
from palimpsest.shared import tls

DESCRIPTION = """\
Talk to Palimpsest's services: chat with the Agent, run one-off tasks, and manage sessions.
Addresses come from PALIMPSEST_STORE_ADDR, PALIMPSEST_AGENT_ADDR and PALIMPSEST_COMPRESSOR_ADDR
(defaults: 127.0.0.1:50051, :50053, :50052); with auth on, PALIMPSEST_TOKEN holds your JWT. Over TLS,
PALIMPSEST_TLS_CA (or --tls-ca) names the CA that signed the services' certificates; for mutual TLS,
PALIMPSEST_TLS_CERT and PALIMPSEST_TLS_KEY are yours."""


def build_parser() -> argparse.ArgumentParser:
    # --json is accepted before or after the subcommand; SUPPRESS keeps a subparser from resetting it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="machine-readable output: one JSON object per line",
    )
    parser = argparse.ArgumentParser(
        prog="pal", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--json", action="store_true", default=False, help="machine-readable output: one JSON object per line"
    )
    parser.add_argument(
        "--tls-ca",
        metavar="PEM",
        default=None,
        help="connect over TLS, trusting services whose certificates this CA signed "
        "(default: PALIMPSEST_TLS_CA; unset: plaintext)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chat.register(sub, common)
    turns.register(sub, common)
    sessions.register(sub, common)
    files.register(sub, common)
    audit.register(sub, common)
    memory.register(sub, common)
    info.register(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    route_sigint_to_main_thread()
    return run(argv)


def run(argv: Sequence[str] | None = None) -> int:
    """One command, its failures as one line; without main's process-wide SIGINT routing, which an
    embedding process (a test playing the server's side) must not have imposed on it."""
    args = build_parser().parse_args(sessions.dashed_token_args(sys.argv[1:] if argv is None else argv))
    out = Output(json=args.json)
    try:
        environ = dict(os.environ)
        if args.tls_ca:
            environ[tls.CA_ENV] = args.tls_ca
        with Connection(environ) as conn:
            return int(args.handler(App(conn, out), args))
    except CliError as err:
        out.errors.print(f"pal: {err}", style="red", markup=False, highlight=False, soft_wrap=True)
        return err.exit_code
    except KeyboardInterrupt:
        out.errors.print("pal: interrupted", style="dim")
        return 130
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away: nothing left to say, and nowhere to say it.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())

"""`python -m bench [name ...]`: run every benchmark module (or the named ones) and print its table.

Each benchmark gets its own fresh database on the chosen server (the embedded PostgreSQL unless
`--database-url` is given), created and dropped by the benchmark itself, so runs never see each
other's data.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import pkgutil
import sys
import time
import warnings
from pathlib import Path

import bench
from bench import _common


def discover() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if not m.name.startswith("_"))


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "benchmarks", nargs="*", metavar="name", help=f"benchmarks to run (default: all of {', '.join(discover())})"
    )
    parser.add_argument(
        "--database-url",
        default=None,
        help="PostgreSQL server to use (its URL; a fresh database is made on it per benchmark); "
        "default: the embedded PostgreSQL",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help=f"embedded PostgreSQL data folder (default {_common.default_data_dir()})",
    )
    parser.add_argument(
        "--keep-server",
        action="store_true",
        help="leave the embedded PostgreSQL running afterwards (default: stop it if we started it)",
    )
    parser.add_argument(
        "--keep-databases",
        action="store_true",
        help="do not drop the benchmarks' databases (their URLs are logged), e.g. to EXPLAIN queries",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smaller, faster run of every benchmark (a smoke test; numbers are not comparable)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="progress logs on stderr")
    return parser.parse_args(argv)


async def main(argv: list[str]) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(message)s",
        datefmt="%H:%M:%S",
    )
    warnings.filterwarnings("ignore", category=UserWarning, module="platformdirs")
    available = discover()
    names = args.benchmarks or available
    unknown = [n for n in names if n not in available]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; available: {', '.join(available)}", file=sys.stderr)
        return 2
    modules = [importlib.import_module(f"bench.{name}") for name in names]

    server = None
    if any(getattr(m, "NEEDS_POSTGRES", True) for m in modules):
        server = await asyncio.to_thread(_common.start_server, args.database_url, args.data_dir, args.keep_server)
    if server is not None:
        server.keep_databases = args.keep_databases
    args.server = server
    failed = 0
    try:
        print("# Palimpsest benchmarks\n")
        if server is not None:
            print(await _common.machine_summary(server))
        print(flush=True)
        for name, module in zip(names, modules):
            started = time.perf_counter()
            try:
                text = await module.run(args)
            except Exception as exc:  # one broken benchmark must not hide the others' tables
                logging.getLogger("bench").exception("benchmark %s failed", name)
                text = f"**failed:** {type(exc).__name__}: {exc}"
                failed += 1
            print(
                f"## {name}\n\n{text.rstrip()}\n\n_{name}: {time.perf_counter() - started:.0f} s; "
                f"load average (1/5/15 min) at the end {_common.load_average()}_\n",
                flush=True,
            )
    finally:
        if server is not None:
            await asyncio.to_thread(server.stop)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))

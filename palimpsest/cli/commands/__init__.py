"""One module per group of subcommands; each exposes `register(sub, common)` and handlers taking (app, args)."""

import argparse
from typing import TypeAlias

# What `add_subparsers()` returns; `common` is the parent parser that carries --json.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

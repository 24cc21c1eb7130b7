"""What every command receives: the service connection and the output channel."""

from __future__ import annotations

from dataclasses import dataclass, field

from palimpsest.cli.connection import Connection
from palimpsest.cli.output import Output


@dataclass
class App:
    conn: Connection = field(default_factory=Connection)
    out: Output = field(default_factory=Output)

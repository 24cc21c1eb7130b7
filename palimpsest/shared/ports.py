"""A free loopback port, for servers that must be told their port before they start."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on right now (another process may take it before it is used)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]

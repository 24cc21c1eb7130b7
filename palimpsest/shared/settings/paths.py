"""Defaults and conversions that settings share: the data folder, folder lists, Ollama's address."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

# PALIMPSEST_SANDBOX: what the operator says of commands' sandbox (palimpsest/agent/sandbox/policy.py).
SANDBOX_MODES = ("auto", "off", "required")


def default_data_dir() -> Path:
    """Where Palimpsest keeps its embedded database and files.

    As root the embedded PostgreSQL must run as its own system user, which needs to traverse every
    parent folder; a folder made for it under /var/lib keeps home directories closed.
    """
    if os.name == "posix" and os.geteuid() == 0:
        return Path("/var/lib/palimpsest")
    return Path(platformdirs.user_data_dir("palimpsest"))


def absolute_folders(raw: str) -> tuple[Path, ...]:
    """Folders separated by the OS path separator, each absolute (ValueError says so)."""
    roots = tuple(Path(p.strip()) for p in raw.split(os.pathsep) if p.strip())
    relative = [str(p) for p in roots if not p.is_absolute()]
    if relative or not roots:
        raise ValueError(f"absolute folders separated by {os.pathsep!r} (not {', '.join(relative) or 'none'})")
    return roots


def normalize_ollama_host(raw: str) -> str:
    """Accept Ollama's own forms: `host`, `host:port`, `0.0.0.0`, with or without a scheme."""
    host = raw.strip().rstrip("/")
    if "://" not in host:
        host = "http://" + host
    scheme, rest = host.split("://", 1)
    if ":" not in rest.split("/", 1)[0]:
        rest = rest + ":11434"
    return f"{scheme}://{rest.replace('0.0.0.0', '127.0.0.1')}"

"""A profile's `mcp_servers` entries: parsed and checked once, when the profiles file is read, into
plain frozen configs (no SDK here: profiles load without it). Errors name the entry and its key."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import PurePath
from typing import Any
from urllib.parse import urlsplit

from palimpsest.shared.errors import InvalidArgument

# The model sees a server's tools as mcp__<server>__<tool>.
PREFIX = "mcp__"
SEPARATOR = "__"
# Lower-case letters, digits, '-' and '_', never '__' nor '_' at either end: the name stays the
# one part of mcp__<server>__<tool> that can be read back unambiguously.
_NAME = re.compile(r"[a-z0-9-]+(_[a-z0-9-]+)*")
NAME_MAX_CHARS = 32
DEFAULT_TIMEOUT_S = 60.0
# Connecting (a process starting, `npx` fetching a package) may take longer than a call is allowed.
MIN_CONNECT_S = 30.0
MAX_TIMEOUT_S = 3600.0
_KEYS = frozenset({"name", "command", "url", "env", "headers", "tools", "timeout_s"})
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A header name as HTTP allows it (a token).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


@dataclass(frozen=True)
class McpServerConfig:
    """One MCP server as a profile names it: a command to run (stdio) or a URL (streamable HTTP)."""

    name: str
    command: tuple[str, ...] = ()
    url: str = ""
    env: tuple[tuple[str, str], ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    # The server's tools this profile offers (by the server's own names); None: all of them.
    tools: tuple[str, ...] | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def connection_key(self) -> "McpServerConfig":
        """What one connection is made for: profiles naming the same server the same way share it,
        whatever tools each offers of it."""
        return replace(self, tools=None)

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "http"

    @property
    def target(self) -> str:
        """Where the server is, for people: the program or the URL's origin and path. Never its
        arguments, env, headers or query, which may carry credentials."""
        if self.command:
            return f"stdio: {PurePath(self.command[0]).name}"
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
        return f"http: {parts.scheme}://{host}{port}{parts.path}"

    def tool_name(self, server_tool: str) -> str:
        """The name the model calls the server's tool by."""
        return f"{PREFIX}{self.name}{SEPARATOR}{server_tool}"

    def offers(self, server_tool: str) -> bool:
        return self.tools is None or server_tool in self.tools


def is_mcp_name(name: str) -> bool:
    """A tool name in the MCP servers' namespace (no other tool may take one)."""
    return name.startswith(PREFIX)


def server_of(name: str) -> str:
    """The server part of mcp__<server> or mcp__<server>__<tool> ("" for other names)."""
    if not is_mcp_name(name):
        return ""
    return name[len(PREFIX) :].split(SEPARATOR, 1)[0]


def parse_servers(raw: Any, profile_id: str) -> tuple[McpServerConfig, ...]:
    """The `mcp_servers` list of one profile; InvalidArgument naming the entry and key otherwise."""
    if not isinstance(raw, list):
        raise InvalidArgument("mcp_servers", f"must be a list of servers (profile {profile_id!r})")
    servers: list[McpServerConfig] = []
    for index, entry in enumerate(raw):
        server = _parse_entry(entry, f"mcp_servers[{index}]", profile_id)
        if any(s.name == server.name for s in servers):
            raise InvalidArgument(
                f"mcp_servers[{index}].name",
                f"{server.name!r} is named twice (profile {profile_id!r}); names are unique per profile",
            )
        servers.append(server)
    return tuple(servers)


def check_tool_names(names: Iterable[str], servers: Iterable[McpServerConfig], field: str, profile_id: str) -> None:
    """A tools list naming an MCP tool (mcp__<server>__<tool>) or a whole server (mcp__<server>)
    must name one of the profile's servers; which tools a server has is only known once it runs."""
    known = {s.name for s in servers}
    for name in names:
        if is_mcp_name(name) and server_of(name) not in known:
            raise InvalidArgument(
                field,
                f"{name!r} names no MCP server of profile {profile_id!r} "
                f"(its servers: {', '.join(sorted(known)) or 'none'})",
            )


def _parse_entry(entry: Any, where: str, profile_id: str) -> McpServerConfig:
    def bad(key: str, problem: str) -> InvalidArgument:
        return InvalidArgument(f"{where}.{key}" if key else where, f"{problem} (profile {profile_id!r})")

    if not isinstance(entry, Mapping):
        raise bad("", "must be an object with a name and a command or a url")
    unknown = set(entry) - _KEYS
    if unknown:
        raise bad(sorted(unknown)[0], f"unknown key; an entry takes {', '.join(sorted(_KEYS))}")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise bad("name", "required, a string")
    if len(name) > NAME_MAX_CHARS or not _NAME.fullmatch(name):
        raise bad(
            "name",
            f"{name!r}: at most {NAME_MAX_CHARS} of a-z, 0-9, '-' and single '_' inside the name "
            "(the model calls its tools mcp__<name>__<tool>)",
        )
    command, url = entry.get("command"), entry.get("url")
    if (command is None) == (url is None):
        raise bad("command" if command is not None else "url", "give exactly one of command (stdio) or url (HTTP)")
    if command is not None:
        if not isinstance(command, list) or not command or not all(isinstance(c, str) and c for c in command):
            raise bad("command", "a non-empty list of strings: the program, then its arguments")
        if any("\0" in c for c in command):
            raise bad("command", "must not contain NUL characters")
        if "headers" in entry:
            raise bad("headers", "only for a url server")
    else:
        if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
            raise bad("url", f"{url!r} is not an http(s) URL")
        if "env" in entry:
            raise bad("env", "only for a command (stdio) server")
    env = _string_pairs(entry.get("env", {}), _ENV_NAME, bad, "env")
    headers = _string_pairs(entry.get("headers", {}), _HEADER_NAME, bad, "headers")
    tools = entry.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, str) and t for t in tools)):
        raise bad("tools", "a list of the server's tool names")
    timeout = entry.get("timeout_s", DEFAULT_TIMEOUT_S)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or not 0 < timeout <= MAX_TIMEOUT_S
    ):
        raise bad("timeout_s", f"seconds, more than 0 and at most {MAX_TIMEOUT_S:.0f}")
    return McpServerConfig(
        name=name,
        command=tuple(command or ()),
        url=url or "",
        env=env,
        headers=headers,
        tools=tuple(dict.fromkeys(tools)) if tools is not None else None,
        timeout_s=float(timeout),
    )


def _string_pairs(
    raw: Any, key_pattern: re.Pattern[str], bad: Callable[[str, str], InvalidArgument], field: str
) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, Mapping):
        raise bad(field, "an object of string values")
    for key, value in raw.items():
        if not key_pattern.fullmatch(key):
            raise bad(field, f"{key!r} is not a valid name")
        if not isinstance(value, str) or "\0" in value or (field == "headers" and ("\r" in value or "\n" in value)):
            raise bad(field, f"{key!r}: the value must be a string without NUL or line breaks")
    return tuple(sorted(raw.items()))

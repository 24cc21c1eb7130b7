"""Agent profiles: a JSON file (PALIMPSEST_PROFILES) over a working built-in default.

Every flag of the agent loop lives here with its default; compression overrides travel to the
Compressor as CompressionSettings.
"""

from __future__ import annotations

import copy
import json
import logging
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from palimpsest.agent.mcp_servers.config import McpServerConfig, check_tool_names, parse_servers
from palimpsest.agent.sandbox import COMMAND_TOOL
from palimpsest.agent.sandbox.policy import SandboxPolicy, effective_policy, policy_from_config
from palimpsest.shared.errors import FailedPrecondition, InvalidArgument, NotFound
from palimpsest.v1 import agent_pb2, compressor_pb2

log = logging.getLogger("palimpsest.agent")

DEFAULT_PERSONA = (
    "You are Palimpsest, a careful assistant that works through tools. Be concise. When a task has "
    "several steps, call the plan tool first and keep the todo list current."
)

# The one provider this Agent runs models on; stored with each session as what it ran on.
PROVIDER = "ollama"

DEFAULT_TOOLS = ("plan", "todo", "spawn_agent", "memory_search", "session_search", "image_view", "switch_profile")


@dataclass(frozen=True)
class Profile:
    id: str = "default"
    name: str = "Default"
    description: str = "General assistant"
    model: str = "qwen3.6"
    # The active window; 0 means the PALIMPSEST_CONTEXT_WINDOW setting. Also sent to Ollama as num_ctx.
    context_window: int = 0
    system_prompt: str = ""
    subagent_system_prompt: str = "You are a focused sub-agent. Finish the task you are given and report the result."
    max_iterations: int = 40
    # Thinking mechanics (the agent-loop seed's flags and defaults)
    think_enabled: bool = True
    iteration_budget_enabled: bool = True
    goal_anchoring_enabled: bool = True
    goal_anchoring_interval: int = 5
    anti_stall_enabled: bool = True
    anti_stall_threshold: int = 8
    step_validation_enabled: bool = False
    subagent_planning_enabled: bool = False
    # Tools
    agent_tools: tuple[str, ...] = DEFAULT_TOOLS
    subagent_tools: tuple[str, ...] = ()
    # Memory recall
    memory_recall_enabled: bool = True
    memory_recall_k: int = 2
    memory_recall_min_similarity: float = 0.3
    # The embedding model memory search ranks by meaning with; "": the store's (PALIMPSEST_EMBED_MODEL).
    embed_model: str = ""
    # Compression: on or off here; the Compressor's settings a profile overrides are keys named
    # compression_<field> after CompressionSettings' optional fields (compressor.proto), kept here by
    # the field's name: (("threshold", 0.8), ...). Unset: the Compressor's PALIMPSEST_COMPRESSION_<FIELD>.
    compression_enabled: bool = True
    compression_overrides: tuple[tuple[str, Any], ...] = ()
    compression_prompt_file: str = ""
    summarizer_model: str = ""
    critical_tools: tuple[str, ...] = ()
    # Extra tools: "module:attribute" paths to Tool classes or instances users provide.
    custom_tools: tuple[str, ...] = ()
    # MCP servers whose tools this profile offers as mcp__<server>__<tool> (docs/profiles.md: MCP servers).
    mcp_servers: tuple[McpServerConfig, ...] = ()
    # How run_command runs: `"sandbox": {"enabled": true, "network": false, "wall_seconds": …}`.
    sandbox: SandboxPolicy = SandboxPolicy()
    # compression_prompt_file's text, read once when the profile is made: compression_settings() is
    # asked on every size check, on the event loop, and a file gone since must not fail those checks.
    compression_prompt: str = field(default="", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.compression_prompt_file:
            object.__setattr__(self, "compression_prompt", _read_prompt(self.compression_prompt_file, self.id))

    @property
    def tools_for_subagent(self) -> tuple[str, ...]:
        """tools.subagent, falling back to tools.agent when empty."""
        return self.subagent_tools or self.agent_tools

    def window(self, default: int) -> int:
        return self.context_window or default

    def on_model(self, model: str) -> "Profile":
        """This profile running ``model`` instead of its own ("": its own). A copy, not replace():
        replace() would read compression_prompt_file again, on the event loop."""
        if not model or model == self.model:
            return self
        moved = copy.copy(self)
        object.__setattr__(moved, "model", model)
        return moved

    @property
    def compression_keep_recent(self) -> int | None:
        """Turns the profile keeps verbatim (None: the Compressor's setting)."""
        return dict(self.compression_overrides).get("keep_recent")

    def compression_settings(self) -> compressor_pb2.CompressionSettings:
        return compressor_pb2.CompressionSettings(
            summarizer_model=self.summarizer_model,
            critical_tools=list(self.critical_tools),
            summary_prompt=self.compression_prompt,
            **dict(self.compression_overrides),
        )

    def to_proto(self, default_window: int) -> agent_pb2.Profile:
        return agent_pb2.Profile(
            id=self.id,
            name=self.name,
            model=self.model,
            context_window=self.window(default_window),
            max_iterations=self.max_iterations,
            think_enabled=self.think_enabled,
            agent_tools=list(self.agent_tools),
            subagent_tools=list(self.tools_for_subagent),
            compression=self.compression_settings(),
            description=self.description,
        )


def _read_prompt(path: str, profile_id: str) -> str:
    try:
        return Path(path).expanduser().read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise InvalidArgument(
            "compression_prompt_file", f"cannot read {path} (profile {profile_id!r}): {reason}"
        ) from None


_FIELDS = {f.name: f for f in fields(Profile) if f.init and f.name != "compression_overrides"}
_TUPLES = {name for name, f in _FIELDS.items() if str(f.type).startswith("tuple")}

# The Compressor's settings a profile may override: CompressionSettings' optional fields, each as
# the key compression_<field>, so a field added to the proto is a profile key with nothing else to do.
OVERRIDABLE = tuple(f.name for f in compressor_pb2.CompressionSettings.DESCRIPTOR.fields if f.has_presence)

# Keys profiles used before they were named after the proto's fields: read for one release.
RENAMED_KEYS = {
    "compression_max_tokens": "compression_summary_max_tokens",
    "compression_temperature": "compression_summary_temperature",
    "summarizer_context_window": "compression_summarizer_window",
    "memory_search_enabled": "compression_index_memory",
}
_warned_keys: set[str] = set()


def _renamed(data: dict[str, Any], profile_id: str) -> dict[str, Any]:
    """``data`` with old keys under their new names (the new key wins), each warned about once."""
    old = [key for key in RENAMED_KEYS if key in data]
    for key in old:
        value = data.pop(key)
        data.setdefault(RENAMED_KEYS[key], value)
    if set(old) - _warned_keys:
        _warned_keys.update(old)
        log.warning(
            "profile %r uses old key(s), read for this release only: %s",
            profile_id,
            ", ".join(f"{key} -> {RENAMED_KEYS[key]}" for key in old),
        )
    return data


def _overrides(data: dict[str, Any], base: Profile, profile_id: str) -> tuple[tuple[str, Any], ...]:
    """The compression_<field> keys of ``data`` (taken out of it) over ``base``'s, checked against
    the proto's types; a null value leaves the field to the Compressor."""
    merged = dict(base.compression_overrides)
    for name in OVERRIDABLE:
        if f"compression_{name}" in data:
            merged[name] = data.pop(f"compression_{name}")
    merged = {name: value for name, value in merged.items() if value is not None}
    try:
        compressor_pb2.CompressionSettings(**merged)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument("profiles", f"profile {profile_id!r}: compression_*: {exc}") from None
    return tuple(sorted(merged.items()))


def profile_from_dict(data: dict[str, Any], base: Profile | None = None) -> Profile:
    """A profile from JSON; `tools: {agent: [...], subagent: [...]}` is accepted as in the seed."""
    data = dict(data)
    tools = data.pop("tools", None)
    if isinstance(tools, dict):
        data.setdefault("agent_tools", tools.get("agent", list(DEFAULT_TOOLS)))
        data.setdefault("subagent_tools", tools.get("subagent", []))
    profile_id = str(data.get("id", (base or Profile()).id))
    data = _renamed(data, profile_id)
    data["compression_overrides"] = _overrides(data, base or Profile(), profile_id)
    unknown = set(data) - set(_FIELDS) - {"compression_overrides"}
    if unknown:
        raise InvalidArgument("profiles", f"unknown profile field(s): {', '.join(sorted(unknown))}")
    if "mcp_servers" in data:
        data["mcp_servers"] = parse_servers(data["mcp_servers"], profile_id)
    for name in _TUPLES & set(data):
        data[name] = tuple(data[name])
    if "sandbox" in data:
        try:
            data["sandbox"] = policy_from_config(data["sandbox"])
        except ValueError as exc:
            raise InvalidArgument("profiles", f"profile {data.get('id', (base or Profile()).id)!r}: {exc}") from None
    profile = replace(base or Profile(), **data)
    for attr, key in (
        ("agent_tools", "tools.agent"),
        ("subagent_tools", "tools.subagent"),
        ("critical_tools", "critical_tools"),
    ):
        check_tool_names(getattr(profile, attr), profile.mcp_servers, key, profile_id)
    return profile


class ProfilesFileError(ValueError):
    """The profiles file cannot be used; the message names the file (and the line, when it is JSON
    that does not parse) and what is wrong."""


@dataclass
class ProfileRegistry:
    profiles: dict[str, Profile] = field(default_factory=lambda: {"default": Profile()})
    default_id: str = "default"
    path: str = ""
    stamp: tuple[int, int] = (0, 0)  # the file's (mtime in ns, size) when it was read
    # Why the file's last edit was not taken (the profiles are then the last good ones); "" when it was.
    error: str = ""

    @classmethod
    def load(cls, path: str = "") -> "ProfileRegistry":
        """The file's profiles (each over the built-in default), or just the built-in default.
        ProfilesFileError when the file cannot be read or used."""
        if not path:
            return cls()
        try:
            return cls._load(path)
        except json.JSONDecodeError as exc:
            raise ProfilesFileError(f"{path} line {exc.lineno} column {exc.colno}: {exc.msg}") from exc
        except OSError as exc:
            raise ProfilesFileError(f"{path}: {exc.strerror or exc}") from None
        except (InvalidArgument, ValueError, TypeError, AttributeError) as exc:
            message = str(exc).removeprefix("profiles: ")
            raise ProfilesFileError(f"{path}: {message}" if path not in message else message) from None

    @classmethod
    def _load(cls, path: str) -> "ProfileRegistry":
        raw = json.loads(Path(path).expanduser().read_text())
        entries = raw.get("profiles", raw) if isinstance(raw, dict) else raw
        if isinstance(entries, dict):
            entries = [{"id": key, **value} for key, value in entries.items()]
        profiles = {}
        for entry in entries:
            profile = profile_from_dict(entry)
            profiles[profile.id] = profile
        if not profiles:
            profiles = {"default": Profile()}
        default_id = raw.get("default", next(iter(profiles))) if isinstance(raw, dict) else next(iter(profiles))
        if default_id not in profiles:
            raise InvalidArgument("profiles", f"default profile {default_id!r} is not defined in {path}")
        return cls(profiles, default_id, path, _stamp(path))

    def get(self, profile_id: str) -> Profile:
        if not profile_id:
            return self.profiles[self.default_id]
        try:
            return self.profiles[profile_id]
        except KeyError:
            raise NotFound(
                f"profile_id: profile {profile_id!r} is not configured (known: {', '.join(self.profiles)})"
            ) from None

    def for_session(self, profile_id: str) -> Profile:
        """A session's own profile, or the default when it is no longer configured (removed from the
        file, or never one of ours): the conversation stays usable; a profile asked for by name is
        still an error (``get``)."""
        if profile_id in self.profiles:
            return self.profiles[profile_id]
        if profile_id:
            log.warning("session profile %r is not configured: using the default %r", profile_id, self.default_id)
        return self.profiles[self.default_id]

    def resumed(self, profile_id: str, provider: str, model: str) -> Profile:
        """What a session continues on when no profile is asked for: its own profile (as
        ``for_session``) on the model it last ran on, so an edit of the profiles file never moves a
        conversation under way to another model. An empty model (a session that never ran, or ran
        before models were recorded): the profile's own; an empty provider is taken as ours."""
        if provider and provider != PROVIDER:
            raise FailedPrecondition(
                f"provider: the session last ran on {provider!r}, and this Agent runs {PROVIDER} models only; "
                "pass profile_id to continue it on one of the Agent's profiles"
            )
        return self.for_session(profile_id).on_model(model)

    def sandboxed_profiles(self, operator_mode: str) -> list[str]:
        """The profiles whose commands run sandboxed (they offer run_command, to the agent or its
        sub-agents, and the sandbox is on for them): those that fail when it cannot start."""
        return [
            p.id
            for p in self.profiles.values()
            if COMMAND_TOOL in (*p.agent_tools, *p.tools_for_subagent)
            and effective_policy(p.sandbox, pinned=False, operator_mode=operator_mode).sandboxed
        ]

    def changed(self) -> bool:
        """Whether the file differs from what was read (its mtime or size): one stat, cheap enough
        for every turn; the read itself (``reloaded``) belongs off the event loop."""
        if not self.path:
            return False
        try:
            return _stamp(self.path) != self.stamp
        except OSError:
            return False  # gone or unreadable for now: the profiles in use stay

    def reloaded(self) -> "ProfileRegistry | None":
        """The file's profiles again when it changed since it was read; None when unchanged. An edit
        that cannot be used keeps these profiles, with `error` saying what is wrong with it (once per
        edit: the next change is read again)."""
        if not self.changed():
            return None
        try:
            stamp = _stamp(self.path)
            return ProfileRegistry.load(self.path)
        except OSError as exc:
            return replace(self, error=f"{self.path}: {exc.strerror or exc}")
        except (ProfilesFileError, InvalidArgument) as exc:
            return replace(self, stamp=stamp, error=str(exc))


def _stamp(path: str) -> tuple[int, int]:
    stat = Path(path).expanduser().stat()
    return stat.st_mtime_ns, stat.st_size

"""What a command may do: the sandbox policy a profile configures, and the one rule that decides,
for a session, whether its commands run sandboxed."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from palimpsest.shared.settings import SANDBOX_MODES

# The sandbox modes an operator may set (PALIMPSEST_SANDBOX), re-exported by the sandbox package.
OPERATOR_MODES = SANDBOX_MODES

# Profile keys (`"sandbox": {…}`) and the policy attribute each sets.
_KEYS = {
    "enabled": "sandboxed",
    "network": "network",
    "wall_seconds": "wall_seconds",
    "cpu_seconds": "cpu_seconds",
    "memory_mb": "memory_mb",
    "processes": "processes",
    "output_kb": "output_kb",
    "file_size_mb": "file_size_mb",
    "open_files": "open_files",
}


@dataclass(frozen=True)
class SandboxPolicy:
    """Limits and isolation of one command. Sandboxed by default: running on the host is an
    operator's explicit choice (``"enabled": false``, or ``PALIMPSEST_SANDBOX=off``)."""

    sandboxed: bool = True
    network: bool = False
    wall_seconds: float = 120.0
    cpu_seconds: int = 60
    # Address space of each process (RLIMIT_AS): virtual memory, so a little above what is touched.
    memory_mb: int = 2048
    # Processes and threads of the command together (RLIMIT_NPROC in the sandbox's own user namespace).
    processes: int = 256
    # stdout and stderr together; past this the command is killed.
    output_kb: int = 10 * 1024
    file_size_mb: int = 1024
    open_files: int = 1024
    # What the result keeps of each stream: its first and last half of this.
    keep_bytes: int = 8 * 1024

    @property
    def output_limit_bytes(self) -> int:
        return self.output_kb * 1024


def policy_from_config(raw: Any, where: str = "sandbox") -> SandboxPolicy:
    """A profile's ``"sandbox": {…}`` as a policy; ValueError naming the key (``sandbox.memory_mb``)
    and what it must be when a value cannot be used."""
    if not isinstance(raw, dict):
        raise ValueError(
            f'{where} must be an object such as {{"enabled": true, "network": false}}, got {type(raw).__name__}'
        )
    unknown = sorted(set(raw) - set(_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(_KEYS)})")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        attr = _KEYS[key]
        if attr in ("sandboxed", "network"):
            if not isinstance(value, bool):
                raise ValueError(f"{where}.{key} must be true or false, got {value!r}")
        elif attr == "wall_seconds":
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not (number and math.isfinite(value) and value > 0):
                raise ValueError(f"{where}.{key} must be a number of seconds above 0, got {value!r}")
            value = float(value)
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}.{key} must be a whole number of at least 1, got {value!r}")
        values[attr] = value
    return SandboxPolicy(**values)


def effective_policy(profile_policy: SandboxPolicy, *, pinned: bool, operator_mode: str) -> SandboxPolicy:
    """Whether a session's commands run sandboxed: the operator's ``off`` wins over everything (it is
    what lifts a pin); ``required`` and a pinned session are sandboxed; otherwise the profile decides."""
    if operator_mode not in OPERATOR_MODES:
        raise ValueError(f"operator_mode must be one of {', '.join(OPERATOR_MODES)}, got {operator_mode!r}")
    if operator_mode == "off":
        sandboxed = False
    elif operator_mode == "required" or pinned:
        sandboxed = True
    else:
        sandboxed = profile_policy.sandboxed
    return profile_policy if sandboxed == profile_policy.sandboxed else replace(profile_policy, sandboxed=sandboxed)

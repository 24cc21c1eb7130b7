"""Configuration from environment variables, each with a working default, each declared once.

Every field of ``Settings`` is one ``setting(...)`` declaration (declare.py): the variable, its unit,
its default, its validation and the line docs/settings.md shows, which is generated from them
(``python -m palimpsest.shared.settings --docs``; a test fails when the committed file differs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from palimpsest.shared.settings.agent import AgentSettings
from palimpsest.shared.settings.declare import complete, read
from palimpsest.shared.settings.model import ModelSettings
from palimpsest.shared.settings.paths import SANDBOX_MODES, default_data_dir, normalize_ollama_host
from palimpsest.shared.settings.services import ServiceSettings
from palimpsest.shared.settings.store import StoreSettings

__all__ = ["GROUPS", "SANDBOX_MODES", "Settings", "default_data_dir", "normalize_ollama_host"]

# The groups in the order the docs list them (a dataclass puts the last base's fields first).
GROUPS: tuple[type, ...] = (ServiceSettings, StoreSettings, AgentSettings, ModelSettings)


@dataclass(frozen=True)
class Settings(ModelSettings, AgentSettings, StoreSettings, ServiceSettings):
    def __post_init__(self) -> None:
        complete(self)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        """From the environment (``os.environ`` unless given); a value that cannot be used stops
        the service with one line naming the variable, what it must be and what it got."""
        return read(cls, environ)

    @property
    def read_budget_bytes(self) -> int:
        """What one response may carry in messages: half the gRPC limit leaves room for the
        fields around them and for encoding overhead."""
        return self.max_message_bytes // 2


# The name tests and older callers import.
_normalize_ollama_host = normalize_ollama_host

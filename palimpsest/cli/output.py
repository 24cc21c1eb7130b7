"""Where command output goes: a rich console for people, one JSON object per line for scripts."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from rich.console import Console


def to_dict(message: Message) -> dict[str, Any]:
    """The proto3 JSON mapping, with field names as the .proto spells them (what grpcurl users read).

    Zero values are printed too, so a script can read `pinned` or `deleted` without a default.
    """
    return MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


@dataclass
class Output:
    json: bool = False
    console: Console = field(default_factory=lambda: Console(highlight=False))
    errors: Console = field(default_factory=lambda: Console(stderr=True, highlight=False))

    def emit(self, payload: Message | dict[str, Any]) -> None:
        """One JSON object on its own line, flushed so a reading script sees it at once."""
        data = to_dict(payload) if isinstance(payload, Message) else payload
        sys.stdout.write(json.dumps(data, ensure_ascii=False) + "\n")
        sys.stdout.flush()

    def note(self, text: str) -> None:
        """A remark for people (progress, hints): stderr when stdout carries JSON."""
        (self.errors if self.json else self.console).print(text, style="dim", markup=False, soft_wrap=True)

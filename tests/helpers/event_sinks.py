"""An event sink that records what a tool or turn emits, for tests that call tools directly."""

from __future__ import annotations

from palimpsest.agent.events import EventSink


def recording_sink(session_id: str) -> EventSink:
    """A sink that keeps what it publishes in its ``published`` list (a turn's goes to its log)."""
    published: list = []
    sink = EventSink(session_id, publish=published.append)
    sink.published = published
    return sink


def drained(sink: EventSink) -> list:
    return sink.published

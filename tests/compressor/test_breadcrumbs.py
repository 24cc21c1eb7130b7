"""Breadcrumbs of dropped history and its verbatim chunks."""

from __future__ import annotations

import hashlib
import re
from datetime import datetime, timezone

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import given, settings
from hypothesis import strategies as st

from palimpsest.compressor.breadcrumbs import (
    _PATTERNS,
    CHUNK_CHARS,
    ENTITY_CAP,
    chunk_messages,
    extract_entities,
    merge_breadcrumbs,
)
from palimpsest.compressor.planner import has_reference
from palimpsest.compressor.prefilter import may_match
from palimpsest.v1.common_pb2 import Message, ToolCall


@pytest.mark.parametrize(
    ("text", "entity"),
    [
        ("edited /srv/app/main.py today", "/srv/app/main.py"),
        ("run ./build.sh first", "./build.sh"),
        ("see ~/notes/todo.md", "~/notes/todo.md"),
        ("open C:\\Users\\ann\\report.xlsx, then", "C:\\Users\\ann\\report.xlsx"),
        ("changed palimpsest/compressor/planner.py too", "palimpsest/compressor/planner.py"),
        ("docs at https://example.com/a/b?x=1.", "https://example.com/a/b?x=1"),
        ("the ContextCompressor class", "ContextCompressor"),
        ("call estimateTokens now", "estimateTokens"),
        ("set ollama_num_ctx higher", "ollama_num_ctx"),
        ("in navi.core.compressor module", "navi.core.compressor"),
        ("fixes PAL-123 finally", "PAL-123"),
        ("closes #482", "#482"),
        ("reverted 3f9a2c1 yesterday", "3f9a2c1"),
        ("$ git push origin main", "git push origin main"),
        ("then `make protos` again", "make protos"),
        ("try `pip install -e .`", "pip install -e ."),
        ("use `npm ci`", "npm ci"),
        ("ran `docker compose up -d`", "docker compose up -d"),
        ("ran `kubectl get pods -A`", "kubectl get pods -A"),
        ("ran `python -m palimpsest.agent`", "python -m palimpsest.agent"),
        ("it costs $12.50 a month", "$12.50"),
        ("only €3 more", "€3"),
        ("needs 12 GB of RAM", "12 GB"),
        ("at 30% load", "30%"),
        ("latency 1,000 ms p99", "1,000 ms"),
    ],
)
def test_an_entity_is_extracted(text: str, entity: str) -> None:
    assert entity in extract_entities(text)


@pytest.mark.parametrize("text", ["and/or", "e.g. this", "a plain sentence.", "deadbeefed words", "1234567"])
def test_ordinary_prose_yields_nothing(text: str) -> None:
    assert extract_entities(text) == []


def test_a_url_is_not_also_read_as_a_path_or_dotted_name() -> None:
    assert extract_entities("see https://docs.python.org/3/library/re.html") == [
        "https://docs.python.org/3/library/re.html"
    ]


def test_a_command_is_one_entity_not_its_parts() -> None:
    assert extract_entities("$ python -m pytest tests/test_x.py") == ["python -m pytest tests/test_x.py"]


def test_entities_come_in_order_of_first_appearance_without_duplicates() -> None:
    text = "PAL-1 then /a/b.py then PAL-1 again and ollama_num_ctx and /a/b.py"
    assert extract_entities(text) == ["PAL-1", "/a/b.py", "ollama_num_ctx"]


def test_entities_are_capped() -> None:
    text = " ".join(f"TICKET-{i}" for i in range(100))
    found = extract_entities(text)
    assert len(found) == ENTITY_CAP
    assert found[0] == "TICKET-0" and found[-1] == f"TICKET-{ENTITY_CAP - 1}"


def test_merge_keeps_summary_keys_first_and_dedupes_ignoring_case() -> None:
    merged = merge_breadcrumbs(["Deploy Key", "/etc/app.conf"], ["/ETC/APP.CONF", "PAL-9", "deploy key"])
    assert merged == ["Deploy Key", "/etc/app.conf", "PAL-9"]


def test_merge_is_capped_at_60_and_drops_blanks() -> None:
    merged = merge_breadcrumbs(["", "  "] + [f"k{i}" for i in range(50)], [f"e{i}" for i in range(50)])
    assert len(merged) == 60
    assert merged[:50] == [f"k{i}" for i in range(50)]


# -- chunks -------------------------------------------------------------------------------


def stamp(second: int) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(datetime(2025, 1, 1, 0, 0, second, tzinfo=timezone.utc))
    return ts


def msg(role: str, content: str, seq: int, **kw: object) -> Message:
    return Message(role=role, content=content, seq=seq, created_at=stamp(seq), **kw)  # type: ignore[arg-type]


def test_one_chunk_per_turn_with_its_range_times_and_hash() -> None:
    messages = [
        msg("user", "list files", 1),
        msg("assistant", "", 2, tool_calls=[ToolCall(name="ls", arguments_json='{"path": "/srv"}')]),
        msg("tool", "a.py b.py", 3, name="ls"),
        msg("user", "thanks", 4),
        msg("assistant", "welcome", 5),
    ]
    chunks = chunk_messages(messages, ["/srv"])
    assert [(c.first_seq, c.last_seq) for c in chunks] == [(1, 3), (4, 5)]
    first = chunks[0]
    assert "user: list files" in first.content
    assert 'ls: {"path": "/srv"}' in first.content
    assert "tool (ls): a.py b.py" in first.content
    assert first.content_hash == hashlib.sha256(first.content.encode()).hexdigest()
    assert first.first_at is not None and first.last_at is not None
    assert first.first_at.ToDatetime(tzinfo=timezone.utc) == datetime(2025, 1, 1, 0, 0, 1, tzinfo=timezone.utc)
    assert first.last_at.ToDatetime(tzinfo=timezone.utc) == datetime(2025, 1, 1, 0, 0, 3, tzinfo=timezone.utc)
    assert first.breadcrumbs == ["/srv"]


def test_a_turn_past_4000_chars_is_split_without_losing_text() -> None:
    messages = [msg("user", "go", 1)] + [msg("assistant", f"{i}:" + "x" * 1_500, i + 2) for i in range(5)]
    chunks = chunk_messages(messages, [])
    assert len(chunks) > 1
    assert all(len(c.content) <= CHUNK_CHARS for c in chunks)
    joined = "".join(c.content for c in chunks)
    for m in messages:
        assert m.content in joined
    assert [c.first_seq for c in chunks] == sorted(c.first_seq for c in chunks)


def test_a_single_message_longer_than_a_chunk_is_cut_into_consecutive_pieces() -> None:
    content = "".join(chr(ord("a") + i % 26) for i in range(10_000))
    chunks = chunk_messages([msg("tool", content, 7, name="cat")], [])
    assert len(chunks) == 3
    assert "".join(c.content for c in chunks) == "tool (cat): " + content
    assert all((c.first_seq, c.last_seq) == (7, 7) for c in chunks)


def test_summaries_are_not_indexed_as_raw_history() -> None:
    chunks = chunk_messages([msg("user", "- old summary", 1, is_summary=True), msg("user", "hi", 2)], [])
    assert len(chunks) == 1 and "old summary" not in chunks[0].content


def test_the_same_text_gives_the_same_hash() -> None:
    a = chunk_messages([msg("user", "same", 1)], [])
    b = chunk_messages([msg("user", "same", 1)], ["other"])
    assert a[0].content_hash == b[0].content_hash


def test_claimed_spans_merge_and_answer_overlaps_like_a_scan():
    """The binary-search spans agree with checking every claimed span, on random claims."""
    import random

    from palimpsest.compressor.breadcrumbs import _Spans

    rng = random.Random(5)
    spans, claimed = _Spans(), []
    for _ in range(2000):
        start = rng.randrange(0, 5000)
        end = start + rng.randrange(1, 40)
        scan = any(start < e and s < end for s, e in claimed)
        assert spans.overlaps(start, end) == scan
        if not scan or rng.random() < 0.3:  # claims may overlap (a command claims its backticks)
            spans.add(start, end)
            claimed.append((start, end))


def test_entities_of_a_long_text_are_the_first_ones_the_whole_text_has() -> None:
    """Read a piece at a time and stopped at the cap: the same entities, in the same order."""
    import random

    from palimpsest.compressor import breadcrumbs

    rng = random.Random(5)
    lines = [
        f"{rng.choice(['see', 'ran', 'paid'])} /srv/app{rng.randint(1, 400)}.py "
        f"`git log -n {rng.randint(1, 9)}` ABC-{rng.randint(1, 999)} $1,{rng.randint(100, 999)} "
        f"{rng.getrandbits(40):010x} parseConfig_{rng.randint(1, 50)}"
        for _ in range(3_000)
    ]
    text = "\n".join(lines)
    whole = breadcrumbs._entities_in_order(text)
    expected = list(dict.fromkeys(whole))[: breadcrumbs.ENTITY_CAP]
    assert breadcrumbs.extract_entities(text) == expected
    assert breadcrumbs.extract_entities(text, cap=10_000) == list(dict.fromkeys(whole))


# What each pattern needs of a text before it is run (a literal, or a short pattern the regex
# engine skips through fast) must be implied by any match: otherwise a prefilter drops entities.
_ENTITY_ALPHABET = "aAbZz09_-./\\:~#$%€ `\n\t\u00e9\u4e2dfx\u0663\uff11"  # with two digits not ASCII
_ENTITY_WORDS = ["git ", "https://", "C:\\", "JIRA-12", "#42", "$ make", "12 ms", "3.5%", "deadbeef1", "a.b", "xY"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.text(_ENTITY_ALPHABET, max_size=12), st.sampled_from(_ENTITY_WORDS)), max_size=20))
def test_no_pattern_matches_a_text_its_prefilter_rules_out(parts: list[str]) -> None:
    text = "".join(parts)
    for kind, pattern, needs in _PATTERNS:
        if pattern.search(text):
            assert may_match(needs, text), (kind, pattern.pattern, text)


def test_prose_with_no_entity_is_not_scanned_by_every_pattern() -> None:
    """Ordinary sentences rule out most patterns before any is run (what made the scan cheap)."""
    prose = "Can you help me figure out why the data pipeline hangs after I restart the container? " * 40
    assert extract_entities(prose) == []
    assert [kind for kind, _, needs in _PATTERNS if may_match(needs, prose)] == []


# turn importance's references as one pattern, before they were split to run behind prefilters
_REFERENCE_WHOLE = re.compile(
    r"(?:^|[\s(\"'`])(?:~|\.{1,2})?/[\w.\-]+/[\w.\-/]*"
    r"|\b[\w.\-]+/[\w.\-/]*\.\w{1,8}\b"
    r"|\b[A-Z][A-Z0-9]+-\d+\b"
    r"|(?<![\w&])#\d+\b"
    r"|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,64}\b"
)
_REFERENCE_WORDS = ["src/app.py", " /etc/x", "~/a/b", "JIRA-7", "#12", "&#12", "deadbee7", "a-1", "x.y/z"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.text(_ENTITY_ALPHABET, max_size=12), st.sampled_from(_REFERENCE_WORDS)), max_size=20))
def test_a_turns_references_are_found_where_the_whole_pattern_finds_them(parts: list[str]) -> None:
    text = "".join(parts)
    assert has_reference(text) == (_REFERENCE_WHOLE.search(text) is not None), text

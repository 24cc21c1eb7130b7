from dataclasses import FrozenInstanceError
from datetime import datetime, timedelta, timezone

import pytest

from palimpsest.shared.errors import InvalidArgument
from palimpsest.shared.external_refs import (
    ExternalRef,
    merge_refs,
    parse_ref_flag,
    ref_to_proto,
    refs_from_proto,
    validate_ref,
)
from palimpsest.v1 import common_pb2

NOW = datetime(2026, 5, 18, 12, 0, tzinfo=timezone.utc)
URI = "https://ci.example.test/runs/4821"


def ref(**overrides) -> ExternalRef:
    fields = {"kind": "ci-run", "uri": URI, "created_by": "ci-orchestrator"}
    fields.update(overrides)
    return ExternalRef(**fields)


def field_of(excinfo) -> str:
    return excinfo.value.field


# --- validate_ref ----------------------------------------------------------------------


def test_valid_ref_passes_and_keeps_fields():
    out = validate_ref(ref(read_only=True), 0, now=NOW)
    assert out == ExternalRef("ci-run", URI, "ci-orchestrator", True, NOW)


def test_ref_is_frozen():
    with pytest.raises(FrozenInstanceError):
        ref().kind = "x"  # type: ignore[misc]


def test_created_at_is_stamped_with_utc_now_when_absent():
    before = datetime.now(timezone.utc)
    out = validate_ref(ref())
    after = datetime.now(timezone.utc)
    assert out.created_at is not None
    assert out.created_at.tzinfo is not None
    assert before <= out.created_at <= after


def test_given_created_at_is_kept_and_normalised_to_utc():
    plus2 = datetime(2026, 1, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    assert validate_ref(ref(created_at=plus2), now=NOW).created_at == datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
    naive = datetime(2026, 1, 1, 9, 30)
    assert validate_ref(ref(created_at=naive), now=NOW).created_at == naive.replace(tzinfo=timezone.utc)


@pytest.mark.parametrize("kind", ["a", "ci-run", "object_store", "k8s-job-2", "x" * 64, "-", "_"])
def test_kind_accepted(kind):
    assert validate_ref(ref(kind=kind)).kind == kind


@pytest.mark.parametrize(
    "kind", ["", "x" * 65, "CI-run", "Dashboard", "ci run", "ci.run", "ci/run", "ci:run", "ün", "ci\n"]
)
def test_kind_rejected(kind):
    with pytest.raises(InvalidArgument) as excinfo:
        validate_ref(ref(kind=kind), 2)
    assert field_of(excinfo) == "external_refs[2].kind"


def test_error_message_names_the_field():
    with pytest.raises(InvalidArgument, match=r"^external_refs\[5\]\.kind: "):
        validate_ref(ref(kind="X"), 5)


def test_uri_length_boundary():
    prefix = "https://x.test/"
    at_limit = prefix + "a" * (2048 - len(prefix))
    assert validate_ref(ref(uri=at_limit)).uri == at_limit
    with pytest.raises(InvalidArgument) as excinfo:
        validate_ref(ref(uri=at_limit + "a"), 1)
    assert field_of(excinfo) == "external_refs[1].uri"


def test_empty_uri_rejected():
    with pytest.raises(InvalidArgument) as excinfo:
        validate_ref(ref(uri=""))
    assert field_of(excinfo) == "external_refs[0].uri"


@pytest.mark.parametrize("char", ["\x00", "\t", "\n", "\r", "\x1b", "\x1f", "\x7f", "\x85"])
def test_uri_control_characters_rejected(char):
    with pytest.raises(InvalidArgument) as excinfo:
        validate_ref(ref(uri=f"https://x.test/a{char}b"), 3)
    assert field_of(excinfo) == "external_refs[3].uri"


def test_uri_with_unicode_and_spaces_is_stored_verbatim():
    uri = "https://x.test/dashboards/Überblick heute?q=a,b"
    assert validate_ref(ref(uri=uri)).uri == uri


def test_uri_is_never_resolved_only_stored(monkeypatch):
    # Any attempt at a network lookup would blow up here.
    import socket

    def no_network(*args, **kwargs):
        raise AssertionError("external refs must never be resolved")

    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    assert validate_ref(ref(uri="https://unresolvable.invalid/x")).uri == "https://unresolvable.invalid/x"


def test_validation_leaves_the_uri_as_sent_for_the_store_to_redact():
    uri = "https://bot:pw@x.test/run?token=abc&id=7"
    assert validate_ref(ref(uri=uri)).uri == uri


def test_created_by_boundaries():
    assert validate_ref(ref(created_by="a")).created_by == "a"
    assert validate_ref(ref(created_by="b" * 128)).created_by == "b" * 128
    for bad in ("", "b" * 129, "ci\nforged"):
        with pytest.raises(InvalidArgument) as excinfo:
            validate_ref(ref(created_by=bad), 4)
        assert field_of(excinfo) == "external_refs[4].created_by"


def test_wrong_types_rejected():
    with pytest.raises(InvalidArgument) as excinfo:
        validate_ref(ref(kind=None))  # type: ignore[arg-type]
    assert field_of(excinfo) == "external_refs[0].kind"
    with pytest.raises(InvalidArgument) as excinfo:
        validate_ref(ref(read_only="yes"))  # type: ignore[arg-type]
    assert field_of(excinfo) == "external_refs[0].read_only"


# --- merge_refs ------------------------------------------------------------------------


def test_merge_dedupes_and_keeps_existing_order_first_wins():
    a = ref(kind="a", created_at=NOW)
    b = ref(kind="b", created_at=NOW)
    a_again = ref(kind="a", read_only=True, created_at=NOW + timedelta(days=1))
    c = ref(kind="c")
    assert merge_refs([a, b], [a_again, c]) == [a, b, c]


def test_merge_identity_is_kind_uri_and_created_by():
    base = ref()
    other_by = ref(created_by="someone-else")
    other_uri = ref(uri=URI + "/2")
    other_kind = ref(kind="dashboard")
    merged = merge_refs([base], [other_by, other_uri, other_kind, base])
    assert merged == [base, other_by, other_uri, other_kind]


def test_merge_never_removes_and_dedupes_within_new():
    a, b = ref(kind="a"), ref(kind="b")
    assert merge_refs([a, b], []) == [a, b]
    assert merge_refs([], [b, b, a]) == [b, a]
    assert merge_refs([], []) == []


def test_merge_does_not_mutate_inputs():
    existing, new = [ref(kind="a")], [ref(kind="b")]
    merge_refs(existing, new)
    assert existing == [ref(kind="a")] and new == [ref(kind="b")]


# --- parse_ref_flag --------------------------------------------------------------------


def test_long_form():
    out = parse_ref_flag(
        "kind=ci-run,uri=https://ci.example.test/runs/4821,created_by=ci-orchestrator,read_only=true",
        now=NOW,
    )
    assert out == ExternalRef("ci-run", URI, "ci-orchestrator", True, NOW)


def test_long_form_defaults_and_any_order():
    out = parse_ref_flag("uri=https://x.test/,kind=dash", now=NOW)
    assert out == ExternalRef("dash", "https://x.test/", "cli", False, NOW)


def test_long_form_uri_may_contain_commas():
    out = parse_ref_flag("kind=k,uri=https://x.test/a,b;c=1?ids=1,2,created_by=me")
    assert out.uri == "https://x.test/a,b;c=1?ids=1,2"
    assert out.created_by == "me"


@pytest.mark.parametrize(
    "value, expected", [("TRUE", True), ("1", True), ("yes", True), ("false", False), ("0", False)]
)
def test_long_form_read_only_values(value, expected):
    assert parse_ref_flag(f"kind=k,uri=u,read_only={value}").read_only is expected


def test_shorthand():
    out = parse_ref_flag("ci-run=https://ci.example.test/runs/4821", now=NOW)
    assert out == ExternalRef("ci-run", URI, "cli", False, NOW)


def test_shorthand_uri_keeps_equals_and_commas():
    out = parse_ref_flag("dashboard=https://grafana.example.test/d/abc?from=now-1h&vars=a,b")
    assert out.kind == "dashboard"
    assert out.uri == "https://grafana.example.test/d/abc?from=now-1h&vars=a,b"


def test_shorthand_kind_literally_named_kind():
    out = parse_ref_flag("kind=https://x.test/")
    assert (out.kind, out.uri) == ("kind", "https://x.test/")


# --- the wire form -------------------------------------------------------------------------


def test_refs_round_trip_through_the_proto_and_errors_name_the_index():
    sent = [
        ref_to_proto(validate_ref(ref(read_only=True), now=NOW)),
        common_pb2.ExternalRef(kind="dash", uri="u", created_by="me"),
    ]
    back = refs_from_proto(sent, now=NOW)
    assert back == [
        ExternalRef("ci-run", URI, "ci-orchestrator", True, NOW),
        ExternalRef("dash", "u", "me", False, NOW),
    ]
    with pytest.raises(InvalidArgument) as excinfo:
        refs_from_proto([*sent, common_pb2.ExternalRef(kind="ok", uri="u")])
    assert field_of(excinfo) == "external_refs[2].created_by"


def test_an_epoch_created_at_on_the_wire_is_taken_as_unset():
    wire = common_pb2.ExternalRef(kind="k", uri="u", created_by="me")
    wire.created_at.seconds = 0
    assert refs_from_proto([wire], now=NOW)[0].created_at == NOW


@pytest.mark.parametrize(
    "text",
    [
        "",
        "no-equals-sign",
        "=https://x.test/",
        "ci-run=",
        "CI=https://x.test/",
        "kind=k,uri=",
        "kind=k,uri=u,read_only=maybe",
        "kind=k,uri=u,kind=j",
        "uri=https://x.test/",  # long form without kind
        "kind=k,foo=bar,uri=u",  # unknown key ends up inside kind
        "kind=k,uri=https://x.test/\n",
        "kind=k,uri=u,created_by=",
        "k=" + "u" * 2049,
    ],
)
def test_malformed_flag_names_the_flag(text):
    with pytest.raises(InvalidArgument) as excinfo:
        parse_ref_flag(text)
    assert field_of(excinfo) == "--ref"
    assert str(excinfo.value).startswith("--ref: ")

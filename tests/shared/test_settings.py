"""Settings are declared once: names, units, old names, errors, and the docs generated from them."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from palimpsest.agent.profiles import OVERRIDABLE, Profile, profile_from_dict
from palimpsest.shared.settings import GROUPS, Settings, declare
from palimpsest.shared.settings import __main__ as settings_docs
from palimpsest.shared.settings.declare import PREFIX, UNITS, SettingError, declarations

# The ecosystem's own names, kept as the ecosystem spells them.
ECOSYSTEM = {"DATABASE_URL", "OLLAMA_HOST", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"}
ENVS = [env for group in GROUPS for _, env, _ in declarations(group)]


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test is a process of its own as far as the once-per-process warning goes."""
    monkeypatch.setattr(declare, "_warned", set())


def test_the_committed_docs_are_what_the_declarations_generate() -> None:
    current = settings_docs.DOCS.read_text()
    assert current == declare.spliced(current, settings_docs.generated()), (
        "docs/settings.md is stale: run python -m palimpsest.shared.settings --docs"
    )


def test_every_field_of_settings_is_declared_once() -> None:
    names = [env.name for env in ENVS]
    assert len(names) == len(set(names))
    assert len(declarations(Settings)) == len(Settings.__dataclass_fields__)


def test_every_name_has_the_one_prefix_and_says_its_unit() -> None:
    for env in ENVS:
        for name in (env.name, *env.also):
            assert name.startswith(PREFIX) or name in ECOSYSTEM, name
        if env.unit:
            assert env.name.endswith(UNITS[env.unit]), f"{env.name} has the unit {env.unit}"
        else:
            assert not env.name.endswith(tuple(UNITS.values())), f"{env.name} says a unit it does not declare"


def test_a_compression_setting_has_one_name_from_profile_to_proto() -> None:
    """Each optional field of CompressionSettings is the profile key compression_<field>, the
    Settings field compression_<field> and the variable PALIMPSEST_COMPRESSION_<FIELD>."""
    by_field = {attr: env for attr, env, _ in declarations(Settings)}
    for name in OVERRIDABLE:
        assert f"compression_{name}" in by_field, (
            f"CompressionSettings.{name} has no default: declare compression_{name} "
            f"(PALIMPSEST_COMPRESSION_{name.upper()}) in palimpsest/shared/settings/model.py"
        )
        assert by_field[f"compression_{name}"].name == f"PALIMPSEST_COMPRESSION_{name.upper()}"
        value = getattr(Settings(), f"compression_{name}")
        profile = profile_from_dict({f"compression_{name}": value})
        assert getattr(profile.compression_settings(), name) == value


def test_an_old_name_is_read_with_one_warning_naming_the_new(caplog: pytest.LogCaptureFixture) -> None:
    environ = {"CONTEXT_KEEP_RECENT": "7", "PALIMPSEST_RPC_TIMEOUT_S": "3"}
    with caplog.at_level(logging.WARNING, "palimpsest.settings"):
        settings = Settings.from_env(environ)
        Settings.from_env(environ)
    assert settings.compression_keep_recent == 7 and settings.rpc_timeout_s == 3.0
    [warning] = [r.getMessage() for r in caplog.records if r.name == "palimpsest.settings"]
    assert "CONTEXT_KEEP_RECENT -> PALIMPSEST_COMPRESSION_KEEP_RECENT" in warning
    assert "PALIMPSEST_RPC_TIMEOUT_S -> PALIMPSEST_RPC_TIMEOUT_SECONDS" in warning


def test_the_new_name_wins_when_both_are_set(caplog: pytest.LogCaptureFixture) -> None:
    environ = {"OLLAMA_NUM_CTX": "4096", "PALIMPSEST_CONTEXT_WINDOW": "16384"}
    with caplog.at_level(logging.WARNING, "palimpsest.settings"):
        assert Settings.from_env(environ).ollama_num_ctx == 16_384
    assert "OLLAMA_NUM_CTX -> PALIMPSEST_CONTEXT_WINDOW" in caplog.text


def test_new_names_alone_warn_of_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "palimpsest.settings"):
        Settings.from_env({"PALIMPSEST_COMPRESSION_KEEP_RECENT": "5", "OLLAMA_HOST": "gpu:11434"})
    assert caplog.records == []


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"PALIMPSEST_STREAM_KEEP_MB": "0"}, "PALIMPSEST_STREAM_KEEP_MB must be a number of at least 1, got '0'"),
        ({"PALIMPSEST_RPC_TIMEOUT_SECONDS": "soon"}, "PALIMPSEST_RPC_TIMEOUT_SECONDS must be a number, got 'soon'"),
        ({"PALIMPSEST_RPC_TIMEOUT_SECONDS": "inf"}, "must be a finite number, got 'inf'"),
        ({"CONTEXT_KEEP_RECENT": "4.5"}, "CONTEXT_KEEP_RECENT must be a whole number, got '4.5'"),
        ({"PALIMPSEST_TURN_CLAIMS": "maybe"}, "PALIMPSEST_TURN_CLAIMS must be true or false"),
        ({"PALIMPSEST_SANDBOX": "sometimes"}, "PALIMPSEST_SANDBOX must be one of auto, off, required, got 'sometimes'"),
        ({"PALIMPSEST_SHARE_FILE_ROOTS": "relative/dir"}, "PALIMPSEST_SHARE_FILE_ROOTS must be absolute folders"),
    ],
)
def test_a_value_that_cannot_be_used_names_the_variable_what_it_must_be_and_what_it_got(
    environ: dict[str, str], message: str
) -> None:
    with pytest.raises(SettingError) as refused:
        Settings.from_env(environ)
    assert message in str(refused.value)


def test_values_with_a_unit_are_read_in_it_and_defaults_follow_the_settings_they_come_from() -> None:
    settings = Settings.from_env(
        {
            "PALIMPSEST_STREAM_KEEP_MB": "2",
            "PALIMPSEST_DATA_DIR": "/srv/pal",
            "PALIMPSEST_COMPRESSOR_ADDR": "c1:50052,c2:50052",
            "PALIMPSEST_METRICS_PORT": " ",
            "PALIMPSEST_SANDBOX": "Required",
            "OLLAMA_HOST": "0.0.0.0",
        }
    )
    assert settings.stream_keep_bytes == 2 * 1024 * 1024
    assert settings.files_root == Path("/srv/pal/session_files")
    assert settings.share_file_roots == (Path("/srv/pal/workspace"),)
    assert settings.compressor_listen == "c1:50052" and settings.metrics_port is None
    assert settings.sandbox_mode == "required" and settings.ollama_host == "http://127.0.0.1:11434"
    assert Settings(compressor_addr="a:1,b:2").compressor_listen == "a:1"


def test_an_empty_value_is_unset_unless_empty_turns_the_feature_off() -> None:
    assert Settings.from_env({"PALIMPSEST_EMBED_MODEL": ""}).embed_model == ""  # lexical search only
    assert Settings.from_env({}).embed_model == Settings().embed_model != ""
    assert Settings.from_env({"PALIMPSEST_GRACE_SECONDS": ""}).grace_seconds == Settings().grace_seconds


def test_a_profile_s_old_compression_keys_are_read_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    old = {
        "compression_max_tokens": 4000,
        "compression_temperature": 0.2,
        "summarizer_context_window": 16_384,
        "memory_search_enabled": False,
    }
    with caplog.at_level(logging.WARNING, "palimpsest.agent"):
        sent = profile_from_dict({"id": "old", **old}).compression_settings()
    assert (sent.summary_max_tokens, sent.summary_temperature) == (4000, pytest.approx(0.2))
    assert sent.summarizer_window == 16_384 and sent.HasField("index_memory") and not sent.index_memory
    assert "compression_max_tokens -> compression_summary_max_tokens" in caplog.text
    both = profile_from_dict({"compression_max_tokens": 1, "compression_summary_max_tokens": 2})
    assert both.compression_settings().summary_max_tokens == 2


def test_a_profile_leaves_what_it_does_not_name_to_the_compressor() -> None:
    sent = profile_from_dict({"compression_threshold": None, "compression_keep_recent": 9}).compression_settings()
    assert not sent.HasField("threshold") and sent.keep_recent == 9
    assert Profile().compression_settings().ListFields() == []


def test_a_profile_value_of_the_wrong_type_names_the_key() -> None:
    from palimpsest.shared.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="compression_"):
        profile_from_dict({"id": "bad", "compression_keep_recent": "many"})


CHECKOUT = Path(__file__).resolve().parents[2]
OLD_NAMES = {old for env in ENVS for old in env.old}


def _texts(*patterns: str) -> dict[Path, str]:
    return {path: path.read_text() for pattern in patterns for path in sorted(CHECKOUT.glob(pattern))}


def test_the_manifests_and_the_image_set_only_settings_that_are_declared() -> None:
    declared = {name for env in ENVS for name in (env.name, *env.also)}
    for path, text in _texts("deploy/**/*.yaml", "Dockerfile").items():
        set_here = set(re.findall(r"\b(PALIMPSEST_[A-Z0-9_]+)=", text)) | set(
            re.findall(r"name: (PALIMPSEST_[A-Z0-9_]+)\b", text)
        )
        assert set_here <= declared, f"{path.relative_to(CHECKOUT)} sets {sorted(set_here - declared)}"


def test_no_manifest_or_doc_names_a_setting_by_its_old_name() -> None:
    for path, text in _texts("deploy/**/*.yaml", "Dockerfile", "README.md", "docs/*.md", "clients/node/*.js").items():
        if path.name == "settings.md":
            text = text.split("### Old names")[0]  # the table of old names names them
        named = set(re.findall(r"\b[A-Z][A-Z0-9_]+\b", text)) & OLD_NAMES
        assert not named, f"{path.relative_to(CHECKOUT)} names {sorted(named)}"

"""Where the summarizer's own window comes from: setting, profile, CompressionSettings."""

from __future__ import annotations

import pytest

from palimpsest.v1 import compressor_pb2
from services.agent.profiles import Profile, profile_from_dict
from services.compressor.pricing import Knobs
from services.shared.errors import InvalidArgument
from services.shared.settings import Settings


# -- where the summarizer's window comes from --------------------------------------------------


def test_the_summarizer_window_defaults_to_ollama_num_ctx() -> None:
    assert Knobs.resolve(Settings(ollama_num_ctx=12_288), None).summarizer_window == 12_288


def test_context_summarizer_num_ctx_sets_it_for_every_profile() -> None:
    settings = Settings(ollama_num_ctx=8192, summarizer_num_ctx=32_768)
    assert Knobs.resolve(settings, None).summarizer_window == 32_768


def test_a_profiles_summarizer_window_wins_over_the_setting() -> None:
    settings = Settings(summarizer_num_ctx=32_768)
    overrides = compressor_pb2.CompressionSettings(summarizer_model="s", summarizer_window=16_384)
    assert Knobs.resolve(settings, overrides).summarizer_window == 16_384


def test_a_negative_summarizer_window_names_the_field() -> None:
    with pytest.raises(InvalidArgument, match="summarizer_window"):
        Knobs.resolve(Settings(), compressor_pb2.CompressionSettings(summarizer_window=-1))


def test_summarizer_window_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTEXT_SUMMARIZER_NUM_CTX", "24576")
    assert Settings.from_env().summarizer_num_ctx == 24_576
    monkeypatch.delenv("CONTEXT_SUMMARIZER_NUM_CTX")
    assert Settings.from_env().summarizer_num_ctx == 0


def test_a_profile_sends_its_summarizer_context_window_to_the_compressor() -> None:
    profile = profile_from_dict({"summarizer_model": "small-summarizer", "summarizer_context_window": 16_384})
    settings = profile.compression_settings()
    assert settings.summarizer_model == "small-summarizer" and settings.summarizer_window == 16_384


def test_a_profile_without_one_leaves_it_to_the_service() -> None:
    assert not Profile().compression_settings().HasField("summarizer_window")

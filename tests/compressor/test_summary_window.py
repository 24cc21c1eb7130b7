"""The summary call's window: one num_ctx per model, room for the summary, num_predict capped; and where
the summarizer's own window comes from (setting, profile, CompressionSettings)."""

from __future__ import annotations

import pytest

from palimpsest.agent.profiles import Profile, profile_from_dict
from palimpsest.compressor.pricing import Knobs
from palimpsest.compressor.summary_window import input_limit, num_predict, padded, summary_num_ctx
from palimpsest.shared.errors import InvalidArgument
from palimpsest.shared.settings import Settings
from palimpsest.v1 import compressor_pb2

# -- which num_ctx ----------------------------------------------------------------------------


@pytest.mark.parametrize("conversation_window", [4096, 8192, 8193, 32_768])
def test_the_conversations_own_model_gets_exactly_the_conversations_window(conversation_window: int) -> None:
    assert (
        summary_num_ctx(
            same_model=True, conversation_window=conversation_window, summarizer_window=65_536, context_length=262_144
        )
        == conversation_window
    )


def test_a_separate_summarizer_model_gets_its_own_window() -> None:
    assert (
        summary_num_ctx(same_model=False, conversation_window=8192, summarizer_window=16_384, context_length=32_768)
        == 16_384
    )


@pytest.mark.parametrize("same_model", [True, False])
def test_the_window_is_never_above_the_models_context_length(same_model: bool) -> None:
    assert (
        summary_num_ctx(
            same_model=same_model, conversation_window=65_536, summarizer_window=65_536, context_length=32_768
        )
        == 32_768
    )


def test_an_unknown_context_length_caps_nothing() -> None:
    assert (
        summary_num_ctx(same_model=False, conversation_window=8192, summarizer_window=65_536, context_length=0)
        == 65_536
    )


# -- room for the summary ---------------------------------------------------------------------


def test_the_summary_keeps_its_max_tokens_free_when_they_fit_a_quarter_of_the_window() -> None:
    limit = input_limit(32_768, 2000)
    assert padded(limit) <= 32_768 - 2000 < padded(limit + 1)


def test_a_max_tokens_over_a_quarter_of_the_window_leaves_the_input_three_quarters() -> None:
    limit = input_limit(8192, 6000)
    assert padded(limit) <= 8192 - 2048 < padded(limit + 1)


def test_num_predict_is_the_configured_cap_when_prompt_and_summary_fit() -> None:
    assert num_predict(8192, 1000, 6000) == 6000


def test_num_predict_is_capped_so_prompt_and_summary_fit_the_window() -> None:
    predict = num_predict(8192, 5000, 6000)
    assert padded(5000) + predict == 8192


@pytest.mark.parametrize("num_ctx", [1024, 4096, 8192, 100_000])
@pytest.mark.parametrize("max_tokens", [0, 500, 6000, 200_000])
def test_an_input_within_the_limit_leaves_the_summary_at_least_its_reserved_room(num_ctx: int, max_tokens: int) -> None:
    prompt = input_limit(num_ctx, max_tokens)
    assert num_predict(num_ctx, prompt, max_tokens) >= min(max_tokens, num_ctx // 4)
    assert padded(prompt) + num_predict(num_ctx, prompt, max_tokens) <= num_ctx


def test_a_prompt_filling_the_window_leaves_no_room_at_all() -> None:
    assert num_predict(4096, 4000, 6000) == 0


# -- where the summarizer's window comes from --------------------------------------------------


def test_the_summarizer_window_defaults_to_ollama_num_ctx() -> None:
    assert Knobs.resolve(Settings(ollama_num_ctx=12_288), None).summarizer_window == 12_288


def test_context_summarizer_num_ctx_sets_it_for_every_profile() -> None:
    settings = Settings(ollama_num_ctx=8192, compression_summarizer_window=32_768)
    assert Knobs.resolve(settings, None).summarizer_window == 32_768


def test_a_profiles_summarizer_window_wins_over_the_setting() -> None:
    settings = Settings(compression_summarizer_window=32_768)
    overrides = compressor_pb2.CompressionSettings(summarizer_model="s", summarizer_window=16_384)
    assert Knobs.resolve(settings, overrides).summarizer_window == 16_384


def test_a_negative_summarizer_window_names_the_field() -> None:
    with pytest.raises(InvalidArgument, match="summarizer_window"):
        Knobs.resolve(Settings(), compressor_pb2.CompressionSettings(summarizer_window=-1))


def test_summarizer_window_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PALIMPSEST_COMPRESSION_SUMMARIZER_WINDOW", "24576")
    assert Settings.from_env().compression_summarizer_window == 24_576
    monkeypatch.delenv("PALIMPSEST_COMPRESSION_SUMMARIZER_WINDOW")
    assert Settings.from_env().compression_summarizer_window == 0


def test_a_profile_sends_its_summarizer_context_window_to_the_compressor() -> None:
    profile = profile_from_dict({"summarizer_model": "small-summarizer", "compression_summarizer_window": 16_384})
    settings = profile.compression_settings()
    assert settings.summarizer_model == "small-summarizer" and settings.summarizer_window == 16_384


def test_a_profile_without_one_leaves_it_to_the_service() -> None:
    assert not Profile().compression_settings().HasField("summarizer_window")

"""Profiles files: prompt files read once and refused by name, reloads only when the file changed."""

from __future__ import annotations

import json
import os

import pytest

from palimpsest.agent.profiles import ProfileRegistry, ProfilesFileError


def write_profiles(path, **profile) -> None:
    path.write_text(json.dumps({"profiles": [{"id": "p", **profile}]}))


def test_a_missing_prompt_file_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "profiles.json"
    missing = tmp_path / "nowhere" / "summary.txt"
    write_profiles(path, compression_prompt_file=str(missing))
    with pytest.raises(ProfilesFileError) as refused:
        ProfileRegistry.load(str(path))
    assert "compression_prompt_file" in str(refused.value)
    assert str(missing) in str(refused.value) and "'p'" in str(refused.value)


def test_the_prompt_file_is_read_once_not_on_every_size_check(tmp_path):
    prompt = tmp_path / "summary.txt"
    prompt.write_text("Summarize tersely.")
    path = tmp_path / "profiles.json"
    write_profiles(path, compression_prompt_file=str(prompt))
    profile = ProfileRegistry.load(str(path)).get("p")
    prompt.unlink()  # a per-call read would fail from here on
    assert profile.compression_settings().summary_prompt == "Summarize tersely."


def test_a_reload_happens_when_the_size_changes_though_the_mtime_does_not(tmp_path):
    path = tmp_path / "profiles.json"
    write_profiles(path, model="m1")
    os.utime(path, ns=(10**18, 10**18))
    registry = ProfileRegistry.load(str(path))
    assert not registry.changed() and registry.reloaded() is None
    write_profiles(path, model="model-two")  # a longer file, written within the same mtime tick
    os.utime(path, ns=(10**18, 10**18))
    assert registry.changed()
    assert registry.reloaded().get("p").model == "model-two"


def test_an_edit_naming_a_missing_prompt_file_keeps_the_profiles_in_use(tmp_path, caplog):
    path = tmp_path / "profiles.json"
    write_profiles(path, model="m1")
    registry = ProfileRegistry.load(str(path))
    write_profiles(path, model="m2", compression_prompt_file=str(tmp_path / "gone.txt"))
    os.utime(path, (1, 1))
    kept = registry.reloaded()  # the profiles in use, saying why the edit was not taken
    assert kept is not None and str(tmp_path / "gone.txt") in kept.error
    assert kept.profiles == registry.profiles and kept.reloaded() is None  # said once per edit


def test_a_profiles_sandbox_is_read_with_its_limits_and_defaults(tmp_path):
    path = tmp_path / "profiles.json"
    path.write_text(
        json.dumps(
            {
                "profiles": [
                    {
                        "id": "coder",
                        "tools": {"agent": ["run_command"]},
                        "sandbox": {"network": True, "memory_mb": 512},
                    },
                    {"id": "trusted", "tools": {"agent": ["run_command"]}, "sandbox": {"enabled": False}},
                    {"id": "chat"},
                ]
            }
        )
    )
    registry = ProfileRegistry.load(str(path))
    coder = registry.get("coder").sandbox
    assert (coder.sandboxed, coder.network, coder.memory_mb, coder.wall_seconds) == (True, True, 512, 120.0)
    assert registry.get("chat").sandbox.sandboxed  # sandboxed unless a profile says otherwise
    assert registry.sandboxed_profiles("auto") == ["coder"]  # chat runs no commands; trusted not sandboxed
    assert registry.sandboxed_profiles("required") == ["coder", "trusted"]
    assert registry.sandboxed_profiles("off") == []


@pytest.mark.parametrize(
    ("sandbox", "named"),
    [
        ({"memory_mb": 0}, "sandbox.memory_mb must be a whole number of at least 1, got 0"),
        ({"wall_seconds": "60"}, "sandbox.wall_seconds must be a number of seconds above 0"),
        ({"enabled": "yes"}, "sandbox.enabled must be true or false"),
        ({"netwrok": True}, "sandbox: unknown key(s) netwrok"),
        (True, "sandbox must be an object"),
    ],
)
def test_a_bad_sandbox_setting_is_refused_naming_the_key(tmp_path, sandbox, named):
    path = tmp_path / "profiles.json"
    write_profiles(path, sandbox=sandbox)
    with pytest.raises(ProfilesFileError) as refused:
        ProfileRegistry.load(str(path))
    assert named in str(refused.value) and "'p'" in str(refused.value) and str(path) in str(refused.value)

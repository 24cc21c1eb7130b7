"""What a newcomer meets first (issue 14): help texts, startup messages, hints that work as printed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_simulator_help_names_the_command_and_explains_each_option() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ollama_sim", "--help"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith("usage: python -m ollama_sim")
    assert "__main__.py" not in out
    assert "address to listen on" in out and "port to listen on" in out


# -- starting ---------------------------------------------------------------------------------------
import asyncio  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402

import pytest  # noqa: E402

from palimpsest.shared.ports import free_port  # noqa: E402

VENV_BIN = str(Path(sys.executable).parent)


def service_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PALIMPSEST_", "DATABASE_URL", "OLLAMA_"))}
    env.update(
        PALIMPSEST_STORE_ADDR=f"127.0.0.1:{free_port()}",
        PALIMPSEST_COMPRESSOR_ADDR=f"127.0.0.1:{free_port()}",
        PALIMPSEST_AGENT_ADDR=f"127.0.0.1:{free_port()}",
        PALIMPSEST_DATA_DIR=str(tmp_path / "data"),
        OLLAMA_HOST="http://127.0.0.1:1",
        PYTHONPATH=str(ROOT),
    )
    env.update(extra)
    return env


def start_failure(module: str, env: dict[str, str]) -> list[str]:
    ran = subprocess.run([sys.executable, "-m", module], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 1, ran.stderr
    return [line for line in ran.stderr.splitlines() if line.strip()]


@pytest.mark.parametrize(
    "url, says",
    [
        ("postgresql://nobody@127.0.0.1:1/nowhere", "cannot reach PostgreSQL at 127.0.0.1:1"),
        ("postgres.example.com", "not a usable PostgreSQL URL"),
    ],
)
def test_a_bad_database_url_is_one_line_naming_the_setting_and_the_fix(tmp_path, url, says) -> None:
    lines = start_failure("palimpsest.store", service_env(tmp_path, DATABASE_URL=url))
    assert len(lines) == 1, lines
    assert lines[0].startswith("SessionStore did not start: DATABASE_URL")
    assert says in lines[0] and "unset it to use the embedded PostgreSQL" in lines[0]


def test_a_broken_profiles_file_stops_the_agent_with_its_file_and_line(tmp_path) -> None:
    broken = tmp_path / "profiles.json"
    broken.write_text('{"profiles": [\n  {"id": "a",\n   "model": "x",,}\n]}\n')
    env = service_env(tmp_path, PALIMPSEST_PROFILES=str(broken))
    lines = start_failure("palimpsest.agent", env)
    assert len(lines) == 1, lines
    assert f"PALIMPSEST_PROFILES: {broken} line 3 column" in lines[0]
    assert "unset PALIMPSEST_PROFILES" in lines[0]
    # The traceback is there for whoever asks for it.
    debug = start_failure("palimpsest.agent", dict(env, PALIMPSEST_DEBUG="1"))
    assert debug[0].startswith("Traceback") and "JSONDecodeError" in "\n".join(debug)
    assert debug[-1] == lines[0]


def test_make_run_says_which_service_did_not_start_and_nothing_more(tmp_path) -> None:
    env = service_env(tmp_path, DATABASE_URL="postgresql://nobody@127.0.0.1:1/nowhere")
    ran = subprocess.run(
        [sys.executable, "-m", "palimpsest.run"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=90
    )
    assert ran.returncode == 1
    lines = [line for line in ran.stderr.splitlines() if line.strip()]
    assert len(lines) == 2, lines
    assert lines[0].startswith("SessionStore did not start: DATABASE_URL")
    assert lines[1].startswith("make run: SessionStore exited while starting")


async def test_make_run_hints_commands_that_work_as_printed(tmp_path, database_url, ollama_sim) -> None:
    """The hint is typed into a new terminal: no virtualenv on PATH, none of make run's settings."""
    env = service_env(tmp_path, DATABASE_URL=database_url, OLLAMA_HOST=ollama_sim.url)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "palimpsest.run",
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        printed = ""
        while "Ctrl-C stops everything." not in printed:
            line = await asyncio.wait_for(proc.stdout.readline(), 90)
            assert line, f"make run ended early:\n{printed}\n{(await proc.stderr.read()).decode()}"
            printed += line.decode()
        commands = [line.strip() for line in printed.split("Try")[1].splitlines()[1:] if line.startswith("  ")]
        assert any(" health" in c for c in commands) and any("grpcurl" in c for c in commands)
        assert "localhost:50051" not in printed and env["PALIMPSEST_STORE_ADDR"] in printed
        terminal = {k: v for k, v in os.environ.items() if not k.startswith(("PALIMPSEST_", "VIRTUAL_ENV"))}
        terminal["PATH"] = os.pathsep.join(
            p for p in terminal.get("PATH", "").split(os.pathsep) if p and Path(p).resolve() != Path(VENV_BIN).resolve()
        )
        for command in commands:
            if command.endswith(" chat"):
                command += " </dev/null"
            typed = await asyncio.create_subprocess_shell(
                command, cwd=ROOT, env=terminal, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
            out, err = await asyncio.wait_for(typed.communicate(), 60)
            assert typed.returncode == 0, f"{command}\n{out.decode()}\n{err.decode()}"
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    # The Agent checks Ollama every 10 s; httpx's INFO line for each check is not logged.
    assert "HTTP Request:" not in err.decode()


def test_finding_the_embedded_postgresql_warns_of_nothing_without_xdg_runtime_dir() -> None:
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    ran = subprocess.run(
        [
            sys.executable,
            "-W",
            "error",
            "-c",
            "from palimpsest.shared.embedded_pg import _package_install; print(_package_install())",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stderr == ""


def test_each_checkout_has_a_test_database_folder_of_its_own(tmp_path) -> None:
    from tests.conftest import CHECKOUT, checkout_test_dir

    mine, other = checkout_test_dir(CHECKOUT), checkout_test_dir(tmp_path / CHECKOUT.name)
    assert mine != other and mine.parent == other.parent
    assert mine.name.startswith(f"palimpsest-test-{CHECKOUT.name}-")
    assert checkout_test_dir(CHECKOUT) == mine  # the same on every run


def test_make_demo_explains_its_numbers_and_ends_quietly() -> None:
    """On an embedded database of its own, as `make demo` runs on a fresh machine."""
    import shutil
    import tempfile

    data = Path(tempfile.mkdtemp(prefix="palimpsest-demo-", dir="/tmp"))
    data.chmod(0o755)  # as root, the database runs as its own user, which must reach the folder
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PALIMPSEST_", "DATABASE_URL", "GRPC_"))}
        env.update(PALIMPSEST_DATA_DIR=str(data), DEMO_TURNS="24", COLUMNS="200")
        ran = subprocess.run(
            [sys.executable, "-m", "ollama_sim.demo"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
        )
    finally:
        shutil.rmtree(data, ignore_errors=True)
    assert ran.returncode == 0, ran.stderr
    assert ran.stderr == ""  # no fork_posix.cc line from gRPC as the database stops
    out = ran.stdout
    assert "compression starts at 3072 tokens (75%), not at PALIMPSEST_COMPRESSION_THRESHOLD=0.90" in out
    assert "Context compressed:" in out and "plus the system prompt and tools" in out
    session_id = out.split("\nsession ")[1].split(":")[0]
    assert f"pal continue --id {session_id}" in out

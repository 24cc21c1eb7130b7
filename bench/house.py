"""The house's shape, measured from its source (issue 27's "done when"): the largest hand-written file and
class, import circles, functions mypy skips, the README's length, test modules that import other test
modules, and the top-level packages installed. Measured on this tree and, beside it, on an earlier commit
(`HOUSE_BEFORE`, default e25b6b7: the tree issue 27 was written against), extracted with `git archive`.

Static: nothing is run or imported, so the earlier tree's layout (services/ and clients/) is read as well.
"""

from __future__ import annotations

import ast
import io
import os
import subprocess
import tarfile
import tempfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

NEEDS_POSTGRES = False
ROOT = Path(__file__).resolve().parents[1]
BEFORE = os.environ.get("HOUSE_BEFORE", "e25b6b7")
GENERATED = "v1"  # palimpsest/v1: protoc's output


@dataclass(frozen=True)
class Module:
    name: str  # dotted, e.g. palimpsest.agent.turn
    path: Path
    tree: ast.Module
    is_package: bool


@dataclass(frozen=True)
class Shape:
    largest_file: tuple[int, str]
    largest_class: tuple[int, str]
    import_circles: list[list[str]]
    untyped_functions: int  # no annotation at all: bodies mypy skips without check_untyped_defs
    partly_typed_functions: int  # a parameter or the return left unannotated
    functions: int
    readme_lines: int
    cross_test_imports: int
    installed_packages: list[str]


def runtime_roots(tree: Path) -> list[str]:
    """The installed packages' source folders (hand-written only)."""
    include = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted({pattern.rstrip("*") for pattern in include})


def modules(tree: Path, roots: list[str]) -> Iterator[Module]:
    for root in roots:
        for path in sorted((tree / root).rglob("*.py")):
            parts = path.relative_to(tree).with_suffix("").parts
            if GENERATED in parts[1:2]:
                continue
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            yield Module(name, path, ast.parse(path.read_text(), str(path)), is_package)


def imported_names(module: Module) -> Iterator[str]:
    """Every module name an import anywhere in it may refer to (function-level imports included: a
    circle through a lazy import is still a circle a reader has to hold in mind)."""
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_circles(found: list[Module]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), importers resolved to known modules.
    A package's own __init__ importing its children is not a circle a reader notices, so edges from a
    package to its submodules are left out."""
    known = {m.name for m in found}
    edges = {
        m.name: sorted({n for n in imported_names(m) if n in known and n != m.name and not n.startswith(m.name + ".")})
        for m in found
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for name in sorted(edges):
        if name not in index:
            visit(name)
    return circles


def annotation_gaps(function: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[bool, bool]:
    """(no annotation at all, some annotation missing); self and cls need none."""
    arguments = function.args
    params = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    params += [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
    params = [p for p in params if p.arg not in ("self", "cls")]
    annotated = [p.annotation is not None for p in params] + [function.returns is not None]
    return not any(annotated), not all(annotated)


def cross_test_imports(tree: Path) -> int:
    count = 0
    for path in sorted((tree / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            count += sum(name.rpartition(".")[2].startswith("test_") for name in names)
    return count


def measure(tree: Path) -> Shape:
    roots = runtime_roots(tree)
    found = list(modules(tree, roots))
    files = [(len(m.path.read_text().splitlines()), str(m.path.relative_to(tree))) for m in found]
    classes = [
        (node.end_lineno - node.lineno + 1, f"{m.path.relative_to(tree)}: {node.name}")
        for m in found
        for node in ast.walk(m.tree)
        if isinstance(node, ast.ClassDef) and node.end_lineno is not None
    ]
    functions = [
        node for m in found for node in ast.walk(m.tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    gaps = [annotation_gaps(f) for f in functions]
    return Shape(
        largest_file=max(files),
        largest_class=max(classes),
        import_circles=import_circles(found),
        untyped_functions=sum(untyped for untyped, _ in gaps),
        partly_typed_functions=sum(partly for untyped, partly in gaps if not untyped),
        functions=len(functions),
        readme_lines=len((tree / "README.md").read_text().splitlines()),
        cross_test_imports=cross_test_imports(tree),
        installed_packages=roots,
    )


def extract(revision: str, into: Path) -> Path:
    archive = subprocess.run(["git", "archive", revision], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def rows(before: Shape, after: Shape) -> list[tuple[str, str, str]]:
    def circles(shape: Shape) -> str:
        return "; ".join(" ↔ ".join(c) for c in shape.import_circles) or "none"

    return [
        ("largest hand-written file (lines)", *(f"{s.largest_file[0]} ({s.largest_file[1]})" for s in (before, after))),
        ("largest class (lines)", *(f"{s.largest_class[0]} ({s.largest_class[1]})" for s in (before, after))),
        ("import circles", circles(before), circles(after)),
        ("functions with no annotation", *(f"{s.untyped_functions} of {s.functions}" for s in (before, after))),
        ("functions partly annotated", *(str(s.partly_typed_functions) for s in (before, after))),
        ("README lines", *(str(s.readme_lines) for s in (before, after))),
        ("test modules importing test modules", *(str(s.cross_test_imports) for s in (before, after))),
        ("packages installed", *(", ".join(s.installed_packages) for s in (before, after))),
    ]


async def run(args: object) -> str:
    with tempfile.TemporaryDirectory() as scratch:
        before = measure(extract(BEFORE, Path(scratch)))
    after = measure(ROOT)
    table = rows(before, after)
    widths = [max(len(r[i]) for r in [("measure", f"before ({BEFORE})", "now"), *table]) for i in range(3)]
    lines = [("measure", f"before ({BEFORE})", "now"), tuple("-" * w for w in widths), *table]
    return "\n".join("| " + " | ".join(cell.ljust(w) for cell, w in zip(line, widths)) + " |" for line in lines)

"""The shape issue 27 asked for, kept: no import circles in the installed package (a lazy or
type-checking import counts: it is still a circle a reader holds in mind)."""

from __future__ import annotations

from bench.house import ROOT, import_circles, modules, runtime_roots


def test_the_package_has_no_import_circle() -> None:
    found = list(modules(ROOT, runtime_roots(ROOT)))
    assert len(found) > 150  # the walk found the package, not an empty folder
    assert import_circles(found) == []

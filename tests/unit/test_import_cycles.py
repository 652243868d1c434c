"""No import cycle inside the engine's or the simulated lab's package, counting every import: module level or
inside a function, relative or absolute, and importlib with a literal name (tests/imports.py reads them).

A function-level import hides a cycle from Python at load time, not from the reader: both ends still depend on
each other. Both packages are checked (PACKAGES).
"""

from __future__ import annotations

import pytest
from imports import LIBRARY, cycles, import_graph

PACKAGES = ["gpulab", "labsim"]


def describe(package: str) -> list[str]:
    """Each cycle of the package, with the line of every import that ties it."""
    graph = import_graph(LIBRARY / package)
    out = []
    for members in cycles(graph):
        ties = [
            f"{a} imports {b} (line {line})" for a in members for b, line in graph[a].items() if b in members
        ]
        out.append(" <-> ".join(members) + ":\n    " + "\n    ".join(ties))
    return out


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package):
    assert len(import_graph(LIBRARY / package)) > 5, f"library/{package} holds almost no modules"
    found = describe(package)
    assert not found, f"import cycles in library/{package}:\n" + "\n".join(found)


def test_cycles_are_found_through_function_level_and_relative_imports(tmp_path):
    """The checker sees a cycle tied by a function-level import and a relative one, and nothing else."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import thing\n")
    (pkg / "b.py").write_text("def f():\n    from pkg import c\n")
    (pkg / "c.py").write_text("from .sub import d\n")
    (pkg / "sub" / "d.py").write_text("import importlib\nimportlib.import_module('pkg.a')\n")
    (pkg / "e.py").write_text("import pkg.a\n")  # imports into the cycle, is no part of it
    assert cycles(import_graph(pkg, base=tmp_path)) == [["pkg.a", "pkg.b", "pkg.c", "pkg.sub.d"]]

"""Reading imports from source (ast), for the tests that keep the packages' import graphs in shape
(tests/unit/test_package_boundary.py, tests/unit/test_import_cycles.py).

Every import counts: module level or inside a function, absolute or relative (resolved against the file's
package), and importlib.import_module / __import__ / pytest.importorskip with a literal name.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "library"
DYNAMIC = {"import_module", "__import__", "importorskip"}


def package_of(path: Path, base: Path | None = None) -> list[str]:
    """The dotted package a file belongs to: its folder under ``base``, by default library/ (plugins/...: under
    the repository)."""
    if base is None:
        base = LIBRARY if path.is_relative_to(LIBRARY) else ROOT
    return list(path.relative_to(base).parent.parts)


def imported_modules(source: str, package: list[str]) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the source, relative ones resolved in ``package``."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            if module:
                out.append((node.lineno, module))
            # `from x import y` may import the module x.y
            out += [(node.lineno, f"{module}.{alias.name}".lstrip(".")) for alias in node.names]
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            first = node.args[0]
            if name in DYNAMIC and isinstance(first, ast.Constant) and isinstance(first.value, str):
                out.append((node.lineno, first.value))
    return out


def module_name(path: Path, base: Path = LIBRARY) -> str:
    """The dotted name of a file under ``base`` (a package's __init__.py: the package)."""
    parts = [*package_of(path, base), path.stem]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(folder: Path, base: Path = LIBRARY) -> dict[str, dict[str, int]]:
    """module -> {module of the same folder tree it imports: first line}, for every .py file under `folder`
    (a package in ``base``).

    An import of `a.b.c` counts as one of the nearest module of the tree it names (`from a.b import name`
    of a function is an import of `a.b`; `from a import b` of the module `a.b`, of the package `a` too)."""
    files = {module_name(p, base): p for p in sorted(folder.rglob("*.py"))}
    graph: dict[str, dict[str, int]] = {}
    for name, path in files.items():
        edges: dict[str, int] = {}
        for line, target in imported_modules(path.read_text(), package_of(path, base)):
            while target and target not in files:
                target = target.rpartition(".")[0]
            if not target or target == name:
                continue
            edges.setdefault(target, line)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The import cycles of a graph: each strongly connected component of more than one module, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)

"""The product and the simulated lab stay apart: gpulab and the Ansible plugins import nothing of labsim,
and labsim imports nothing of gpulab (`gpulab lab` runs labsim as a program, `python -m labsim`).

Every import is read from the source (ast): module level or inside a function, absolute or relative (resolved
against the file's package), and importlib.import_module / __import__ / pytest.importorskip with a literal name.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "library"

# (folder, the top-level package its files must not import)
RULES = [
    (LIBRARY / "gpulab", "labsim"),
    (ROOT / "plugins", "labsim"),
    (LIBRARY / "labsim", "gpulab"),
]
DYNAMIC = {"import_module", "__import__", "importorskip"}


def package_of(path: Path) -> list[str]:
    """The dotted package a file belongs to: its folder under library/ (plugins/...: under the repository)."""
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


def violations(folder: Path, forbidden: str) -> list[str]:
    found = []
    for path in sorted(folder.rglob("*.py")):
        for line, module in imported_modules(path.read_text(), package_of(path)):
            if module == forbidden or module.startswith(forbidden + "."):
                found.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return found


def test_the_product_and_the_simulated_lab_import_nothing_of_each_other():
    problems = []
    for folder, forbidden in RULES:
        files = list(folder.rglob("*.py"))
        assert len(files) > 5, f"{folder} holds only {len(files)} Python files: the rule would check nothing"
        problems += violations(folder, forbidden)
    assert not problems, "imports across the product/simulator boundary:\n" + "\n".join(problems)


def test_every_kind_of_import_is_seen():
    """The checker finds each way of importing, so a clean result above means something."""
    source = (
        "import gpulab\n"
        "import os, gpulab.pve.client as c\n"
        "from gpulab import labdef\n"
        "def f():\n"
        "    from gpulab.routers import model\n"
        "    import importlib\n"
        "    importlib.import_module('gpulab.inventory')\n"
        "    __import__('gpulab')\n"
        "from . import addressing\n"
        "from labsim.fixture import load_fixture\n"
    )
    found = imported_modules(source, ["labsim", "net"])
    lines = sorted({line for line, m in found if m == "gpulab" or m.startswith("gpulab.")})
    assert lines == [1, 2, 3, 5, 7, 8], found


def test_relative_imports_resolve_against_the_package():
    package = package_of(LIBRARY / "labsim" / "net" / "node_host.py")
    assert package == ["labsim", "net"]
    found = imported_modules("from .. import fixture\nfrom .addressing import X\nfrom . import y\n", package)
    assert found == [
        (1, "labsim"),
        (1, "labsim.fixture"),
        (2, "labsim.net.addressing"),
        (2, "labsim.net.addressing.X"),
        (3, "labsim.net"),
        (3, "labsim.net.y"),
    ]

"""The product and the simulated lab stay apart: gpulab and the Ansible plugins import nothing of labsim,
and labsim imports nothing of gpulab (`gpulab lab` runs labsim as a program, `python -m labsim`).

Every import is read from the source (tests/imports.py, with ast): module level or inside a function, absolute or
relative (resolved against the file's package), and importlib.import_module / __import__ / pytest.importorskip
with a literal name.
"""

from __future__ import annotations

from pathlib import Path

from imports import LIBRARY, ROOT, imported_modules, package_of

# (folder, the top-level package its files must not import)
RULES = [
    (LIBRARY / "gpulab", "labsim"),
    (ROOT / "plugins", "labsim"),
    (LIBRARY / "labsim", "gpulab"),
]


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

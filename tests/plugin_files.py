"""A plugin of this checkout loaded from its file, for the tests of its functions (no Ansible run needed)."""

from __future__ import annotations

from importlib import util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load(relative: str, name: str | None = None) -> ModuleType:
    """The Python file at ``relative`` (to the repository) as a module of its own."""
    path = ROOT / relative
    spec = util.spec_from_file_location(name or f"_under_test_{path.stem}", path)
    module = util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def argument_spec(module: str) -> dict:
    """The ARGUMENT_SPEC that plugins/modules/<module>.py declares: what AnsibleModule and validate-modules read,
    the one place a module's options are declared."""
    return load(f"plugins/modules/{module}.py").ARGUMENT_SPEC


def filters(plugin: str) -> dict:
    """The filters of plugins/filter/<plugin>.py by name."""
    return load(f"plugins/filter/{plugin}.py").FilterModule().filters()

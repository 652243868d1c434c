"""The modules of plugins/modules run outside Ansible, as the tests load and start them.

The controller modules import their shared prologue as a collection's modules do,
`from ansible_collections.gpulab.homelab.plugins.module_utils.controller_module import ...`. Ansible finds it
through the collection (the checkout is gpulab.homelab through .collections, ansible.cfg `collections_path`)
and ships it with each module; outside Ansible, `use_module_utils()` starts Ansible's collection loader on
.collections, so the package `ansible_collections.gpulab.homelab` is this checkout (tests/conftest.py does
it for every test), and a module run in a fresh interpreter starts through `command()`, which puts
.collections on sys.path first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = ROOT / "plugins" / "modules"
COLLECTIONS = ROOT / ".collections"  # ansible_collections/gpulab/homelab: this checkout

# python -c START <collections> <module.py> [args]: runs the module file as `python <module.py> [args]` would.
START = "import runpy, sys; sys.path.insert(0, sys.argv[1]); sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')"


def use_module_utils() -> None:
    """`ansible_collections.gpulab.homelab` is this checkout, imported through Ansible's collection loader
    (with the collection's metadata, as a plugin loader finds it)."""
    from ansible.plugins.loader import init_plugin_loader
    from ansible.utils.collection_loader import AnsibleCollectionConfig

    if AnsibleCollectionConfig.collection_finder is None:
        init_plugin_loader([str(COLLECTIONS)])


def command(path: Path | str, *args: str) -> list[str]:
    """The command that runs the module file `path` with `args` in a fresh interpreter (this one's)."""
    return [sys.executable, "-c", START, str(COLLECTIONS), str(path), *args]


def run_json(path: Path | str, args: dict, *, check_mode=False, diff=False, env=None, timeout=60) -> dict:
    """Run the module file `path` as Ansible runs it on a host (its arguments as JSON on argv, no stdin) and
    return its JSON result; `env` adds to this process's environment. A run that prints no JSON fails the test."""
    payload = {"ANSIBLE_MODULE_ARGS": {**args, "_ansible_check_mode": check_mode, "_ansible_diff": diff}}
    proc = subprocess.run(
        command(path, json.dumps(payload)),
        input="",
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        check=False,
    )
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(
            f"{Path(path).stem} printed no JSON (rc {proc.returncode}): {proc.stdout!r} {proc.stderr!r}"
        )

"""The modules of plugins/modules run outside Ansible, as the tests load and start them.

The controller modules import their shared prologue as Ansible's own modules do,
`from ansible.module_utils.gpulab_module import ...`. Ansible finds that file in plugins/module_utils
(ansible.cfg `module_utils`) and ships it with each module; outside Ansible, `use_module_utils()` adds the
folder to the package `ansible.module_utils` (tests/conftest.py does it for every test), and a module run
in a fresh interpreter starts through `command()`, which does the same first.
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
MODULE_UTILS = ROOT / "plugins" / "module_utils"

# python -c START <module_utils> <module.py> [args]: runs the module file as `python <module.py> [args]` would.
START = (
    "import runpy, sys; import ansible.module_utils as m; m.__path__.append(sys.argv[1]); "
    "sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def use_module_utils() -> None:
    import ansible.module_utils

    if str(MODULE_UTILS) not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(str(MODULE_UTILS))


def command(path: Path | str, *args: str) -> list[str]:
    """The command that runs the module file `path` with `args` in a fresh interpreter (this one's)."""
    return [sys.executable, "-c", START, str(MODULE_UTILS), str(path), *args]


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

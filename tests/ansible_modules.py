"""The modules of plugins/modules run outside Ansible, as the tests load and start them.

The controller modules import their shared prologue as Ansible's own modules do,
`from ansible.module_utils.gpulab_module import ...`. Ansible finds that file in plugins/module_utils
(ansible.cfg `module_utils`) and ships it with each module; outside Ansible, `use_module_utils()` adds the
folder to the package `ansible.module_utils` (tests/conftest.py does it for every test), and a module run
in a fresh interpreter starts through `command()`, which does the same first.
"""

from __future__ import annotations

import sys
from pathlib import Path

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

"""The part the waiting action plugins share (wait, apt_locks): their options, their lines and
their clock.

Not an action plugin itself (plugin_utils: shared by them). Each plugin's options are the ARGUMENT_SPEC its
module file (the documentation, plugins/modules/<name>.py) declares, read once through the module loader and
checked with the task's arguments before `wait` runs. Its progress lines ("<host>: waiting for ...") go
through Ansible's display; `clock` and `sleep`, when a test sets them, are what gpulab.waiting.Progress
waits with.
"""

from __future__ import annotations

import importlib.util

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible_collections.gpulab.homelab.plugins.plugin_utils.engine import MissingEngine

try:
    from gpulab import waiting
except ImportError as err:  # the engine runs here, on the controller: requirements.txt
    waiting = MissingEngine(err)

display = Display()
_SPECS: dict[str, dict] = {}


def documented_argument_spec(loaders, module: str) -> dict:
    """The options of `module` (a FQCN) as its module file declares them in ARGUMENT_SPEC."""
    if module not in _SPECS:
        path = loaders.module_loader.find_plugin_with_context(module).plugin_resolved_path
        spec = importlib.util.spec_from_file_location(f"_{module.rsplit('.', 1)[-1]}_doc", path)
        doc = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(doc)
        _SPECS[module] = dict(doc.ARGUMENT_SPEC)
    return _SPECS[module]


class ActionModule(ActionBase):
    """An action that waits: MODULE names the module that documents its options; `wait` does the waiting
    and returns what goes into the task's result."""

    TRANSFERS_FILES = False
    _supports_check_mode = True
    MODULE = ""

    # a test runs the plugin on a fake clock
    clock = None
    sleep = None

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        spec = documented_argument_spec(self._shared_loader_obj, self.MODULE)
        args = self.validate_argument_spec(argument_spec=spec)[1]
        result.update(self.wait(args, task_vars, task_vars.get("inventory_hostname", "")))
        return result

    def wait(self, args: dict, task_vars: dict, host: str) -> dict:
        raise NotImplementedError

    def progress(self, host: str, what: str, timeout: float, every: float, line=None):
        """gpulab.waiting.Progress for `what`, its lines shown as "<host>: <line>" (`line` words them)."""
        clock = {k: v for k, v in {"clock": self.clock, "sleep": self.sleep}.items() if v is not None}
        return waiting.Progress(
            what,
            timeout,
            every=every,
            emit=lambda text: display.display(f"{host}: {text}"),
            line=line,
            **clock,
        )

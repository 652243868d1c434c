"""The part the waiting action plugins share (gpulab_wait, gpulab_apt_locks): their options and their clock.

Not an action plugin itself (plugin_utils: shared by them). Each plugin's options are the ARGUMENT_SPEC its
module file (the documentation, plugins/modules/<name>.py) declares, read once through the module loader;
`clock` and `sleep`, when a test sets them, are what gpulab.waiting.Progress waits with.
"""

from __future__ import annotations

import importlib.util

from ansible.plugins.action import ActionBase

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
    """An action that waits: MODULE names the module that documents its options."""

    TRANSFERS_FILES = False
    _supports_check_mode = True
    MODULE = ""

    # a test runs the plugin on a fake clock
    clock = None
    sleep = None

    def validated_args(self) -> dict:
        """The task's arguments, checked against the documented options, with their defaults."""
        spec = documented_argument_spec(self._shared_loader_obj, self.MODULE)
        return self.validate_argument_spec(argument_spec=spec)[1]

    def clock_args(self) -> dict:
        """The clock and sleep keyword arguments for gpulab.waiting.Progress, where a test set them."""
        return {k: v for k, v in {"clock": self.clock, "sleep": self.sleep}.items() if v is not None}

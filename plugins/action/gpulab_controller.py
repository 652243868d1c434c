"""The controller modules run inside the Ansible worker that runs their task, not in a new Python.

Not a task of its own: plugins/action/<module>.py of each controller module (the modules of
plugins/modules that talk to the PVE API, a router or k3s from the controller) is this plugin or a
subclass of it. When the task runs on the controller (connection `local`, not async, no `environment`),
the module file is imported once into the worker and its main() runs there with the task's arguments, the
way Ansible would start it: the same AnsibleModule, argument validation, check and diff mode, no_log
masking and result handling. A module started as its own Python spends about 0.3 s importing Ansible's
module code, the engine and requests before its first request; in the worker they are already loaded
(this file imports them when the strategy loads the plugin, before the worker forks).

Anywhere else (a task delegated to a remote host, async, a task `environment`) the module is sent and run
as usual.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import traceback

import ansible.module_utils
import requests  # noqa: F401
from ansible import constants as C
from ansible.module_utils import basic
from ansible.module_utils.common import warnings as module_warnings
from ansible.module_utils.common.json import Direction, get_module_encoder
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

import gpulab.pve.connection  # noqa: F401 - the engine and requests, loaded before the fork

PROFILE = "legacy"
display = Display()


class ModuleExit(Exception):
    """Raised in place of the module's sys.exit: carries the result it reported."""

    def __init__(self, result):
        super().__init__("module exited")
        self.result = result


def _use_module_utils():
    for path in C.config.get_config_value("DEFAULT_MODULE_UTILS_PATH") or ():
        if path not in ansible.module_utils.__path__:
            ansible.module_utils.__path__.append(path)


def _load(name, path):
    """The module file `path` imported once per worker (its `if __name__ == "__main__"` stays off)."""
    key = f"_gpulab_module_{name}"
    if key not in sys.modules:
        _use_module_utils()
        spec = importlib.util.spec_from_file_location(key, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[key]
            raise
    return sys.modules[key]


def _run_main(module, args):
    """Run `module.main()` with `args` (as Ansible passes them) and return the result it reports."""
    reported = []

    def record(_self, result):
        reported.append(result)

    basic._ANSIBLE_ARGS = json.dumps(
        {"ANSIBLE_MODULE_ARGS": args}, cls=get_module_encoder(PROFILE, Direction.CONTROLLER_TO_MODULE)
    ).encode()
    basic._ANSIBLE_PROFILE = PROFILE
    saved = basic.AnsibleModule._record_module_result
    basic.AnsibleModule._record_module_result = record
    # A loop runs all its items in one worker: each run starts with no warning or deprecation left over.
    module_warnings._global_warnings.clear()
    module_warnings._global_deprecations.clear()
    try:
        module.main()
    except SystemExit:
        pass
    finally:
        basic.AnsibleModule._record_module_result = saved
        basic._ANSIBLE_ARGS = None
    if not reported:
        raise RuntimeError("the module ended without reporting a result")
    return reported[-1]


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = True

    def module_args(self, task_vars):
        """The arguments the module gets (a subclass adds to the task's own)."""
        return dict(self._task.args)

    def _in_worker(self):
        if self._connection.transport != "local" or self._task.async_val:
            return False
        environment = {}
        self._compute_environment_string(environment)
        return not environment  # a task's environment is for a new process

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self.module_args(task_vars)
        if not self._in_worker():
            wrap_async = self._task.async_val
            result.update(self._execute_module(module_args=args, task_vars=task_vars, wrap_async=wrap_async))
            if not wrap_async:
                self._remove_tmp_path(self._connection._shell.tmpdir)
            return result
        result.update(self.run_in_worker(args, task_vars))
        return result

    def run_in_worker(self, args, task_vars):
        name = self._task.resolved_action or self._task.action
        found = self._shared_loader_obj.module_loader.find_plugin_with_context(
            self._task.action, collection_list=self._task.collections
        )
        args = dict(args)
        self._update_module_args(name, args, task_vars)
        display.vvv(f"{name}: running {found.plugin_resolved_path} in this worker")
        try:
            reported = _run_main(_load(name, found.plugin_resolved_path), args)
        except Exception as exc:  # a defect in the module: reported as a module failure would be
            return {"failed": True, "msg": f"{name} failed: {exc!r}", "exception": traceback.format_exc()}
        text = json.dumps(reported, cls=get_module_encoder(PROFILE, Direction.MODULE_TO_CONTROLLER))
        utr = self._parse_returned_data({"stdout": text, "stderr": "", "rc": 0}, PROFILE)
        utr.remove_internal_keys()
        return utr.as_result_dict(for_round_trip=True)

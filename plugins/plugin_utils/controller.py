"""The controller modules run inside the Ansible worker that runs their task, not in a new Python.

Not an action plugin itself (plugin_utils: shared by them): plugins/action/<module>.py of each controller
module (the modules of plugins/modules that talk to the PVE API, a router or k3s from the controller)
subclasses it. What the module does is a task of the engine (gpulab.tasks.<name>: its options and a
run function); the module file keeps the documentation and is that task as an AnsibleModule
(plugins/module_utils/controller_module.py).

When the task runs on the controller (connection `local`, not async, no `environment`), this plugin runs
the engine's task here: it checks the arguments against the same argument spec with Ansible's
ArgumentSpecValidator (types, defaults, choices, suboptions, the connection's rules and environment
fallbacks), gives the task check and diff mode as the play sets them, shows its warnings through Ansible's
display, and hides the values of every no_log option in the result (remove_values, as AnsibleModule does).
A module started as its own Python spends about 0.3 s importing Ansible's module code, the engine and
requests before its first request; in the worker they are already loaded (this file imports them when the
strategy loads the plugin, before the worker forks).

Anywhere else (a task delegated to a remote host, async, a task `environment`) the module is sent and run
as usual, with the same options and the same task.
"""

from __future__ import annotations

import traceback

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.common.parameters import env_fallback, remove_values
from ansible.module_utils.errors import UnsupportedError
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible_collections.gpulab.homelab.plugins.plugin_utils.engine import MissingEngine

try:
    # the engine and requests, loaded before the fork
    import gpulab.pve.connection  # noqa: F401  # pylint: disable=unused-import
    from gpulab import tasks
except ImportError as err:  # the engine runs here, on the controller: requirements.txt
    tasks = MissingEngine(err)

display = Display()


class WorkerTask:
    """What a task of gpulab.tasks is given (gpulab.tasks.Task), from the action plugin."""

    def __init__(self, name, params, check_mode, diff, no_log_values):
        self.name = name
        self.params = params
        self.check_mode = check_mode
        self.diff = diff
        self.no_log_values = no_log_values

    def warn(self, msg):
        display.warning(str(remove_values(msg, self.no_log_values)))

    def log(self, msg):
        display.vvv(f"{self.name}: {remove_values(msg, self.no_log_values)}")


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

    def run_in_worker(self, args, task_vars=None):
        """The module's task of gpulab.tasks run here with `args`: the result the module would report."""
        name = self._task.action.rsplit(".", 1)[-1]
        task = tasks.of(name)
        spec = tasks.argument_spec(task, env_fallback)
        checked = ArgumentSpecValidator(spec, **tasks.rules(task)).validate(tasks.plain(args))
        params = checked.validated_parameters
        hidden = tasks.no_log_values(spec, params)
        display.vvv(f"{name}: running {task.__name__} in this worker")
        if checked.error_messages:
            msg = checked.errors.msg
            if isinstance(checked.errors[0], UnsupportedError):
                msg = f"Unsupported parameters for ({name}) module: {msg}"
            return remove_values({"failed": True, "msg": msg}, hidden)
        out = {}
        try:
            out.update(
                task.run(WorkerTask(name, params, bool(self._task.check_mode), bool(self._task.diff), hidden))
            )
        except tasks.Failed as failed:
            out.update(failed.result, failed=True, msg=failed.msg)
        except Exception as exc:  # a defect in the task: reported as a module's traceback would be
            out.update(failed=True, msg=f"{name} failed: {exc!r}", exception=traceback.format_exc())
        out.setdefault("changed", False)
        return remove_values(out, hidden)

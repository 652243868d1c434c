"""pve_vm with progress lines while it waits for the VM's address (the module does the work).

A task that waits for the VM's address (wait_for_address) says, every 10 s while the module runs, what it
waits for and how long ("pve: waiting for VM 101 (vm-1) to be ready and get its address: 40 s of 300 s",
gpulab.waiting); a VM that is there and has its address returns before the first line. Any other task runs
the module as Ansible runs a module: this plugin only adds the lines.
"""

from ansible.module_utils.common.validation import check_type_bool, check_type_int
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible_collections.gpulab.homelab.plugins.plugin_utils.engine import MissingEngine

try:
    from gpulab import waiting
except ImportError as err:  # the engine runs here, on the controller: requirements.txt
    waiting = MissingEngine(err)

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self._task.args
        wrap_async = self._task.async_val
        if not check_type_bool(args.get("wait_for_address", False)) or wrap_async:
            result.update(self._execute_module(task_vars=task_vars, wrap_async=wrap_async))
        else:
            host = task_vars.get("inventory_hostname", "")
            progress = waiting.Progress(
                f"VM {args.get('vmid')} ({args.get('name')}) to be ready and get its address",
                check_type_int(args.get("address_timeout", 300)),
                emit=lambda text: display.display(f"{host}: {text}"),
            )
            with progress.watching():
                result.update(self._execute_module(task_vars=task_vars))
        if not wrap_async:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return result

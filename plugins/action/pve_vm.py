"""pve_vm runs with the PVE connection from the inventory (plugins/plugin_utils/pve_connection.py).

A task that waits for the VM's address (wait_for_address) says, every 10 s while the module runs, what it
waits for and how long ("pve: waiting for VM 101 (vm-1) to be ready and get its address: 40 s of 300 s",
gpulab.waiting); a VM that is there and has its address returns before the first line.
"""

from ansible.module_utils.common.validation import check_type_bool, check_type_int
from ansible.utils.display import Display
from ansible_collections.gpulab.homelab.plugins.plugin_utils.engine import MissingEngine
from ansible_collections.gpulab.homelab.plugins.plugin_utils.pve_connection import (
    ActionModule as PveConnectionAction,
)

try:
    from gpulab import waiting
except ImportError as err:  # the engine runs here, on the controller: requirements.txt
    waiting = MissingEngine(err)

display = Display()


class ActionModule(PveConnectionAction):
    def run(self, tmp=None, task_vars=None):
        args = self._task.args
        if not check_type_bool(args.get("wait_for_address", False)) or self._task.async_val:
            return super().run(tmp, task_vars)
        host = (task_vars or {}).get("inventory_hostname", "")
        progress = waiting.Progress(
            f"VM {args.get('vmid')} ({args.get('name')}) to be ready and get its address",
            check_type_int(args.get("address_timeout", 300)),
            emit=lambda text: display.display(f"{host}: {text}"),
        )
        with progress.watching():
            return super().run(tmp, task_vars)

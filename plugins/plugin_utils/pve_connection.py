"""The PVE connection of every gpulab PVE module, read from the inventory (doc fragment `pve`).

Not an action plugin itself (plugin_utils): plugins/action/<module>.py of each PVE module subclasses it, and
it runs the module in the task's worker (plugins/plugin_utils/controller.py). Before the module runs, each
`api_*` option the task leaves out is filled from the `pve_api_*` variables of the node's host
(gpulab.pve.connection.fill_from_inventory): the host of group `proxmox` whose `pve_node` (or, without
one, whose name) is the task's node (`task_node`: its `node` option; a subclass may say otherwise); for a
task without a node (lab_table) the first host of `proxmox`; when that group has no such host, the
task's own host. So a task passes only its own options.
The module's no_log hides the secrets in its result, as when a task passes them itself.
"""

from __future__ import annotations

from ansible.errors import AnsibleUndefinedVariable, AnsibleValueOmittedError
from ansible_collections.gpulab.homelab.plugins.plugin_utils.controller import (
    ActionModule as ControllerAction,
)
from ansible_collections.gpulab.homelab.plugins.plugin_utils.engine import MissingEngine

try:
    from gpulab.pve import connection
except ImportError as err:  # the engine runs here, on the controller: requirements.txt
    connection = MissingEngine(err)

GROUP = "proxmox"


class _Settings:
    """A host's variables, templated; one that is undefined or omitted reads as unset."""

    def __init__(self, hostvars):
        self.hostvars = hostvars

    def get(self, name, default=None):
        try:
            return self.hostvars.get(name, default)
        except (AnsibleUndefinedVariable, AnsibleValueOmittedError):
            return default


class ActionModule(ControllerAction):
    def task_node(self):
        """The PVE node the task acts on, None for none in particular."""
        return self._task.args.get("node")

    def node_settings(self, task_vars):
        hostvars = task_vars["hostvars"]
        node = self.task_node()
        for host in task_vars.get("groups", {}).get(GROUP, []):
            if node is None or _Settings(hostvars[host]).get("pve_node", host) == node:
                return _Settings(hostvars[host])
        return _Settings(hostvars[task_vars["inventory_hostname"]])

    def module_args(self, task_vars):
        return connection.fill_from_inventory(self._task.args, self.node_settings(task_vars))

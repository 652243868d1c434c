"""pve_pci_mapping runs with the PVE connection from the inventory, that of the node of its first
entry (plugins/plugin_utils/pve_connection.py)."""

from ansible_collections.gpulab.homelab.plugins.plugin_utils.pve_connection import (
    ActionModule as PveConnectionAction,
)


class ActionModule(PveConnectionAction):
    def task_node(self):
        entries = self._task.args.get("entries") or []
        return entries[0].get("node") if entries else None

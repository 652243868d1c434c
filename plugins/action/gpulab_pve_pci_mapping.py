"""gpulab_pve_pci_mapping runs with the PVE connection from the inventory, that of the node of its first
entry (plugins/action/gpulab_pve_connection.py)."""

from ansible.plugins.loader import action_loader


class ActionModule(action_loader.get("gpulab_pve_connection", class_only=True)):
    def task_node(self):
        entries = self._task.args.get("entries") or []
        return entries[0].get("node") if entries else None

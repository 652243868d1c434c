"""gpulab_pve_pci_mapping runs with the PVE connection from the inventory (plugins/action/gpulab_pve_connection.py)."""

from ansible.plugins.loader import action_loader


class ActionModule(action_loader.get("gpulab_pve_connection", class_only=True)):
    pass

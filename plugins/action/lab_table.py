"""lab_table runs with the PVE connection from the inventory (plugins/plugin_utils/pve_connection.py)."""

from ansible_collections.gpulab.homelab.plugins.plugin_utils.pve_connection import (
    ActionModule as PveConnectionAction,
)


class ActionModule(PveConnectionAction):
    pass

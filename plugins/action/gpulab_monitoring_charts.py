"""gpulab_monitoring_charts runs in the task's worker on the controller (plugins/plugin_utils/gpulab_controller.py)."""

from ansible_collections.gpulab.homelab.plugins.plugin_utils.gpulab_controller import (
    ActionModule as ControllerAction,
)


class ActionModule(ControllerAction):
    pass

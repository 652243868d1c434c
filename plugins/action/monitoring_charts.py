"""monitoring_charts runs in the task's worker on the controller (plugins/plugin_utils/controller.py)."""

from ansible_collections.gpulab.homelab.plugins.plugin_utils.controller import (
    ActionModule as ControllerAction,
)


class ActionModule(ControllerAction):
    pass

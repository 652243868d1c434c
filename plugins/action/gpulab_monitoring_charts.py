"""gpulab_monitoring_charts runs in the task's worker on the controller (plugins/action/gpulab_controller.py)."""

from ansible.plugins.loader import action_loader


class ActionModule(action_loader.get("gpulab_controller", class_only=True)):
    pass

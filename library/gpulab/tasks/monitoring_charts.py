"""monitoring_charts: check the Prometheus and Grafana chart values against their pinned versions and render
both k3s HelmCharts."""

from __future__ import annotations

from gpulab import monitoring
from gpulab.tasks import Run, Task

OPTIONS = {
    "prometheus_version": {"type": "str", "required": True},
    "grafana_version": {"type": "str", "required": True},
    "hami_version": {"type": "str", "required": True},
    "server": {"type": "str", "required": True},
    "gpu_nodes": {"type": "list", "elements": "str", "required": True},
    "namespace": {"type": "str", "default": "monitoring"},
    "prometheus_node_port": {"type": "int", "default": 30090},
    "grafana_node_port": {"type": "int", "default": 30300},
    "scrape_interval": {"type": "str", "default": "15s"},
    "image_registry": {"type": "str", "default": ""},
    "dashboard": {"type": "str", "default": ""},
    "prometheus_repo": {"type": "str", "default": monitoring.PROMETHEUS_REPO},
    "grafana_repo": {"type": "str", "default": monitoring.GRAFANA_REPO},
    "prometheus_extra_values": {"type": "dict", "default": {}},
    "grafana_extra_values": {"type": "dict", "default": {}},
    "webui": {"type": "bool", "default": False},
    "webui_version": {"type": "str", "default": "1.2.0"},
    "webui_repo": {"type": "str", "default": monitoring.WEBUI_REPO},
    "webui_extra_values": {"type": "dict", "default": {}},
}


def run(task: Task) -> dict:
    p = task.params
    with Run(
        task, "Rendering the Prometheus, Grafana (and HAMi-WebUI) HelmCharts", monitoring.MonitoringError
    ) as run:
        out = monitoring.render(**{name: p[name] for name in OPTIONS})
    return run.done(**out)

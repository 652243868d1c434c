"""monitoring_charts: check the Prometheus and Grafana chart values against their pinned versions and render
both k3s HelmCharts."""

from __future__ import annotations

from gpulab import monitoring
from gpulab.tasks import Run, Task


def run(task: Task) -> dict:
    p = task.params
    with Run(
        task, "Rendering the Prometheus, Grafana (and HAMi-WebUI) HelmCharts", monitoring.MonitoringError
    ) as run:
        # every option of the module (plugins/modules/monitoring_charts.py) is an argument of the render
        out = monitoring.render(**p)
    return run.done(**out)

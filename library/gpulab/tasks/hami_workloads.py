"""hami_workloads: plan the pinned GPU engines (manifests, start order) from the lab's cards."""

from __future__ import annotations

from gpulab.k8s import workloads
from gpulab.k8s.validate import ManifestError
from gpulab.tasks import Run, Task


def run(task: Task) -> dict:
    p = task.params
    with Run(task, "Planning the GPU engines", workloads.PlanError, ManifestError) as run:
        result = workloads.plan(
            p["engines"],
            p["gpus_by_node"],
            k3s_version=p["k3s_version"],
            wait_image=p["wait_image"],
            addresses=p.get("addresses"),
        )
    return run.done(**result)

"""pve_info: what a PVE node holds (version, storages, PCI devices, mappings, VMs...)."""

from __future__ import annotations

from gpulab.pve import info
from gpulab.tasks import Run, Task


def run(task: Task) -> dict:
    p = task.params
    with Run(task, f"Reading node {p['node']}") as run:
        facts = info.gather(run.connect(), p["node"], p["gather"])
    return run.done(**facts)

"""pve_info: what a PVE node holds (version, storages, PCI devices, mappings, VMs...)."""

from __future__ import annotations

from gpulab.pve import info
from gpulab.tasks import Run, Task

PVE = True
OPTIONS = {
    "node": {"type": "str", "required": True},
    # the engine's sections (nics, a read per VM, only when asked for)
    "gather": {
        "type": "list",
        "elements": "str",
        "choices": list(info.SECTIONS),
        "default": list(info.DEFAULT_SECTIONS),
    },
}


def run(task: Task) -> dict:
    p = task.params
    with Run(task, f"Reading node {p['node']}") as run:
        facts = info.gather(run.connect(), p["node"], p["gather"])
    return run.done(**facts)

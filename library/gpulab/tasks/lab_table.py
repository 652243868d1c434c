"""lab_table: the end-of-run lab table, from the VMs' configs that PVE reports."""

from __future__ import annotations

from gpulab import labtable
from gpulab.tasks import Run, Task


def run(task: Task) -> dict:
    p = task.params
    with Run(task, "Reading the VMs for the lab table") as run:
        pve = labtable.read_vm_configs(run.connect(), p["vms"])
    table = labtable.rows(
        p["vms"],
        pve,
        p["gpus"],
        p["k8s_nodes"],
        p["k8s_pods"],
        kube_context=p["kube_context"],
        endpoints=p["endpoints"],
        links=p["links"],
    )
    run.result.update(rows=table, lines=labtable.text(table), markdown=labtable.markdown(table))
    if p["state_dir"]:
        changed, paths = labtable.write(p["state_dir"], table, dry_run=task.check_mode, links=p["links"])
        run.result.update(changed=changed, files=[str(f) for f in paths])
    return run.done()

"""pve_pci_mapping: a cluster-wide PCI resource mapping, entry by entry."""

from __future__ import annotations

from gpulab.pve import mapping
from gpulab.tasks import Run, Task


def run(task: Task) -> dict:
    p = task.params
    result = {"id": p["id"], "mapping": None}
    with Run(task, f"PCI mapping {p['id']}", mapping.MappingError, result=result) as run:
        res = mapping.ensure_pci_mapping(
            run.connect(),
            mapping_id=p["id"],
            entries=p["entries"],
            description=p["description"],
            state=p["state"],
            check_mode=task.check_mode,
        )
        result.update(changed=res.changed, mapping=res.after)
        if task.diff:
            result["diff"] = {"before": res.before or {}, "after": res.after or {}}
    return run.done()

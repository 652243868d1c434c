"""hami_values: check HAMi chart values against the pinned chart version and render the k3s HelmChart."""

from __future__ import annotations

from gpulab import hami
from gpulab.tasks import Run, Task


def run(task: Task) -> dict:
    p = task.params
    # every option of the module (plugins/modules/hami_values.py) is an argument of the engine's render
    own = dict(p)
    if own["device_memory_scaling"] == int(own["device_memory_scaling"]):
        own["device_memory_scaling"] = int(own["device_memory_scaling"])  # 1, not 1.0, in the chart values
    with Run(task, f"Rendering the HAMi HelmChart {p['name']}", hami.ValuesError) as run:
        values, manifest = hami.render(**own)
    return run.done(
        values=values,
        values_content=hami.values_content(values),
        manifest=manifest,
        keys_known=len(hami.load_keys(p["chart_version"])["keys"]),
    )

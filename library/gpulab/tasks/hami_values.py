"""hami_values: check HAMi chart values against the pinned chart version and render the k3s HelmChart."""

from __future__ import annotations

from gpulab import hami
from gpulab.tasks import Run, Task

OPTIONS = {
    "chart_version": {"type": "str", "required": True},
    "device_split_count": {"type": "int", "default": 10},
    "device_memory_scaling": {"type": "float", "default": 1},
    "runtime_class_name": {"type": "str", "default": "nvidia"},
    "node_selector": {"type": "dict", "default": {"gpu": "on"}},
    "kube_scheduler_image": {
        "type": "dict",
        "default": {},
        "options": {
            "registry": {"type": "str"},
            "repository": {"type": "str"},
            "tag": {"type": "str"},
        },
    },
    "image_registry": {"type": "str", "default": ""},
    "kube_version": {"type": "str", "default": ""},
    "extra_values": {"type": "dict", "default": {}},
    "name": {"type": "str", "default": "hami"},
    "namespace": {"type": "str", "default": "kube-system"},
    "repo": {"type": "str", "default": "https://project-hami.github.io/HAMi/"},
    "timeout": {"type": "str", "default": "10m0s"},
}


def run(task: Task) -> dict:
    p = task.params
    # every option of the module is an argument of the engine's render
    own = {name: p[name] for name in OPTIONS}
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

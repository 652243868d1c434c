"""Preflight's check of the HAMi chart values against the pinned chart version's key facts.

Helm ignores a values key the chart does not use, so `hami_extra_values` with a key that `hami_chart_version`
lacks (a key of another version, a typo) would install a chart that quietly does something else: refused here,
before any change, with the closest key of that version.
"""

from __future__ import annotations

from typing import Any

from gpulab import hami
from gpulab.labdef.definition import LabDefinition
from gpulab.labdef.problems import Problem


def check_hami_values(d: LabDefinition, out: list[Problem]) -> None:
    version = d.globals.get("hami_chart_version")
    extra = d.globals.get("hami_extra_values") or {}
    if not isinstance(version, str) or not hami.facts_path(version).is_file() or not isinstance(extra, dict):
        return  # the rules table reports an unknown version or a value that is not a map
    facts = hami.load_keys(version)
    for problem in hami.check_values(extra, facts):
        key, _, why = problem.partition(": ")
        out.append(
            Problem(
                "all",
                "hami_extra_values",
                key,
                why,
                f"use a key of HAMi chart {version} (its values.yaml; gpulab's key facts in "
                f"library/gpulab/data/hami-{version}-keys.json), or pin the chart version that has it "
                f"(known: {', '.join(hami.known_versions())})",
            )
        )


def image_lines(d: LabDefinition) -> list[str]:
    """Where each image of the HAMi chart comes from (the plan's lines)."""
    version = d.globals.get("hami_chart_version")
    if not isinstance(version, str) or not hami.facts_path(version).is_file():
        return []
    facts = hami.load_keys(version)
    extra: Any = d.globals.get("hami_extra_values") or {}
    extra_image = ((extra.get("scheduler") or {}).get("kubeScheduler") or {}).get("image") or {}
    # the role's default (roles/hami/defaults), or the inventory's hami_kube_scheduler_image
    own = next(
        (v["hami_kube_scheduler_image"] for v in d.other_vars.values() if v.get("hami_kube_scheduler_image")),
        {},
    )
    scheduler = {"registry": "registry.k8s.io", "repository": "kube-scheduler", **own, **extra_image}
    registry = d.globals.get("hami_image_registry") or (
        (extra.get("global") or {}).get("imageRegistry") or ""
    )
    images = hami.chart_images(
        facts,
        kube_version=str(d.globals.get("k3s_version") or ""),
        image_registry=registry,
        kube_scheduler_image=scheduler,
    )
    where = f"registry {registry} (hami_image_registry) for all" if registry else "each image's own registry"
    return [f"  images ({where}):"] + [f"    {what}: {image}" for what, image in images]

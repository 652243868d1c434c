"""Preflight's check of Open WebUI (role workloads, `workloads_open_webui`) before any change.

Helm ignores a values key the chart does not use, so `workloads_open_webui_extra_values` with a key the pinned
`open-webui` chart lacks would install a front end that quietly does something else: refused here with the
closest key of that version (the stage checks them again when it renders the chart). Open WebUI talks to the
engines on the LAN, so it needs one; its address is checked with the engines' (gpulab.labdef.checks.check_lan).
"""

from __future__ import annotations

from typing import Any

from gpulab import hami
from gpulab.k8s import open_webui
from gpulab.labdef.definition import LabDefinition
from gpulab.labdef.problems import Problem


def true(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("true", "yes", "on", "1")


def first_set(d: LabDefinition, name: str) -> Any:
    """A role variable as the first host that sets it has it (group_vars/all: every host), else None."""
    return next((v[name] for v in d.other_vars.values() if v.get(name) not in (None, "")), None)


def check_open_webui_values(d: LabDefinition, out: list[Problem]) -> None:
    if not true(first_set(d, "workloads_open_webui")):
        return
    engines = d.globals.get("workloads_engines") or []
    if isinstance(engines, list) and not any(isinstance(e, dict) and e.get("lan") is True for e in engines):
        out.append(
            Problem("all", "workloads_open_webui", True,
                    "no engine of workloads_engines is on the LAN: Open WebUI talks to the engines with lan: true",
                    "mark an engine lan: true, or set workloads_open_webui: false")
        )  # fmt: skip
    version = str(first_set(d, "workloads_open_webui_chart_version") or open_webui.VERSION)
    if not open_webui.facts_path(version).is_file():
        out.append(
            Problem("all", "workloads_open_webui_chart_version", version,
                    f"gpulab holds no key facts for the {open_webui.CHART} chart {version}",
                    f"pin {open_webui.VERSION}, or add library/gpulab/data/{open_webui.CHART}-{version}-keys.json "
                    "(python -m gpulab.k8s.open_webui)")
        )  # fmt: skip
        return
    extra = first_set(d, "workloads_open_webui_extra_values")
    if not isinstance(extra, dict) or not extra:
        return
    for problem in hami.check_values(extra, open_webui.load_keys(version)):
        key, _, why = problem.partition(": ")
        out.append(
            Problem("all", "workloads_open_webui_extra_values", key, why,
                    f"use a key of the {open_webui.CHART} chart {version} (its values.yaml; gpulab's key facts in "
                    f"library/gpulab/data/{open_webui.CHART}-{version}-keys.json)")
        )  # fmt: skip

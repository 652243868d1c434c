"""Preflight's check of stage monitoring's chart values against the pinned chart versions' key facts.

Helm ignores a values key the chart does not use, so `monitoring_prometheus_extra_values` or
`monitoring_grafana_extra_values` with a key the pinned chart lacks would install a chart that quietly does something
else: refused here, before any change, with the closest key of that version (the stage checks them again when it
renders the charts).
"""

from __future__ import annotations

from gpulab import hami, monitoring
from gpulab.labdef.definition import LabDefinition
from gpulab.labdef.problems import Problem

#: (chart, its extra values variable, its version variable, the role's default version: roles/monitoring/defaults)
CHECKED = (
    (
        monitoring.PROMETHEUS,
        "monitoring_prometheus_extra_values",
        "monitoring_prometheus_chart_version",
        "29.27.0",
    ),
    (monitoring.GRAFANA, "monitoring_grafana_extra_values", "monitoring_grafana_chart_version", "12.11.1"),
)


def check_monitoring_values(d: LabDefinition, out: list[Problem]) -> None:
    for host, values in d.other_vars.items():
        for chart, var, version_var, default in CHECKED:
            extra = values.get(var)
            if not isinstance(extra, dict) or not extra:
                continue
            version = str(values.get(version_var) or default)
            if not monitoring.facts_path(chart, version).is_file():
                out.append(
                    Problem(host, version_var, version, f"gpulab holds no key facts for the {chart} chart {version}",
                            f"pin {default}, or add library/gpulab/data/{chart}-{version}-keys.json "
                            "(python -m gpulab.monitoring)")
                )  # fmt: skip
                continue
            for problem in hami.check_values(extra, monitoring.load_keys(chart, version)):
                key, _, why = problem.partition(": ")
                out.append(
                    Problem(host, var, key, why,
                            f"use a key of the {chart} chart {version} (its values.yaml; gpulab's key facts in "
                            f"library/gpulab/data/{chart}-{version}-keys.json)")
                )  # fmt: skip

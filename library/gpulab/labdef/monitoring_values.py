"""Preflight's check of stage monitoring's chart values against the pinned chart versions' key facts.

Helm ignores a values key the chart does not use, so `monitoring_prometheus_extra_values` or
`monitoring_grafana_extra_values` with a key the pinned chart lacks would install a chart that quietly does something
else: refused here, before any change, with the closest key of that version (the stage checks them again when it
renders the charts).

With `monitoring_webui: true`, HAMi-WebUI's chart must fit the HAMi chart: the pinned `monitoring_webui_chart_version`
must be one gpulab knows, and `hami_chart_version` at least the HAMi version whose metric names it reads (WebUI 1.1.1
and later read the names HAMi 2.9.0 renamed; gpulab.monitoring.WEBUI_VERSIONS).
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
    (monitoring.WEBUI, "monitoring_webui_extra_values", "monitoring_webui_chart_version", "1.2.0"),
)
#: the role's defaults (roles/monitoring/defaults) and role hami's HAMi chart version
WEBUI_DEFAULT = "1.2.0"
HAMI_DEFAULT = "2.10.0"


def _true(value) -> bool:
    return value is True or str(value).strip().lower() in ("true", "yes", "on", "1")


def check_webui(d: LabDefinition, out: list[Problem]) -> None:
    """monitoring_webui: true with a HAMi-WebUI chart that gpulab does not know or that needs a newer HAMi."""
    hami_version = str(d.globals.get("hami_chart_version") or HAMI_DEFAULT)
    for host, values in d.other_vars.items():
        if not _true(values.get("monitoring_webui")):
            continue
        version = str(values.get("monitoring_webui_chart_version") or WEBUI_DEFAULT)
        why = monitoring.webui_mismatch(version, hami_version)
        if why:
            out.append(
                Problem(host, "monitoring_webui_chart_version", version,
                        f"with hami_chart_version={hami_version!r}: {why}",
                        f"pin a HAMi-WebUI chart that fits HAMi {hami_version} (gpulab knows "
                        f"{', '.join(sorted(monitoring.WEBUI_VERSIONS))}, for HAMi 2.9.0 and later), raise "
                        "hami_chart_version, or set monitoring_webui: false")
            )  # fmt: skip


def check_monitoring_values(d: LabDefinition, out: list[Problem]) -> None:
    check_webui(d, out)
    for host, values in d.other_vars.items():
        for chart, var, version_var, default in CHECKED:
            extra = values.get(var)
            if not isinstance(extra, dict) or not extra:
                continue
            version = str(values.get(version_var) or default)
            if not hami.chart_facts_path(chart, version).is_file():
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

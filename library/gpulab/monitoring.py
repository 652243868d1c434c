"""Stage monitoring: Prometheus scraping HAMi's two metrics endpoints and Grafana showing HAMi's dashboard, each a
pinned chart installed through k3s's HelmChart controller, and the proof that Prometheus sees what HAMi's scheduler
holds.

* Charts: ``prometheus`` of prometheus-community (https://prometheus-community.github.io/helm-charts) and
  ``grafana`` of grafana-community (https://grafana-community.github.io/helm-charts, where the chart moved from
  grafana/helm-charts in January 2026). Helm ignores a values key a chart does not use, so every key gpulab sets or
  the user adds is checked against the key facts of the pinned version (``gpulab/data/<chart>-<version>-keys.json``,
  made from that version's values.yaml by ``python -m gpulab.monitoring``), the way gpulab.hami checks HAMi's.
* Scraping: HAMi's chart exposes the scheduler's metrics (``:9395``) as NodePort 31993 of Service
  ``hami-scheduler`` and the device plugin's vGPU monitor (``:9394``) as NodePort 31992 of Service
  ``hami-device-plugin-monitor`` (charts/hami/templates at v2.10.0). Prometheus scrapes them as static targets:
  the scheduler through the first k3s server's address, the monitor through each GPU node's address. These jobs need
  no Kubernetes service discovery, so they work the same on a homelab and in gpulab's simulated lab. A NodePort
  is answered by any pod of its Service: with more than one GPU node a scrape of one node's 31992 may reach
  another node's monitor (kube-proxy spreads it); the scheduler's metrics, which the proof and the allocation
  panels use, are one pod's.
* Grafana: a Prometheus data source pointing at the Prometheus server's Service, and HAMi's dashboard
  (dashboards/hami-vgpu-dashboard.json of the HAMi repository at the tag of the pinned HAMi chart) downloaded
  by the Grafana chart's own init container from that URL at install time: gpulab keeps only the dashboard's
  queries (``hami-<version>-dashboard-queries.json``, with its provenance), to prove them against a real
  Prometheus in its tests; the dashboard itself is never copied into the project.
* The proof (:func:`problems`): both HAMi jobs have every target up, and ``hami_gpu_memory_allocated_bytes``
  returns for each card HAMi registered the memory that the pods' ``hami.io/vgpu-devices-allocated`` annotations
  (written by HAMi's scheduler) hold on it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from importlib import resources
from typing import Any

import yaml

from gpulab import hami
from gpulab.k8s.hami_checks import card_usage

PROMETHEUS = "prometheus"
GRAFANA = "grafana"
PROMETHEUS_REPO = "https://prometheus-community.github.io/helm-charts"
GRAFANA_REPO = "https://grafana-community.github.io/helm-charts"
WEBUI = "hami-webui"
WEBUI_REPO = "https://project-hami.github.io/HAMi-WebUI"
#: HAMi-WebUI chart version -> its appVersion, the tag of its two images, and the lowest HAMi chart version whose
#: metrics it reads. charts/hami-webui/Chart.yaml at tag hami-webui-1.2.0 says appVersion 1.2.0, but its values.yaml
#: sets both image tags to `main` (a moving tag); the project's CI (.github/workflows/ci.yaml at tag v1.2.0) pushes
#: the images of a release under the Git tag's name, v1.2.0 (commit f60dbed, "default image tags match CI/Docker
#: Hub"). docs/installation/helm/index.md at hami-webui-1.2.0: WebUI v1.1.1 and later read the metric and label names
#: HAMi renamed in 2.9.0, so they need HAMi >= 2.9.0 (older WebUIs need HAMi < 2.9.0).
WEBUI_VERSIONS = {"1.2.0": {"app_version": "1.2.0", "image_tag": "v1.2.0", "min_hami": "2.9.0"}}
#: the container port of the WebUI's frontend (Service port `http`) and of its backend's metrics (port `metrics`),
#: charts/hami-webui/templates/service.yaml and deployment.yaml at tag hami-webui-1.2.0
WEBUI_HTTP_PORT = 3000
WEBUI_METRICS_PORT = 8000
WEBUI_JOB = "hami-webui"
#: HAMi's metrics NodePorts (charts/hami/values.yaml@v2.10.0: scheduler.service.monitorPort, devicePlugin.service.httpPort)
SCHEDULER_PORT = 31993
MONITOR_PORT = 31992
#: the scrape jobs gpulab adds to the Prometheus chart's scrapeConfigs
SCHEDULER_JOB = "hami-scheduler"
MONITOR_JOB = "hami-device-plugin"
#: the query of the proof: per card, the memory HAMi's scheduler allocated (cmd/scheduler/metrics.go@v2.10.0)
ALLOCATED_QUERY = "hami_gpu_memory_allocated_bytes"
MIB = 1024 * 1024

# Per chart: the maps whose keys are the user's own (everything beneath them is accepted), keys its templates read
# that values.yaml only mentions in comments, and the images it runs.
CHARTS = {
    PROMETHEUS: {
        "open": frozenset(
            {
                *hami.OPEN_MAP_NAMES,
                "scrapeConfigs",
                "serverFiles",
                "ruleFiles",
                "global",
                "alertmanager",
                "kube-state-metrics",
                "prometheus-node-exporter",
                "prometheus-pushgateway",
                "extraArgs",
                "env",
            }
        ),
        # templates/service.yaml reads server.service.nodePort (values.yaml only shows it commented out)
        "template_only": {"server.service.nodePort": "int"},
        "images": (
            ("server.image", "Prometheus server"),
            ("configmapReload.prometheus.image", "config reloader (Prometheus server)"),
        ),
    },
    GRAFANA: {
        "open": frozenset(
            {
                *hami.OPEN_MAP_NAMES,
                "datasources",
                "dashboardProviders",
                "dashboards",
                "dashboardsConfigMaps",
                "grafana.ini",
                "env",
                "alerting",
                "notifiers",
            }
        ),
        # templates/service.yaml reads service.nodePort, _config.tpl adminPassword (both commented in values.yaml)
        "template_only": {"service.nodePort": "int", "adminPassword": "str"},
        "images": (
            ("image", "Grafana"),
            ("downloadDashboardsImage", "dashboard download (Grafana init container)"),
            ("initChownData.image", "data folder owner (Grafana init container)"),
            ("sidecar.image", "dashboard sidecar (Grafana)"),
        ),
    },
    WEBUI: {
        # dcgm-exporter and kube-prometheus-stack are bundled charts: their keys are theirs, not this chart's
        "open": frozenset(
            {*hami.OPEN_MAP_NAMES, "vendorNodeSelectors", "env", "dcgm-exporter", "kube-prometheus-stack"}
        ),
        "template_only": {},
        "images": (("image.frontend", "HAMi-WebUI frontend"), ("image.backend", "HAMi-WebUI backend")),
    },
}


class MonitoringError(ValueError):
    """The monitoring stage's values do not fit the pinned charts."""


def load_keys(chart: str, version: str) -> dict[str, Any]:
    return hami.load_chart_keys(
        chart,
        version,
        generate=f"gpulab.monitoring <values.yaml of {chart} {version}> {chart} {version}",
        error=MonitoringError,
        otherwise=", or pin a version gpulab knows",
    )


def keys_from_values(values: Mapping[str, Any], chart: str, version: str, source: str = "") -> dict[str, Any]:
    spec = CHARTS[chart]
    return hami.keys_from_values(
        values,
        version,
        source,
        chart=chart,
        open_names=spec["open"],
        template_only=spec["template_only"],
        images=spec["images"],
    )


def dashboard_url(hami_version: str) -> str:
    """HAMi's Grafana dashboard at the tag of HAMi chart `hami_version` (the chart and the tag share it)."""
    return f"https://raw.githubusercontent.com/Project-HAMi/HAMi/v{hami_version}/dashboards/hami-vgpu-dashboard.json"


def dashboard_queries(hami_version: str) -> dict[str, Any]:
    """The PromQL queries of HAMi's dashboard at that tag, as gpulab keeps them (queries and variables only)."""
    path = resources.files("gpulab").joinpath("data", f"hami-{hami_version}-dashboard-queries.json")
    if not path.is_file():
        raise MonitoringError(f"No dashboard queries for HAMi {hami_version} in the gpulab package")
    return json.loads(path.read_text())


def queries_from_dashboard(doc: Mapping[str, Any], hami_version: str, source: str = "") -> dict[str, Any]:
    """What gpulab keeps of HAMi's dashboard (`doc`, the parsed JSON): its uid and title, its template variables
    (name, type, query) and each panel's PromQL expression with the panel's title; no layout or other text."""

    def exprs(node, title=""):
        if isinstance(node, dict):
            title = node.get("title", title) if "panels" in node or "targets" in node else title
            if isinstance(node.get("expr"), str):
                yield {"panel": title, "expr": node["expr"]}
            for value in node.values():
                yield from exprs(value, title)
        elif isinstance(node, list):
            for value in node:
                yield from exprs(value, title)

    variables = []
    for var in (doc.get("templating") or {}).get("list") or []:
        query = var.get("query")
        variables.append(
            {"name": var.get("name"), "type": var.get("type"),
             "query": query.get("query") if isinstance(query, dict) else query}
        )  # fmt: skip
    return {
        "hami_version": hami_version,
        "source": source,
        "uid": doc.get("uid"),
        "title": doc.get("title"),
        "variables": variables,
        "queries": list(exprs(doc.get("panels") or [])),
    }


def _repository(registry: str, repository: str) -> str:
    """`repository` (which may start with its registry, as quay.io/prometheus/prometheus) from `registry`."""
    first, _, rest = repository.partition("/")
    if rest and ("." in first or ":" in first):
        repository = rest
    return f"{registry.rstrip('/')}/{repository}"


def scrape_targets(server: str, gpu_nodes: list[str]) -> dict[str, list[str]]:
    """The static targets of the two HAMi jobs: the scheduler through the server's address, the vGPU monitor
    through each GPU node's."""
    if not server:
        raise MonitoringError(
            "monitoring: no k3s server address to scrape HAMi's scheduler at (NodePort 31993)"
        )
    if not gpu_nodes:
        raise MonitoringError("monitoring: no GPU node to scrape HAMi's vGPU monitor at (NodePort 31992)")
    return {
        SCHEDULER_JOB: [f"{server}:{SCHEDULER_PORT}"],
        MONITOR_JOB: [f"{address}:{MONITOR_PORT}" for address in gpu_nodes],
    }


def _seconds(duration: str) -> float:
    """A Prometheus duration such as 15s, 1m or 1m30s in seconds."""
    import re

    parts = re.findall(r"(\d+)(ms|s|m|h)", str(duration))
    if not parts or "".join(n + u for n, u in parts) != str(duration):
        raise MonitoringError(
            f"monitoring_scrape_interval: {duration!r} is not a Prometheus duration (e.g. 15s, 1m)"
        )
    return sum(int(n) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[u] for n, u in parts)


def _timeout(interval: str) -> str:
    """The scrape timeout: the chart's 10s, or the interval when that is shorter."""
    return interval if _seconds(interval) < 10 else "10s"


def prometheus_values(
    *,
    targets: Mapping[str, list[str]],
    node_port: int,
    scrape_interval: str = "15s",
    image_registry: str = "",
    facts: Mapping[str, Any] | None = None,
    extra_values: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The Prometheus chart's values: the server alone (alertmanager, pushgateway, node exporter and
    kube-state-metrics off), its Service a NodePort, HAMi's two jobs beside the chart's own."""
    values: dict[str, Any] = {
        "alertmanager": {"enabled": False},
        "kube-state-metrics": {"enabled": False},
        "prometheus-node-exporter": {"enabled": False},
        "prometheus-pushgateway": {"enabled": False},
        "server": {
            # the chart's scrape_timeout (10s) above the interval makes Prometheus refuse its config
            "global": {"scrape_interval": scrape_interval, "scrape_timeout": _timeout(scrape_interval)},
            "service": {"type": "NodePort", "nodePort": int(node_port)},
        },
        "scrapeConfigs": {
            job: {"enabled": True, "job_name": job, "static_configs": [{"targets": list(addresses)}]}
            for job, addresses in targets.items()
        },
    }
    if image_registry:
        # the chart has no global registry: each image's repository names its registry (quay.io/...)
        for path, _what in CHARTS[PROMETHEUS]["images"]:
            repository = ((facts or {}).get("images", {}).get(path) or {}).get("repository")
            if repository:
                node = values
                for part in path.split("."):
                    node = node.setdefault(part, {})
                node["repository"] = _repository(image_registry, repository)
    return hami.deep_merge(values, dict(extra_values or {}))


def grafana_values(
    *,
    prometheus_url: str,
    node_port: int,
    dashboard: str,
    image_registry: str = "",
    extra_values: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The Grafana chart's values: its Service a NodePort, Prometheus as the default data source, HAMi's dashboard
    downloaded from `dashboard` into a file provider. The admin password is the chart's (a random one in Secret
    `grafana`): gpulab never sets or prints it."""
    values: dict[str, Any] = {
        "service": {"type": "NodePort", "nodePort": int(node_port)},
        "datasources": {
            "datasources.yaml": {
                "apiVersion": 1,
                "datasources": [
                    {
                        "name": "Prometheus",
                        "type": "prometheus",
                        "uid": "prometheus",
                        "url": prometheus_url,
                        "access": "proxy",
                        "isDefault": True,
                    }
                ],
            }
        },
        "dashboardProviders": {
            "dashboardproviders.yaml": {
                "apiVersion": 1,
                "providers": [
                    {
                        "name": "hami",
                        "orgId": 1,
                        "folder": "HAMi",
                        "type": "file",
                        "disableDeletion": True,
                        "editable": False,
                        "options": {"path": "/var/lib/grafana/dashboards/hami"},
                    }
                ],
            }
        },
        "dashboards": {"hami": {"hami-vgpu": {"url": dashboard, "curlOptions": "-sLf"}}},
    }
    if image_registry:
        values["global"] = {"imageRegistry": image_registry}
    return hami.deep_merge(values, dict(extra_values or {}))


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for part in str(version).lstrip("v").split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def webui_mismatch(webui_version: str, hami_version: str) -> str:
    """Why HAMi-WebUI chart `webui_version` does not fit HAMi chart `hami_version` ('' when it does): gpulab must
    know the WebUI version (WEBUI_VERSIONS) and the HAMi version must be at least the one whose metrics it reads."""
    spec = WEBUI_VERSIONS.get(str(webui_version))
    if spec is None:
        return (
            f"gpulab knows no HAMi-WebUI chart {webui_version} (known: {', '.join(sorted(WEBUI_VERSIONS))}): its image "
            "tag and the HAMi versions it fits are not recorded"
        )
    if _version_tuple(hami_version) < _version_tuple(spec["min_hami"]):
        return (
            f"HAMi-WebUI chart {webui_version} reads the metric names HAMi renamed in {spec['min_hami']}, so it needs "
            f"HAMi chart {spec['min_hami']} or later; hami_chart_version is {hami_version}, where its pages stay empty"
        )
    return ""


def webui_values(
    *,
    version: str,
    prometheus_url: str,
    image_registry: str = "",
    facts: Mapping[str, Any] | None = None,
    extra_values: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The HAMi-WebUI chart's values for this cluster's plain Prometheus (no Prometheus Operator):

    * both ServiceMonitors off (``serviceMonitor``, ``hamiServiceMonitor``: kind ServiceMonitor needs the Operator's
      CRDs, without which Helm's install fails); Prometheus scrapes the WebUI's backend through a static job
      instead (:func:`webui_scrape_target`), and HAMi's endpoints through gpulab's two jobs;
    * the bundled ``dcgm-exporter`` chart off (it is on by default and brings a ServiceMonitor of its own; its
      DaemonSet also needs DCGM on the GPU node) and ``kube-prometheus-stack`` off (gpulab's Prometheus is used:
      ``externalPrometheus`` points the backend's config.yaml at the Prometheus server's Service);
    * the Service a NodePort (the chart has no value for the port number: Kubernetes assigns it, and the stage
      reads it from the Service);
    * both images at the release's tag instead of the chart's ``main``, from `image_registry` when set (the chart
      has no registry value: the repository then names it)."""
    spec = WEBUI_VERSIONS[str(version)]
    values: dict[str, Any] = {
        "serviceMonitor": {"enabled": False},
        "hamiServiceMonitor": {"enabled": False},
        "dcgm-exporter": {"enabled": False},
        "kube-prometheus-stack": {"enabled": False},
        "externalPrometheus": {"enabled": True, "address": prometheus_url},
        "service": {"type": "NodePort"},
        "image": {},
    }
    for path, _what in CHARTS[WEBUI]["images"]:
        part = path.split(".", 1)[1]
        repository = ((facts or {}).get("images", {}).get(path) or {}).get("repository") or ""
        image = {"tag": spec["image_tag"]}
        if image_registry and repository:
            image["repository"] = _repository(image_registry, repository)
        values["image"][part] = image
    return hami.deep_merge(values, dict(extra_values or {}))


def webui_fullname(release: str = WEBUI) -> str:
    """The chart's fullname (templates/_helpers.tpl hami-webui.fullname at tag hami-webui-1.2.0): the release name
    when it contains the chart's name, else <release>-hami-webui; the name of its Deployment and Service."""
    return release if WEBUI in release else f"{release}-{WEBUI}"


def webui_scrape_target(namespace: str, release: str = WEBUI) -> str:
    """Where Prometheus scrapes the WebUI backend's own metrics (Service port `metrics`, 8000), the endpoint the
    chart's ServiceMonitor would have given the Operator."""
    return f"{webui_fullname(release)}.{namespace}.svc:{WEBUI_METRICS_PORT}"


def webui_node_port(service_doc: Mapping[str, Any] | str) -> int | None:
    """The NodePort Kubernetes assigned to the WebUI Service's `http` port (kubectl get service -o json), or None."""
    if isinstance(service_doc, str):
        try:
            service_doc = json.loads(service_doc) if service_doc.strip() else {}
        except ValueError:
            return None
    for port in ((service_doc or {}).get("spec") or {}).get("ports") or []:
        if port.get("name") == "http" and port.get("nodePort"):
            return int(port["nodePort"])
    return None


def render(
    *,
    prometheus_version: str,
    grafana_version: str,
    hami_version: str,
    server: str,
    gpu_nodes: list[str],
    namespace: str = "monitoring",
    prometheus_node_port: int = 30090,
    grafana_node_port: int = 30300,
    scrape_interval: str = "15s",
    image_registry: str = "",
    dashboard: str = "",
    prometheus_repo: str = PROMETHEUS_REPO,
    grafana_repo: str = GRAFANA_REPO,
    prometheus_extra_values: Mapping[str, Any] | None = None,
    grafana_extra_values: Mapping[str, Any] | None = None,
    webui: bool = False,
    webui_version: str = "1.2.0",
    webui_repo: str = WEBUI_REPO,
    webui_extra_values: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Both charts' values (and with `webui` HAMi-WebUI's, beside Grafana), checked against their pinned versions,
    and their HelmChart manifests; the addresses of the UIs (the WebUI's NodePort is assigned by Kubernetes, so
    its address is known once its Service exists). Raises MonitoringError naming every problem."""
    prom_facts = load_keys(PROMETHEUS, prometheus_version)
    graf_facts = load_keys(GRAFANA, grafana_version)
    if webui:
        mismatch = webui_mismatch(webui_version, hami_version)
        if mismatch:
            raise MonitoringError(
                f"monitoring_webui_chart_version = {webui_version} with hami_chart_version = {hami_version}: "
                f"{mismatch}; pin a HAMi-WebUI chart that fits the HAMi chart, or set monitoring_webui: false"
            )
    webui_facts = load_keys(WEBUI, webui_version) if webui else {}
    prom_jobs: dict[str, Any] = {}
    if webui:
        target = webui_scrape_target(namespace)
        prom_jobs = {
            "scrapeConfigs": {
                WEBUI_JOB: {"enabled": True, "job_name": WEBUI_JOB, "static_configs": [{"targets": [target]}]}
            }
        }
    prom = prometheus_values(
        targets=scrape_targets(server, gpu_nodes),
        node_port=prometheus_node_port,
        scrape_interval=scrape_interval,
        image_registry=image_registry,
        facts=prom_facts,
        extra_values=hami.deep_merge(prom_jobs, dict(prometheus_extra_values or {})),
    )
    # the Prometheus chart names its server Service <release>-server (templates/_helpers.tpl prometheus.server.fullname)
    graf = grafana_values(
        prometheus_url=f"http://{PROMETHEUS}-server.{namespace}.svc",
        node_port=grafana_node_port,
        dashboard=dashboard or dashboard_url(hami_version),
        image_registry=image_registry,
        extra_values=grafana_extra_values,
    )
    webui_vals = (
        webui_values(
            version=webui_version,
            prometheus_url=f"http://{PROMETHEUS}-server.{namespace}.svc",
            image_registry=image_registry,
            facts=webui_facts,
            extra_values=webui_extra_values,
        )
        if webui
        else None
    )
    problems = [f"{PROMETHEUS} {prometheus_version}: {p}" for p in hami.check_values(prom, prom_facts)]
    problems += [f"{GRAFANA} {grafana_version}: {p}" for p in hami.check_values(graf, graf_facts)]
    if webui_vals is not None:
        problems += [f"{WEBUI} {webui_version}: {p}" for p in hami.check_values(webui_vals, webui_facts)]
    problems += [
        f"{name}: NodePort {port} is outside Kubernetes' default range 30000-32767"
        for name, port in (("prometheus", prometheus_node_port), ("grafana", grafana_node_port))
        if not 30000 <= int(port) <= 32767
    ]
    if problems:
        raise MonitoringError(
            f"monitoring chart values refused ({len(problems)} problem(s)): " + "; ".join(problems)
        )
    labels = {"app.kubernetes.io/part-of": "gpulab-monitoring"}
    manifests = {
        PROMETHEUS: hami.dump_manifest(
            hami.helmchart(prom, chart_version=prometheus_version, name=PROMETHEUS, namespace="kube-system",
                           target_namespace=namespace, repo=prometheus_repo, chart=PROMETHEUS, labels=labels),
            header="Managed by gpulab (role monitoring): changes here are overwritten.",
        ),
        GRAFANA: hami.dump_manifest(
            hami.helmchart(graf, chart_version=grafana_version, name=GRAFANA, namespace="kube-system",
                           target_namespace=namespace, repo=grafana_repo, chart=GRAFANA, labels=labels),
            header="Managed by gpulab (role monitoring): changes here are overwritten.",
        ),
    }  # fmt: skip
    values = {PROMETHEUS: prom, GRAFANA: graf}
    if webui_vals is not None:
        values[WEBUI] = webui_vals
        manifests[WEBUI] = hami.dump_manifest(
            hami.helmchart(webui_vals, chart_version=webui_version, name=WEBUI, namespace="kube-system",
                           target_namespace=namespace, repo=webui_repo, chart=WEBUI, labels=labels),
            header="Managed by gpulab (role monitoring): changes here are overwritten.",
        )  # fmt: skip
    return {
        "values": values,
        "manifests": manifests,
        "webui": {"service": webui_fullname(), "namespace": namespace} if webui else {},
        "targets": scrape_targets(server, gpu_nodes),
        "urls": {
            "prometheus": f"http://{server}:{prometheus_node_port}",
            "grafana": f"http://{server}:{grafana_node_port}",
            "dashboard": f"http://{server}:{grafana_node_port}/d/hami-vgpu-metrics",
        },
    }


# --- the proof ---------------------------------------------------------------------------------------------------


def _problem(field: str, value: Any, cause: str, fix: str, wait: bool = True) -> dict[str, Any]:
    return {"field": field, "value": value, "cause": cause, "fix": fix, "wait": wait}


def target_problems(targets_doc: Mapping[str, Any], jobs: Mapping[str, list[str]]) -> list[dict[str, Any]]:
    """Every HAMi job of `jobs` (job -> its static targets) whose targets are not the wanted ones (Prometheus still
    runs an older config), or with a target Prometheus does not report up (/api/v1/targets: activeTargets with
    labels.job, labels.instance, health, lastError)."""
    active = ((targets_doc or {}).get("data") or {}).get("activeTargets") or []
    out = []
    for job, wanted in jobs.items():
        mine = [t for t in active if (t.get("labels") or {}).get("job") == job]
        scraped = sorted((t.get("labels") or {}).get("instance", "") for t in mine)
        if mine and wanted and scraped != sorted(wanted):
            out.append(
                _problem(f"job {job} targets", ", ".join(scraped),
                         f"Prometheus scrapes {', '.join(scraped)}, the chart's values say {', '.join(sorted(wanted))}",
                         "wait for the chart's new config to be loaded (a Helm upgrade, then the config reloader)")
            )  # fmt: skip
            continue
        if not mine:
            out.append(
                _problem(f"job {job}", "(no target)", f"Prometheus has no target for job {job}",
                         "check the Prometheus chart's scrapeConfigs (monitoring_prometheus_extra_values)")
            )  # fmt: skip
        for t in mine:
            if t.get("health") != "up":
                instance = (t.get("labels") or {}).get("instance") or t.get("scrapeUrl")
                error = t.get("lastError") or "not scraped yet"
                out.append(
                    _problem(f"job {job} target {instance}", t.get("health"), f"Prometheus cannot scrape it: {error}",
                             f"check that HAMi's {job} pod runs and that its NodePort answers from the cluster")
                )  # fmt: skip
    return out


def allocated_by_card(query_doc: Mapping[str, Any]) -> dict[str, float]:
    """device_uuid -> value of an instant query's vector result (/api/v1/query)."""
    result = ((query_doc or {}).get("data") or {}).get("result") or []
    out = {}
    for series in result:
        uuid = (series.get("metric") or {}).get("device_uuid")
        if uuid:
            out[uuid] = float((series.get("value") or [0, "nan"])[1])
    return out


def allocation_problems(
    query_doc: Mapping[str, Any], nodes_doc: Mapping[str, Any], pods_doc: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Each card HAMi registered (nodes' hami.io/node-nvidia-register) whose allocated memory in Prometheus is not
    what the pods' hami.io/vgpu-devices-allocated hold on it (in bytes, as HAMi exports MiB x 1048576)."""
    seen = allocated_by_card(query_doc)
    out = []
    for card in card_usage(nodes_doc, pods_doc):
        want = card["used_mib"] * MIB
        got = seen.get(card["uuid"])
        if got is None:
            out.append(
                _problem(f"{ALLOCATED_QUERY}{{device_uuid={card['uuid']}}}", "(no series)",
                         f"Prometheus returns nothing for card {card['uuid']} of node {card['node']}",
                         f"check that job {SCHEDULER_JOB} scrapes HAMi's scheduler (NodePort {SCHEDULER_PORT})")
            )  # fmt: skip
        elif got != want:
            out.append(
                _problem(f"{ALLOCATED_QUERY}{{device_uuid={card['uuid']}}}", int(got),
                         f"Prometheus reports {int(got)} bytes allocated on card {card['uuid']} of node "
                         f"{card['node']}, the scheduler holds {want} ({card['used_mib']} MiB for "
                         f"{len(card['pods'])} pod(s))",
                         "wait for the next scrape; if it stays, HAMi's scheduler and its pods disagree")
            )  # fmt: skip
    return out


def problems(
    look: str | Mapping[str, Any], jobs: Mapping[str, list[str]] | None = None
) -> list[dict[str, Any]]:
    """The proof's problems from one look ({"targets", "query", "nodes", "pods"}: Prometheus's /api/v1/targets
    and /api/v1/query answers, kubectl's nodes and pods), as JSON text or parsed; `jobs`: the HAMi jobs and
    their targets as rendered (scrape_targets), else both jobs with any targets."""
    if isinstance(look, str):
        try:
            look = json.loads(look) if look.strip() else {}
        except ValueError:
            return [_problem("look", look[:200], "the look is not JSON", "see the task's stderr")]
    if not look:
        return [_problem("prometheus", "(no answer)", "Prometheus did not answer", "wait for its pod")]
    jobs = jobs or {SCHEDULER_JOB: [], MONITOR_JOB: []}
    return target_problems(look.get("targets") or {}, jobs) + allocation_problems(
        look.get("query") or {}, look.get("nodes") or {}, look.get("pods") or {}
    )


def problems_text(found: list[Mapping[str, Any]]) -> str:
    return "; ".join(f"{p['field']} = {p['value']}: {p['cause']} (fix: {p['fix']})" for p in found)


def main(argv=None):
    parser = hami.facts_parser(
        "python -m gpulab.monitoring",
        "Generate the key facts file of a monitoring chart version from its values.yaml, or (chart "
        "`dashboard`) the queries file of HAMi's dashboard from its JSON.",
    )
    parser.add_argument("chart", choices=[*sorted(CHARTS), "dashboard"])
    parser.add_argument("version")
    parser.add_argument("--source", default="", help="where values.yaml comes from (repository, tag, commit)")
    args = parser.parse_args(argv)
    if args.chart == "dashboard":
        # python -m gpulab.monitoring hami-vgpu-dashboard.json dashboard <HAMi version> --source ...
        facts = queries_from_dashboard(json.loads(args.values_yaml.read_text()), args.version, args.source)
    else:
        facts = keys_from_values(
            yaml.safe_load(args.values_yaml.read_text()), args.chart, args.version, args.source
        )
    return hami.write_facts(facts, args.output)


if __name__ == "__main__":
    sys.exit(main())

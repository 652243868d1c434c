"""Open WebUI (opt-in front end of stage workloads): a chat page in front of the engines on the LAN.

* Chart: ``open-webui`` of https://helm.openwebui.com/ (source github.com/open-webui/helm-charts,
  charts/open-webui), installed through k3s's HelmChart controller beside the engines, pinned by version. Helm
  ignores a values key the chart does not use, so every key gpulab sets or the user adds
  (``workloads_open_webui_extra_values``) is checked against the key facts of the pinned version
  (``gpulab/data/open-webui-<version>-keys.json``, made from that version's values.yaml by
  ``python -m gpulab.k8s.open_webui``), as gpulab.hami checks HAMi's.
* Values: the engines on the LAN (``lan: true``) as its OpenAI-compatible connections, each through its in-cluster
  Service (``http://NAME.NAMESPACE.svc:LAN_PORT/v1``: a LoadBalancer Service keeps its ClusterIP on the same port);
  the bundled Ollama, Pipelines and the websocket Redis off (one replica keeps its websockets in memory); its data
  on a local-path volume; its Service a LoadBalancer, served by k3s' ServiceLB on the nodes' addresses at
  ``lan_port``, or at a fixed ``lan_address`` that kube-vip announces (its class and address annotation, as an
  engine's Service, gpulab.k8s.workloads).
* Names at chart 16.0.0 (templates/_helpers.tpl ``open-webui.fullname``, templates/workload-manager.yaml): the
  release name when it contains the chart's name, so the StatefulSet (persistence on, provider local) and the
  Service are both ``open-webui``; the container listens on port 8080 (Service targetPort ``http``).
"""

from __future__ import annotations

import ipaddress
import sys
from collections.abc import Mapping
from typing import Any

import yaml

from gpulab import hami
from gpulab.k8s.workloads import KUBE_VIP_ADDRESS, KUBE_VIP_CLASS, LOCAL_PATH_CLASS

CHART = "open-webui"
REPO = "https://helm.openwebui.com/"
VERSION = "16.0.0"
#: the release (the HelmChart's name); containing the chart's name, it is the workload's and Service's name too
RELEASE = "open-webui"
#: the role's defaults (roles/workloads/defaults/main.yml)
NAMESPACE = "open-webui"
LAN_PORT = 8080
STORAGE_SIZE = "2Gi"
#: maps whose keys are the user's own: the open names of every chart, and the chart's extra environment
OPEN = frozenset({*hami.OPEN_MAP_NAMES, "extraEnvVars", "commonEnvVars"})
#: the image the chart runs (image.tag empty: the chart's appVersion)
IMAGES = (("image", "Open WebUI"),)
HEADER = "Managed by gpulab (role workloads, Open WebUI): changes here are overwritten."


class OpenWebUIError(ValueError):
    """Open WebUI's values do not fit the pinned chart, or its address is not usable."""


def facts_path(version: str):
    return hami.chart_facts_path(CHART, version)


def load_keys(version: str) -> dict[str, Any]:
    return hami.load_chart_keys(
        CHART,
        version,
        generate=f"gpulab.k8s.open_webui <values.yaml of {CHART} {version}> {version}",
        error=OpenWebUIError,
        otherwise=f", or pin {VERSION}",
    )


def keys_from_values(values: Mapping[str, Any], version: str, source: str = "") -> dict[str, Any]:
    return hami.keys_from_values(
        values, version, source, chart=CHART, open_names=OPEN, template_only={}, images=IMAGES
    )


def engine_urls(engines: list[Mapping[str, Any]]) -> list[str]:
    """The OpenAI-compatible base URL of each planned engine on the LAN, through its in-cluster Service."""
    out = []
    for engine in engines:
        lan = engine.get("lan")
        if lan:
            out.append(f"http://{engine['name']}.{engine.get('namespace') or 'default'}.svc:{lan['port']}/v1")
    return out


def lan_address(value: Any) -> str | None:
    """The fixed LAN address (kube-vip's), None when empty. Raises OpenWebUIError for one that is no IPv4 address."""
    if value in (None, ""):
        return None
    try:
        return str(ipaddress.IPv4Address(str(value)))
    except ValueError:
        raise OpenWebUIError(
            f"workloads_open_webui_lan_address = {value!r}: not an IPv4 address; give a free address of the "
            "router's subnet outside its DHCP pool, or leave it empty (the nodes' addresses, k3s' ServiceLB)"
        ) from None


def values(
    *,
    urls: list[str],
    lan_port: int = LAN_PORT,
    address: str | None = None,
    storage_size: str = STORAGE_SIZE,
    extra_values: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The chart's values for these engine URLs (see the module docstring), `extra_values` merged last."""
    service: dict[str, Any] = {"type": "LoadBalancer", "port": int(lan_port)}
    if address is not None:
        service["annotations"] = {KUBE_VIP_ADDRESS: address}
        service["loadBalancerClass"] = KUBE_VIP_CLASS  # ServiceLB leaves a Service with a class to kube-vip
    base = {
        "ollama": {"enabled": False},
        "pipelines": {"enabled": False},
        "websocket": {"manager": "", "redis": {"enabled": False}},
        "enableOpenaiApi": True,
        "openaiBaseApiUrls": list(urls),
        "persistence": {"enabled": True, "size": str(storage_size), "storageClass": LOCAL_PATH_CLASS},
        "service": service,
    }
    return hami.deep_merge(base, dict(extra_values or {}))


def check_extra_values(extra_values: Any, version: str) -> list[str]:
    """The problems of the user's extra values against the pinned chart version's keys (empty: none)."""
    if not extra_values:
        return []
    return hami.check_values(extra_values, load_keys(version))


def render(
    *,
    engines: list[Mapping[str, Any]],
    version: str = VERSION,
    repo: str = REPO,
    namespace: str = NAMESPACE,
    lan_port: int = LAN_PORT,
    lan_address_value: Any = None,
    server: str = "",
    storage_size: str = STORAGE_SIZE,
    extra_values: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Open WebUI's values for the planned `engines` (gpulab.k8s.workloads.plan), checked against the pinned
    chart's keys, its HelmChart manifest, and where it answers: the fixed address, else the first server's
    address (ServiceLB serves the port on every node). Raises OpenWebUIError naming every problem."""
    facts = load_keys(version)
    urls = engine_urls(engines)
    if not urls:
        raise OpenWebUIError(
            "workloads_open_webui is true but no engine of workloads_engines is on the LAN: Open WebUI talks to "
            "the engines with lan: true; mark one, or set workloads_open_webui: false"
        )
    if isinstance(lan_port, bool) or not isinstance(lan_port, int) or not 1 <= lan_port <= 65535:
        raise OpenWebUIError(f"workloads_open_webui_lan_port must be a TCP port number, not {lan_port!r}")
    address = lan_address(lan_address_value)
    vals = values(
        urls=urls, lan_port=lan_port, address=address, storage_size=storage_size, extra_values=extra_values
    )
    problems = hami.check_values(vals, facts)
    if problems:
        raise OpenWebUIError(
            f"{CHART} chart {version} values refused ({len(problems)} problem(s)): " + "; ".join(problems)
        )
    chart = hami.helmchart(
        vals, chart_version=version, name=RELEASE, namespace="kube-system", target_namespace=namespace,
        repo=repo, chart=CHART, labels={"app.kubernetes.io/part-of": "gpulab-open-webui"},
    )  # fmt: skip
    host = address or server
    return {
        "values": vals,
        "manifest": hami.dump_manifest(chart, header=HEADER),
        "urls": urls,
        "address": host,
        "port": lan_port,
        "kube_vip": address is not None,
        "url": f"http://{host}:{lan_port}" if host else None,
        "workload": f"statefulset/{RELEASE}",
        "namespace": namespace,
    }


def main(argv=None):
    parser = hami.facts_parser(
        "python -m gpulab.k8s.open_webui",
        "Generate the key facts file of an open-webui chart version from its values.yaml.",
    )
    parser.add_argument("version")
    parser.add_argument("--source", default="", help="where values.yaml comes from (repository, tag, commit)")
    args = parser.parse_args(argv)
    facts = keys_from_values(yaml.safe_load(args.values_yaml.read_text()), args.version, args.source)
    return hami.write_facts(facts, args.output)


if __name__ == "__main__":
    sys.exit(main())

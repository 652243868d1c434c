#!/usr/bin/python
# Copyright: gpulab contributors
# MIT License (see pyproject.toml)
"""Check the Prometheus and Grafana chart values against their pinned versions and render both k3s HelmCharts."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: monitoring_charts
short_description: Check Prometheus and Grafana chart values and render the k3s HelmCharts that install them
version_added: "0.1.0"
author: gpulab contributors (!UNKNOWN)
description:
  - Builds the values of the C(prometheus) chart (prometheus-community) and the C(grafana) chart
    (grafana-community) for HAMi's metrics, checks every key against the key facts of each pinned version (kept
    in the gpulab package, generated from that version's C(values.yaml)), and returns two C(helm.cattle.io/v1)
    C(HelmChart) manifests for k3s's auto-deploy manifests directory.
  - Prometheus scrapes HAMi's scheduler (NodePort 31993) at O(server) and HAMi's vGPU monitor (NodePort 31992) at
    each of O(gpu_nodes); Grafana gets Prometheus as its default data source and HAMi's dashboard of the pinned
    HAMi version, downloaded by the Grafana chart from O(dashboard).
  - Refuses a key a chart version does not have (Helm would silently ignore it) and a NodePort outside
    30000-32767.
extends_documentation_fragment:
  - gpulab.homelab.compute
  - gpulab.homelab.attributes
options:
  prometheus_version:
    description: Version of the C(prometheus) chart; key facts must exist for it in the gpulab package.
    type: str
    required: true
  grafana_version:
    description: Version of the C(grafana) chart; key facts must exist for it in the gpulab package.
    type: str
    required: true
  hami_version:
    description: HAMi chart version; its tag names the dashboard to download when O(dashboard) is empty.
    type: str
    required: true
  server:
    description: Address of the k3s server where HAMi's scheduler NodePort and both UIs are reached.
    type: str
    required: true
  gpu_nodes:
    description: Addresses of the GPU nodes, where HAMi's vGPU monitor NodePort is scraped.
    type: list
    elements: str
    required: true
  namespace:
    description: Namespace of both releases' objects (the HelmCharts themselves live in C(kube-system)).
    type: str
    default: monitoring
  prometheus_node_port:
    description: NodePort of the Prometheus server's Service.
    type: int
    default: 30090
  grafana_node_port:
    description: NodePort of Grafana's Service.
    type: int
    default: 30300
  scrape_interval:
    description: Prometheus's C(global.scrape_interval).
    type: str
    default: 15s
  image_registry:
    description:
      - Registry of every image of both charts, for a mirror the nodes can reach (the same as HAMi's); empty keeps
        each image's own.
    type: str
    default: ""
  dashboard:
    description: URL of HAMi's dashboard JSON; empty takes C(dashboards/hami-vgpu-dashboard.json) at tag v O(hami_version).
    type: str
    default: ""
  prometheus_repo:
    description: Repository of the C(prometheus) chart.
    type: str
    default: https://prometheus-community.github.io/helm-charts
  grafana_repo:
    description: Repository of the C(grafana) chart.
    type: str
    default: https://grafana-community.github.io/helm-charts
  prometheus_extra_values:
    description: More C(prometheus) chart values, merged last; each key is checked like the others.
    type: dict
    default: {}
  grafana_extra_values:
    description: More C(grafana) chart values, merged last; each key is checked like the others.
    type: dict
    default: {}
  webui:
    description:
      - Also render the C(hami-webui) chart (Project-HAMi/HAMi-WebUI) beside Grafana, for this plain Prometheus
        (ServiceMonitors and the bundled dcgm-exporter off, images at the release's tag, Service a NodePort that
        Kubernetes assigns), and add a Prometheus job for the WebUI backend's metrics.
      - Refused when O(webui_version) is unknown to gpulab or needs a newer HAMi than O(hami_version).
    type: bool
    default: false
  webui_version:
    description: Version of the C(hami-webui) chart; key facts must exist for it in the gpulab package.
    type: str
    default: 1.2.0
  webui_repo:
    description: Repository of the C(hami-webui) chart.
    type: str
    default: https://project-hami.github.io/HAMi-WebUI
  webui_extra_values:
    description: More C(hami-webui) chart values, merged last; each key is checked like the others.
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Render the Prometheus and Grafana HelmCharts
  gpulab.homelab.monitoring_charts:
    prometheus_version: 29.27.0
    grafana_version: 12.11.1
    hami_version: 2.10.0
    server: 192.168.100.53
    gpu_nodes: [192.168.100.55]
  delegate_to: localhost
  register: monitoring_charts
"""

RETURN = r"""
values:
  description: Each chart's values (keys C(prometheus) and C(grafana)), as checked.
  returned: success
  type: dict
manifests:
  description:
    - Each chart's HelmChart manifest as YAML text with a header comment (keys C(prometheus), C(grafana), and
      C(hami-webui) with O(webui)).
  returned: success
  type: dict
webui:
  description: With O(webui), the WebUI Service's name and namespace (keys C(service), C(namespace)); else empty.
  returned: success
  type: dict
targets:
  description: The static targets of the two HAMi scrape jobs (C(hami-scheduler), C(hami-device-plugin)).
  returned: success
  type: dict
urls:
  description: Where Prometheus, Grafana and HAMi's dashboard are reached (keys C(prometheus), C(grafana), C(dashboard)).
  returned: success
  type: dict
  sample:
    prometheus: http://192.168.100.53:30090
    grafana: http://192.168.100.53:30300
    dashboard: http://192.168.100.53:30300/d/hami-vgpu-metrics
"""

from ansible_collections.gpulab.homelab.plugins.module_utils.controller_module import run_module  # noqa: E402

ARGUMENT_SPEC = dict(
    prometheus_version=dict(type="str", required=True),
    grafana_version=dict(type="str", required=True),
    hami_version=dict(type="str", required=True),
    server=dict(type="str", required=True),
    gpu_nodes=dict(type="list", elements="str", required=True),
    namespace=dict(type="str", default="monitoring"),
    prometheus_node_port=dict(type="int", default=30090),
    grafana_node_port=dict(type="int", default=30300),
    scrape_interval=dict(type="str", default="15s"),
    image_registry=dict(type="str", default=""),
    dashboard=dict(type="str", default=""),
    prometheus_repo=dict(type="str", default="https://prometheus-community.github.io/helm-charts"),
    grafana_repo=dict(type="str", default="https://grafana-community.github.io/helm-charts"),
    prometheus_extra_values=dict(type="dict", default={}),
    grafana_extra_values=dict(type="dict", default={}),
    webui=dict(type="bool", default=False),
    webui_version=dict(type="str", default="1.2.0"),
    webui_repo=dict(type="str", default="https://project-hami.github.io/HAMi-WebUI"),
    webui_extra_values=dict(type="dict", default={}),
)
RULES = {}


def main():
    run_module(
        ARGUMENT_SPEC, RULES, "monitoring_charts"
    )  # AnsibleModule, then gpulab.tasks.monitoring_charts


if __name__ == "__main__":
    main()

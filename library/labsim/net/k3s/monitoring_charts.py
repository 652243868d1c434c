"""The Prometheus and Grafana charts on the k3s stand-in, as k3s' helm controller leaves them installed: what each
modelled behaviour is taken from, and its test, is listed in library/labsim/UPSTREAM.md (## Monitoring charts).

* ``prometheus`` (prometheus-community chart 29.27.0): the install job completes, Deployment
  ``<release>-server`` is listed in the HelmChart's target namespace, and the server's ``prometheus.yml`` is
  rendered from the HelmChart's values the way the chart's templates/cm.yaml renders its ConfigMap:
  ``global`` from ``server.global`` over the chart's defaults, then ``scrape_configs``: every enabled entry of
  ``scrapeConfigs`` (the chart's defaults and the values' own, merged as Helm merges values; ``job_name`` or else
  the entry's key), then ``serverFiles."prometheus.yml".scrape_configs``, then ``extraScrapeConfigs``. The
  stand-in runs no image: it writes that file and the pod's port (the Service's NodePort) to
  ``POD_DIR/<namespace>/<release>-server/`` on the server, and the Deployment is Ready once a Prometheus answers
  ``/-/ready`` on that port of the server (the lab runs the distribution's real ``prometheus`` there, in the
  server's network namespace, as the pod: labsim.net.chart_pods); the folder goes when the chart is uninstalled
  (:func:`remove_pods`), and that Prometheus with it. Known differences: the chart's jobs that discover targets through
  the Kubernetes API (``kubernetes_sd_configs``) are left out, since the stand-in's API is not Kubernetes'; the
  chart's rule files are not written; the NodePort is served on the server's address only.
* ``grafana`` (grafana-community chart 12.11.1): the install job completes and Deployment ``<release>`` is Ready;
  no Grafana runs in the lab (the dashboard's queries are proven against the real Prometheus instead).
* ``hami-webui`` (Project-HAMi/HAMi-WebUI chart 1.2.0, tag hami-webui-1.2.0 = commit b02ace28): the install job
  completes; the chart's objects are named by its fullname (templates/_helpers.tpl ``hami-webui.fullname``: the
  release name when it contains ``hami-webui``, else ``<release>-hami-webui``): Deployment ``<fullname>`` (Ready at
  once: templates/deployment.yaml gives its two containers no probes) and Service ``<fullname>``
  (templates/service.yaml: ``service.type``, port ``http`` = ``service.port`` to the frontend's 3000, port
  ``metrics`` 8000 to the backend's; no nodePort in the template, so a NodePort Service gets each port's NodePort
  from the API server: a free one of 30000-32767 at random, kept while the Service exists). A chart whose values
  leave ``serviceMonitor.enabled`` or ``hamiServiceMonitor.enabled`` on (the chart's defaults,
  templates/servicemonitor.yaml and hamiservicemonitor.yaml: kind ServiceMonitor of monitoring.coreos.com/v1), or
  ``dcgm-exporter.enabled`` (the bundled chart's ServiceMonitor), fails to install as on a cluster without
  Prometheus Operator's CRDs: its install job never completes. The frontend (src/main.ts at the tag: NestJS on
  3000 serving the built pages) is modelled by the k3s server answering ``GET /`` with a page on the ``http``
  NodePort at its address (server.serve_webui); the backend's metrics and API are not modelled.

Standard library only, PyYAML for the values (as the HelmChart controller stand-in).
"""

import json
import os
import urllib.request

POD_DIR = "/var/lib/rancher/k3s/gpulab-pods"
CHARTS = ("prometheus", "grafana", "hami-webui")
WEBUI = "hami-webui"
#: templates/service.yaml at hami-webui-1.2.0: the ports of Service <fullname> (name, port, target port)
WEBUI_PORTS = (("http", None, "http"), ("metrics", 8000, "metrics"))
#: charts/hami-webui/values.yaml at hami-webui-1.2.0: service.port
WEBUI_SERVICE_PORT = 3000
#: the kinds the chart makes from its defaults that need Prometheus Operator's CRDs (ServiceMonitor)
WEBUI_CRD_VALUES = ("serviceMonitor", "hamiServiceMonitor", "dcgm-exporter")

#: charts/prometheus/values.yaml@prometheus-29.27.0: server.global and the scrapeConfigs entries (the first is a
#: static job, the others discover through the Kubernetes API)
PROMETHEUS_GLOBAL = {"scrape_interval": "1m", "scrape_timeout": "10s", "evaluation_interval": "1m"}
PROMETHEUS_JOBS = {
    "prometheus": {"enabled": True, "job_name": "", "static_configs": [{"targets": ["localhost:9090"]}]},
    **{
        name: {"enabled": True, "kubernetes_sd_configs": [{"role": role}]}
        for name, role in (
            ("kubernetes-api-servers", "endpoints"),
            ("kubernetes-nodes", "node"),
            ("kubernetes-nodes-cadvisor", "node"),
            ("kubernetes-service-endpoints", "endpoints"),
            ("kubernetes-service-endpoints-slow", "endpoints"),
            ("prometheus-pushgateway", "service"),
            ("kubernetes-services", "service"),
            ("kubernetes-pods", "pod"),
            ("kubernetes-pods-slow", "pod"),
        )
    },
}


def deep_merge(base, extra):
    """Helm's merge of values: maps key by key, anything else replaced."""
    out = dict(base)
    for key, value in (extra or {}).items():
        out[key] = (
            deep_merge(out[key], value)
            if isinstance(value, dict) and isinstance(out.get(key), dict)
            else value
        )
    return out


def prometheus_config(values):
    """The server's prometheus.yml as the chart renders it from `values` (see the module docstring), without the
    jobs that need Kubernetes service discovery."""
    import yaml

    server = values.get("server") or {}
    jobs = deep_merge(PROMETHEUS_JOBS, values.get("scrapeConfigs") or {})
    scrape = []
    for key, job in jobs.items():
        if not isinstance(job, dict) or job.get("enabled", True) is False:
            continue
        scrape.append(
            {
                "job_name": job.get("job_name") or key,
                **{k: v for k, v in job.items() if k not in ("enabled", "job_name")},
            }
        )
    files = (values.get("serverFiles") or {}).get("prometheus.yml") or {}
    scrape += list(files.get("scrape_configs") or [])
    extra = values.get("extraScrapeConfigs") or ""
    scrape += list((yaml.safe_load(extra) if isinstance(extra, str) else extra) or [])
    return {
        "global": deep_merge(PROMETHEUS_GLOBAL, server.get("global") or {}),
        "scrape_configs": [j for j in scrape if "kubernetes_sd_configs" not in j],
    }


def node_port(values, chart):
    """The NodePort the chart's Service gets from the values (None: not a NodePort Service)."""
    service = (
        ((values.get("server") or {}).get("service") or {})
        if chart == "prometheus"
        else (values.get("service") or {})
    )
    return int(service["nodePort"]) if service.get("type") == "NodePort" and service.get("nodePort") else None


def answers(port):
    """Whether the Prometheus 'pod' answers its readiness endpoint on this server."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=0.5) as resp:
            return resp.status == 200
    except OSError:
        return False


def webui_fullname(release):
    return release if WEBUI in release else f"{release}-{WEBUI}"


def webui_crd_values(values):
    """The values paths that make the WebUI chart render a ServiceMonitor (on unless the values turn them off)."""
    out = []
    for key in WEBUI_CRD_VALUES:
        node = values.get(key) if isinstance(values.get(key), dict) else {}
        if node.get("enabled", True) is not False:
            out.append(f"{key}.enabled")
    return out


def webui_service(release, target, values, node_ports):
    """Service <fullname> as the chart renders it, NodePorts from `node_ports` (namespace/name/port -> NodePort,
    the API server's allocations, which this fills for a new Service)."""
    import random

    service = values.get("service") or {}
    kind = service.get("type") or "ClusterIP"
    fullname = webui_fullname(release)
    ports = []
    for port_name, port, target_port in WEBUI_PORTS:
        entry = {"name": port_name, "port": int(port or service.get("port") or WEBUI_SERVICE_PORT),
                 "protocol": "TCP", "targetPort": target_port}  # fmt: skip
        if kind in ("NodePort", "LoadBalancer"):
            key = f"{target}/{fullname}/{port_name}"
            if key not in node_ports:
                used = set(node_ports.values()) | {30090, 30300, 31992, 31993}
                node_ports[key] = random.choice([p for p in range(30000, 32768) if p not in used])
            entry["nodePort"] = node_ports[key]
        ports.append(entry)
    labels = {"app.kubernetes.io/name": WEBUI, "app.kubernetes.io/instance": release,
              "app.kubernetes.io/component": WEBUI}  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": fullname, "namespace": target, "labels": labels},
        "spec": {"type": kind, "ports": ports, "selector": labels},
    }


def install_chart(name, target, spec, node_ports=None):
    """What the helm controller leaves installed for a monitoring HelmChart: ({namespace/deployment: rollout},
    {namespace/deployment: object}, {namespace/service: object}), or None while its install job cannot complete.
    For Prometheus it writes the pod's config and port under POD_DIR."""
    import yaml

    chart = spec.get("chart")
    values = yaml.safe_load(spec.get("valuesContent") or "") or {}
    if chart == WEBUI:
        if webui_crd_values(values):
            return None  # no matches for kind "ServiceMonitor" in version "monitoring.coreos.com/v1"
        service = webui_service(name, target, values, node_ports if node_ports is not None else {})
        fullname = webui_fullname(name)
        obj = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": fullname,
                "namespace": target,
                "labels": dict(service["metadata"]["labels"]),
            },
            "spec": {"replicas": int(values.get("replicaCount") or 1)},
            "status": {"replicas": 1, "readyReplicas": 1},
        }
        key = f"{target}/{fullname}"
        return {key: {"ready": True}}, {key: obj}, {key: service}
    deployment = f"{name}-server" if chart == "prometheus" else name
    ready = True
    if chart == "prometheus":
        folder = os.path.join(POD_DIR, target, deployment)
        os.makedirs(folder, exist_ok=True)
        port = node_port(values, chart) or 9090
        pod = {
            "port": port,
            "config": os.path.join(folder, "prometheus.yml"),
            "chart_version": spec.get("version"),
        }
        for fname, text in (
            ("prometheus.yml", yaml.safe_dump(prometheus_config(values), sort_keys=False)),
            ("pod.json", json.dumps(pod, indent=1) + "\n"),
        ):
            path = os.path.join(folder, fname)
            try:
                with open(path) as f:
                    same = f.read() == text
            except OSError:
                same = False
            if not same:
                with open(path + ".tmp", "w") as f:
                    f.write(text)
                os.replace(path + ".tmp", path)
        ready = answers(port)
    obj = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": deployment, "namespace": target, "labels": {"app.kubernetes.io/instance": name}},
        "spec": {"replicas": 1},
        "status": {"replicas": 1, "readyReplicas": 1 if ready else 0},
    }
    key = f"{target}/{deployment}"
    return {key: {"ready": ready}}, {key: obj}, {}


def remove_pods(deployments):
    """Take out the pod folder of every Prometheus server whose Deployment (``namespace/name``) is no longer in
    `deployments` (its chart was uninstalled): the lab's kubelet (labsim.net.chart_pods) then stops it."""
    import shutil

    try:
        namespaces = os.listdir(POD_DIR)
    except OSError:
        return
    for ns in namespaces:
        for name in os.listdir(os.path.join(POD_DIR, ns)):
            if f"{ns}/{name}" not in deployments:
                shutil.rmtree(os.path.join(POD_DIR, ns, name), ignore_errors=True)


WEBUI_PAGE = (
    '<!doctype html><html><head><meta charset="utf-8"><title>HAMi-WebUI</title></head>'
    "<body><p>HAMi-WebUI (gpulab lab k3s stand-in: the frontend's pages are not served here)</p></body></html>"
)


def webui_http_ports(services):
    """The `http` NodePort of every HAMi-WebUI Service in `services` (the cluster state's), sorted."""
    return sorted(
        port["nodePort"]
        for svc in services.values()
        if (svc.get("metadata", {}).get("labels") or {}).get("app.kubernetes.io/component") == WEBUI
        for port in svc.get("spec", {}).get("ports") or []
        if port.get("name") == "http" and port.get("nodePort")
    )


def serve_page(host, port):
    """Answer ``GET /`` on host:port with WEBUI_PAGE in a thread (None when the port is taken)."""
    import http.server

    from .common import serve_in_thread

    body = WEBUI_PAGE.encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            found = self.path.split("?", 1)[0] == "/"
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body) if found else 0))
            self.end_headers()
            if found:
                self.wfile.write(body)

    return serve_in_thread(host, port, Handler, "HAMi-WebUI")

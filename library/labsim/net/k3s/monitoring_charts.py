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
  ``/-/ready`` on that port of the server (the lab's tests run the distribution's real ``prometheus`` there, in
  the server's network namespace, as the pod). Known differences: the chart's jobs that discover targets through
  the Kubernetes API (``kubernetes_sd_configs``) are left out, since the stand-in's API is not Kubernetes'; the
  chart's rule files are not written; the NodePort is served on the server's address only.
* ``grafana`` (grafana-community chart 12.11.1): the install job completes and Deployment ``<release>`` is Ready;
  no Grafana runs in the lab (the dashboard's queries are proven against the real Prometheus instead).

Standard library only, PyYAML for the values (as the HelmChart controller stand-in).
"""

import json
import os
import urllib.request

POD_DIR = "/var/lib/rancher/k3s/gpulab-pods"
CHARTS = ("prometheus", "grafana")

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


def install_chart(name, target, spec):
    """What the helm controller leaves installed for a monitoring HelmChart: ({namespace/deployment: rollout},
    {namespace/deployment: object}). For Prometheus it writes the pod's config and port under POD_DIR."""
    import yaml

    chart = spec.get("chart")
    values = yaml.safe_load(spec.get("valuesContent") or "") or {}
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
    return {key: {"ready": ready}}, {key: obj}

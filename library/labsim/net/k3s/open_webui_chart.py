"""The open-webui chart of stage workloads' front end on the k3s stand-in, as k3s' helm controller leaves it
installed, and what Open WebUI's pod answers; the behaviours and their tests are listed in
library/labsim/UPSTREAM.md (## Open WebUI chart).

open-webui chart 16.0.0 (github.com/open-webui/helm-charts, tag open-webui-16.0.0): the install job completes; the
chart's workload is named by its fullname (templates/_helpers.tpl ``open-webui.fullname``: the release name when it
contains ``open-webui``, else ``<release>-open-webui``) and is a StatefulSet when ``persistence.enabled`` (on by
default) with ``persistence.provider`` ``local`` (the default), else a Deployment, unless ``workload.kind`` names
one (templates/workload-manager.yaml). The stand-in runs no image: the workload is Ready at once, so ``k3s kubectl
rollout status statefulset/<fullname>`` answers.

Its Service (templates/service.yaml): ``<fullname>``, type ``service.type`` (ClusterIP by default), one port
``http`` = ``service.port`` (80 by default) to the container's ``http`` (``service.containerPort``, 8080), the
chart's selector labels (``app.kubernetes.io/instance`` the release, ``app.kubernetes.io/component`` the chart),
``service.annotations`` and ``service.loadBalancerClass`` as given. A LoadBalancer Service is reached as an
engine's is (module engine): k3s' ServiceLB opens its port on the node's address (the stand-in: every k3s server's
own address), and one of kube-vip's class names its address (``kube-vip.io/loadbalancerIPs``), which the kube-vip
leader holds and forwards to a server's address at that port (module kube_vip). There Open WebUI's pod answers as
the image the chart deploys (appVersion 0.11.0, backend/open_webui/main.py): ``GET /health`` 200 with
``{"status": true}`` (JSON), ``GET /`` a page; any other path 404 ``{"detail": "Not Found"}`` (FastAPI's). Known
differences: no chat, sign-up or API routes; the page is the stand-in's own.
"""

import json

CHART = "open-webui"
#: charts/open-webui/Chart.yaml at open-webui-16.0.0: the image tag the chart runs when image.tag is empty
APP_VERSION = "0.11.0"
#: charts/open-webui/values.yaml at open-webui-16.0.0: service.port, service.containerPort
SERVICE_PORT = 80
CONTAINER_PORT = 8080
KUBE_VIP_ADDRESS = "kube-vip.io/loadbalancerIPs"
PAGE = (
    '<!doctype html><html><head><meta charset="utf-8"><title>Open WebUI</title></head>'
    "<body><p>Open WebUI (gpulab lab k3s stand-in: the chat pages are not served here)</p></body></html>"
)


def fullname(release):
    return release if CHART in release else f"{release}-{CHART}"


def workload_kind(values):
    """StatefulSet or Deployment, as templates/workload-manager.yaml chooses from the values."""
    kind = ((values.get("workload") or {}).get("kind")) or ""
    if kind:
        return kind
    persistence = values.get("persistence") or {}
    local = persistence.get("enabled", True) and (persistence.get("provider") or "local") == "local"
    return "StatefulSet" if local else "Deployment"


def service(release, target, values):
    """Service <fullname> as templates/service.yaml renders it from the values."""
    svc = values.get("service") or {}
    selector = {"app.kubernetes.io/instance": release, "app.kubernetes.io/component": CHART}
    labels = {"app.kubernetes.io/name": CHART, "app.kubernetes.io/version": APP_VERSION, **selector}
    meta = {"name": fullname(release), "namespace": target, "labels": labels}
    if svc.get("annotations"):
        meta["annotations"] = dict(svc["annotations"])
    spec = {
        "type": svc.get("type") or "ClusterIP",
        "selector": selector,
        "ports": [{"protocol": "TCP", "name": "http", "port": int(svc.get("port") or SERVICE_PORT),
                   "targetPort": "http"}],
    }  # fmt: skip
    if svc.get("loadBalancerClass"):
        spec["loadBalancerClass"] = str(svc["loadBalancerClass"])
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec}


def install_chart(name, target, spec):
    """({namespace/fullname: rollout}, {namespace/fullname: object}, {namespace/fullname: Service}) of an
    open-webui HelmChart."""
    import yaml

    values = yaml.safe_load(spec.get("valuesContent") or "") or {}
    full = fullname(name)
    obj = {
        "apiVersion": "apps/v1",
        "kind": workload_kind(values),
        "metadata": {"name": full, "namespace": target, "labels": {"app.kubernetes.io/instance": name}},
        "spec": {"replicas": 1},
        "status": {"replicas": 1, "readyReplicas": 1},
    }
    key = f"{target}/{full}"
    return {key: {"ready": True}}, {key: obj}, {key: service(name, target, values)}


def lan_ports(services):
    """(address or None, port) of every LoadBalancer port of Open WebUI's Services in `services` (the cluster
    state's, namespace/name -> Service): None is ServiceLB's (the node's address), else kube-vip's address."""
    out = []
    for svc in services.values():
        meta, spec = svc.get("metadata") or {}, svc.get("spec") or {}
        if (meta.get("labels") or {}).get("app.kubernetes.io/component") != CHART:
            continue
        if spec.get("type") != "LoadBalancer":
            continue
        address = (meta.get("annotations") or {}).get(KUBE_VIP_ADDRESS) or spec.get("loadBalancerIP") or None
        out.extend((address, int(p["port"])) for p in spec.get("ports") or [] if p.get("port"))
    return sorted(out, key=lambda a: (a[0] or "", a[1]))


def answer(method, path):
    """(status, content type, body bytes) of Open WebUI's server for one request (see the module docstring)."""
    path = path.split("?", 1)[0]
    if method == "GET" and path == "/health":
        return 200, "application/json", json.dumps({"status": True}).encode()
    if method == "GET" and path == "/":
        return 200, "text/html; charset=utf-8", PAGE.encode()
    return 404, "application/json", json.dumps({"detail": "Not Found"}).encode()


def serve(host, port):
    """Open WebUI's server on host:port in a thread (None when the port is taken)."""
    import http.server

    from .common import serve_in_thread

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _reply(self, method):
            code, kind, body = answer(method, self.path)
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self._reply("GET")

        def do_POST(self):
            self._reply("POST")

    return serve_in_thread(host, port, Handler, "Open WebUI")

"""The k3s stand-in's API server: the HTTP API every server answers (plain HTTP to the stand-in's own parts, TLS
to a real kubectl: module tls), the Kubernetes API that kubectl reads (module kubeapi), the cluster token's check
and the node edits kubectl makes (cordon, label, annotate).

With etcd a follower answers through its leader, and without a quorum nothing answers but ``etcdserver:
request timed out``.
"""

import http.server
import json
import ssl
import time

from . import kubeapi, tls
from .cluster import node_object, pod_object, pod_status
from .common import http_send, send_answer
from .etcd import NO_QUORUM
from .hami import webhook_configuration, webhook_endpoints


def token_ok(given, token):
    given = (given or "").strip()
    return bool(given) and (given == token or given == token.split("::server:", 1)[-1])


def make_handler(cluster, token):
    """The server's API. `Handler.auth["token"]` is the cluster token (a joining server learns it on joining)."""
    auth = {"token": token}

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def raw(self):
            if not hasattr(self, "_raw"):
                self._raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            return self._raw

        def forwarded(self, method):
            """With etcd, a follower answers through its leader, and nothing answers without a quorum."""
            etcd = cluster.etcd
            if (
                etcd is None
                or self.path in ("/gpulab/etcd/status", "/gpulab/etcd/append")
                or etcd.is_leader()
            ):
                return False
            peer = etcd.leader_peer()
            if peer is None:
                self.reply(504, {"error": NO_QUORUM})
                return True
            body = json.loads(self.raw() or b"{}") if method == "POST" else None
            try:
                code, answer = http_send(peer, self.path, body, timeout=10)
            except OSError:
                code, answer = 504, {"error": NO_QUORUM}
            self.reply(code, answer)
            return True

        def reply(self, code, body):
            send_answer(self, code, json.dumps(body).encode())

        def body(self):
            return json.loads(self.raw() or b"{}")

        def authenticated(self):
            """A TLS client shows a certificate of the client CA or the cluster token as a bearer token (k3s'
            kubeconfig carries the admin's certificate); the stand-in's own parts speak plain HTTP."""
            if not isinstance(self.connection, ssl.SSLSocket):
                return True
            if self.connection.getpeercert():
                return True
            bearer = (self.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
            return token_ok(bearer, auth["token"])

        def kube_api(self):
            """The Kubernetes API a real kubectl reads (module kubeapi), from this server's copy of the state;
            with etcd, nothing without a quorum."""
            if not self.authenticated():
                return self.reply(401, kubeapi.status(401, "Unauthorized", "Unauthorized"))
            etcd = cluster.etcd
            if etcd is not None and not etcd.is_leader() and etcd.leader_peer() is None:
                return self.reply(504, kubeapi.status(504, "Timeout", NO_QUORUM))
            with cluster.lock:
                state = json.loads(json.dumps(cluster.state))
            code, body = kubeapi.answer(self.command, self.path, self.headers.get("Accept"), state)
            if isinstance(body, str):
                return send_answer(self, code, body.encode(), "text/plain")
            return self.reply(code, body)

        def do_GET(self):
            if self.path.split("?", 1)[0].startswith(("/api", "/version")):
                return self.kube_api()
            if self.forwarded("GET"):
                return
            if self.path == "/gpulab/etcd/status" and cluster.etcd is not None:
                return self.reply(200, cluster.etcd.status())
            with cluster.lock:
                state = json.loads(json.dumps(cluster.state))
            if self.path == "/gpulab/nodes":
                return self.reply(200, {n: node_object(n, v) for n, v in sorted(state["nodes"].items())})
            if self.path == "/gpulab/runtimeclasses":
                return self.reply(200, state["runtimeclasses"])
            if self.path == "/gpulab/deployments":
                return self.reply(200, state.get("deployment_objects", {}))
            if self.path == "/gpulab/daemonsets":
                return self.reply(200, state.get("daemonsets", []))
            if self.path == "/gpulab/services":  # the monitoring charts' Services (module monitoring_charts)
                return self.reply(200, state.get("services", {}))
            if self.path == "/gpulab/secrets":  # names, types and keys only (Cluster.keep_secrets)
                return self.reply(200, state.get("secrets", {}))
            if self.path == "/gpulab/pods":
                pods = state.get("pods", []) + list(state.get("direct_pods", {}).values())
                return self.reply(200, [{**p, "status": pod_status(p)} for p in pods])
            if self.path == "/gpulab/endpointslices":
                hami = state.get("hami")
                return self.reply(200, [webhook_endpoints(state)] if hami and hami.get("enabled") else [])
            if self.path == "/gpulab/webhooks":
                hami = state.get("hami")
                items = [webhook_configuration(hami)] if hami and hami.get("enabled") else []
                return self.reply(200, {i["metadata"]["name"]: i for i in items})
            if self.path == "/gpulab/workloads":
                # a HelmChart's install job exists from the moment the server has seen the chart
                started = [
                    "{}/helm-install-{}".format(*key.split("/", 1)) for key in state.get("charts_seen", {})
                ]
                return self.reply(
                    200,
                    {
                        "jobs": state.get("jobs", {}),
                        "jobs_started": started,
                        "deployments": state.get("deployments", {}),
                    },
                )
            return self.reply(404, {"error": "not found"})

        def do_POST(self):
            if self.forwarded("POST"):
                return
            info = self.body()
            etcd = cluster.etcd
            if self.path == "/gpulab/etcd/append" and etcd is not None:
                return self.reply(*etcd.append(info))
            if self.path == "/gpulab/etcd/join":
                if not token_ok(info.get("token"), auth["token"]):
                    return self.reply(401, {"error": "Unauthorized: the join token does not match"})
                if etcd is None:
                    why = "this server runs no embedded etcd (it was started without cluster-init), so no server can join it"
                    return self.reply(400, {"error": why})
                return self.reply(
                    200,
                    {
                        **etcd.add_member(info["name"], info["peer"]),
                        "token": auth["token"],
                        "cas": tls.ca_files(),
                    },
                )
            if self.path == "/gpulab/etcd/addons" and etcd is not None:
                # another server's manifests folder, as its deploy controller applies it
                if not token_ok(info.get("token"), auth["token"]):
                    return self.reply(401, {"error": "Unauthorized: the join token does not match"})
                with cluster.lock:
                    cluster.state.setdefault("addons", {})[info["name"]] = info["docs"]
                return self.reply(200, {"ok": True})
            if self.path == "/gpulab/register":
                if not token_ok(info.get("token"), auth["token"]):
                    return self.reply(401, {"error": "Unauthorized: the join token does not match"})
                cluster.register(info)
                # k3s agents learn every server's address and fail over between them (their load balancer)
                servers = [m["peer"].split("://", 1)[1] for m in etcd.members] if etcd is not None else []
                # where HAMi's device plugin runs on the node (it wrote the register annotation), its vGPU
                # monitor serves metrics there (module hami_metrics); the agent starts it on this word
                with cluster.lock:
                    node = cluster.state["nodes"].get(info["name"]) or {}
                    monitor = bool(node.get("hami_register"))
                    legacy = bool((cluster.state.get("hami") or {}).get("legacy_metrics"))
                return self.reply(
                    200,
                    {"ok": True, **({"servers": servers} if servers else {}),
                     **({"hami_monitor": {"legacy_metrics": legacy}} if monitor else {})},
                )  # fmt: skip
            if self.path == "/gpulab/secrets/delete":
                with cluster.lock:
                    return self.reply(
                        200, {"deleted": cluster.delete_secrets(info["namespace"], info["names"])}
                    )
            if self.path in ("/gpulab/pods/create", "/gpulab/pods/delete", "/gpulab/scale"):
                with cluster.lock:
                    if self.path == "/gpulab/scale":
                        cluster.state.setdefault("scaled", {})[info["deployment"]] = int(info["replicas"])
                        cluster.save()
                        return self.reply(200, {"ok": True})
                    if self.path == "/gpulab/pods/delete":
                        gone = cluster.delete_pods(info["namespace"], info.get("names"), info.get("selector"))
                        return self.reply(200, {"deleted": gone})
                    made, error = cluster.create_pods(info["docs"], bool(info.get("dry_run")))
                if error:
                    return self.reply(500, {"error": error})
                return self.reply(200, {"pods": [pod_object({**p, "status": pod_status(p)}) for p in made]})
            edit = NODE_EDITS.get(self.path)
            if edit is not None:
                with cluster.lock:
                    node = cluster.state["nodes"].get(info["node"])
                    if node is None:
                        return self.reply(404, {"error": f'nodes "{info["node"]}" not found'})
                    code, answer = edit(node, info)
                    if code == 200:
                        cluster.save()
                return self.reply(code, answer)
            return self.reply(404, {"error": "not found"})

    Handler.auth = auth
    return Handler


def _cordon(node: dict, info: dict) -> tuple[int, dict]:
    """kubectl cordon/uncordon (and drain, which cordons first) on one node."""
    changed = bool(node.get("unschedulable")) != bool(info["unschedulable"])
    node["unschedulable"] = bool(info["unschedulable"])
    if info.get("drain"):
        node["drained"] = time.time()
    return 200, {"changed": changed}


def _label(node: dict, info: dict) -> tuple[int, dict]:
    """kubectl label on one node: `key=value` sets, `key-` removes, a new value needs --overwrite."""
    changed = False
    for k, v in info["labels"].items():
        if k.endswith("-"):
            changed |= node["labels"].pop(k[:-1], None) is not None
        elif node["labels"].get(k) != v:
            if k in node["labels"] and not info.get("overwrite"):
                return 409, {
                    "error": f"'{k}' already has a value ({node['labels'][k]}), and --overwrite is false"
                }
            node["labels"][k] = v
            changed = True
    return 200, {"changed": changed}


def _annotate(node: dict, info: dict) -> tuple[int, dict]:
    """kubectl annotate on one node: `key=value` sets, `key-` removes (no --overwrite needed), a new value for a
    key that has one needs --overwrite (kubernetes/kubectl pkg/cmd/annotate/annotate.go@v0.33.5,
    validateNoAnnotationOverwrites). A change is checked whole before any of it is made."""
    annotations = node.setdefault("annotations", {})
    for k, v in info["annotations"].items():
        if not k.endswith("-") and k in annotations and annotations[k] != v and not info.get("overwrite"):
            return 409, {
                "error": "--overwrite is false but found the following declared annotation(s): "
                f"'{k}' already has a value ({annotations[k]})"
            }
    for k, v in info["annotations"].items():
        if k.endswith("-"):
            annotations.pop(k[:-1], None)
        else:
            annotations[k] = v
    return 200, {"changed": True}


# POST path -> an edit of the node the request names, made under the cluster lock and saved on 200.
NODE_EDITS = {"/gpulab/cordon": _cordon, "/gpulab/label": _label, "/gpulab/annotate": _annotate}

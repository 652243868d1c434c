"""``k3s server`` on the stand-in: the cluster token, the kubeconfig, the API's listeners, the server's own
node and its loop over the manifests folder.

``k3s server`` keeps the cluster state in ``/var/lib/rancher/k3s/server/db/gpulab-state.json``, writes the
join token to ``/var/lib/rancher/k3s/server/token`` (``K10<hash>::server:<secret>``) and the kubeconfig to
``/etc/rancher/k3s/k3s.yaml`` (with k3s' CA and the admin's client certificate, module tls), registers itself
as the control-plane node, creates k3s' packaged RuntimeClasses (``nvidia``, ``nvidia-experimental``, ``crun`` and the WASM ones) a moment after start and
answers on ``https-listen-port`` (6443) of ``bind-address`` when config.yaml sets one, else of 127.0.0.1 and
the node's lab address: TLS with k3s' certificates to a client that opens with a handshake (a real kubectl with
the kubeconfig), plain HTTP to the stand-in's own parts (module tls). ``node-token`` is a symlink to ``token``,
as k3s makes it. The token is config.yaml's (``token-file``'s content, which wins, else ``token``) on the
server that starts the cluster as on one that joins it, in k3s' full form; a server given none makes one at its
first start and keeps it. Like the agent, the server sets config.yaml's ``node-label`` on its node at each start.
"""

import contextlib
import hashlib
import json
import os
import secrets
import signal
import socket
import sys
import threading
import time

from . import engine, hami_metrics, monitoring_charts, open_webui_chart, registry, tls
from .apiserver import make_handler
from .cluster import MANIFESTS, Cluster, manifest_docs
from .common import (
    HEARTBEAT_S,
    KUBECONFIG,
    PORT,
    boot_id,
    config_token,
    gpu_cards,
    http_send,
    labels_from,
    load_config,
    now_iso,
    own_address,
    setup_containerd,
    start_id,
    truthy,
    version,
)
from .etcd import ETCD_META, Etcd, etcd_addons, join_cluster
from .kube_vip import KubeVip

TOKEN = "/var/lib/rancher/k3s/server/token"
# k3s' manifests/runtimes.yaml: one RuntimeClass per handler (there is no nvidia-cdi class)
RUNTIME_CLASSES = (
    "crun",
    "lunatic",
    "nvidia",
    "nvidia-experimental",
    "slight",
    "spin",
    "wasmedge",
    "wasmer",
    "wasmtime",
    "wws",
)


def tls_sans(cfg):
    """config.yaml's ``tls-san`` (a name or a list of them)."""
    sans = cfg.get("tls-san") or []
    return [str(s) for s in ([sans] if isinstance(sans, str) else sans)]


def write_kubeconfig(url, cfg):
    """k3s' admin kubeconfig (module tls), mode ``write-kubeconfig-mode`` (else 0600), never readable by others
    while it is written."""
    os.makedirs(os.path.dirname(KUBECONFIG), exist_ok=True)
    text = tls.kubeconfig(url)
    mode = int(str(cfg.get("write-kubeconfig-mode") or "600"), 8)
    with contextlib.suppress(FileNotFoundError):
        os.remove(KUBECONFIG + ".tmp")
    with os.fdopen(os.open(KUBECONFIG + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(text)
    os.chmod(KUBECONFIG + ".tmp", mode)
    os.replace(KUBECONFIG + ".tmp", KUBECONFIG)


def sd_notify(message):
    """Tell the service manager (systemd's Type=notify) how the service is, as k3s does; no-op without one."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return
    if path.startswith("@"):
        path = "\0" + path[1:]  # an abstract socket
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(message.encode(), path)


def server_token(cfg):
    """The cluster token of a server that starts the cluster (or runs it alone): the one it is given (`token`,
    or `token-file`'s content, which wins, as k3s reads them: pkg/cli/server/server.go @v1.33.5+k3s1) in k3s'
    full form, else the one it made at its first start, else a new one."""
    secret = config_token(cfg)
    if not secret:
        try:
            with open(TOKEN) as f:
                return f.read().strip()
        except OSError:
            secret = secrets.token_hex(16)
    ca_hash = hashlib.sha256(f"gpulab-lab-ca:{socket.gethostname()}".encode()).hexdigest()
    return secret if secret.startswith("K10") else f"K10{ca_hash}::server:{secret}"


def write_token(token):
    os.makedirs(os.path.dirname(TOKEN), exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.remove(TOKEN + ".tmp")
    with os.fdopen(os.open(TOKEN + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(token + "\n")  # never readable by others, not even for a moment
    os.replace(TOKEN + ".tmp", TOKEN)


def serve_hami_metrics(cluster, name, address, cards, metrics):
    """HAMi's scheduler metrics (NodePort 31993) on this server's address once HAMi's chart is installed, and the
    vGPU monitor's (NodePort 31992) when HAMi's device plugin registered this server's own cards (module
    hami_metrics), from the cluster state."""
    with cluster.lock:
        hami = cluster.state.get("hami")
        registered = bool((cluster.state["nodes"].get(name) or {}).get("hami_register"))
    if not hami:
        return

    def state():
        with cluster.lock:
            return json.loads(json.dumps(cluster.state))

    def pods(s):
        return s.get("pods", []) + list(s.get("direct_pods", {}).values())

    def legacy(s):
        return bool((s.get("hami") or {}).get("legacy_metrics"))

    if "scheduler" not in metrics:
        metrics["scheduler"] = hami_metrics.serve(
            address,
            hami_metrics.SCHEDULER_NODE_PORT,
            lambda: (lambda s: hami_metrics.scheduler_families(s["nodes"], pods(s), legacy(s)))(state()),
        )
    if registered and "monitor" not in metrics:
        metrics["monitor"] = hami_metrics.serve(
            address,
            hami_metrics.MONITOR_NODE_PORT,
            lambda: (lambda s: hami_metrics.monitor_families(name, cards, pods(s), legacy(s)))(state()),
        )


def serve_webui(cluster, address, pages):
    """HAMi-WebUI's frontend on the `http` NodePort of its Service at this server's address while the Service
    exists (module monitoring_charts); `pages` holds the listeners by port."""
    with cluster.lock:
        wanted = set(monitoring_charts.webui_http_ports(cluster.state.get("services") or {}))
    keep_listening(pages, wanted, lambda port: monitoring_charts.serve_page(address, port))


def serve_open_webui(cluster, address, listeners):
    """Open WebUI's pod at this server's address on the port of each LoadBalancer Service of its chart while the
    Service exists (module open_webui_chart): ServiceLB's port on the node; a kube-vip address is forwarded here
    by kube-vip's leader (module kube_vip). `listeners` holds the servers by port."""
    with cluster.lock:
        wanted = {port for _, port in open_webui_chart.lan_ports(cluster.state.get("services") or {})}
    keep_listening(listeners, wanted, lambda port: open_webui_chart.serve(address, port))


def keep_listening(listeners, wanted, serve):
    """Stop the listeners (by port) of ports no longer `wanted`, and `serve(port)` each wanted one not yet open."""
    for port in [p for p in listeners if p not in wanted]:
        server = listeners.pop(port)
        if server is not None:
            server.shutdown()
            server.server_close()
    for port in wanted - set(listeners):
        listeners[port] = serve(port)


def run_server():
    cfg = load_config()
    name = str(cfg.get("node-name") or socket.gethostname())
    address = str(cfg.get("node-ip") or own_address())
    port = int(cfg.get("https-listen-port") or PORT)
    bind = str(cfg.get("bind-address") or "")
    join_url = str(cfg.get("server") or "")
    # embedded etcd: cluster-init, a server to join, or etcd data from an earlier start; else SQLite
    etcd_mode = truthy(cfg.get("cluster-init")) or bool(join_url) or os.path.exists(ETCD_META)
    cluster = Cluster()
    peer_host = bind if bind not in ("", "0.0.0.0", "::") else address
    etcd = cluster.etcd = Etcd(name, f"http://{peer_host}:{port}", cluster) if etcd_mode else None
    joining = etcd is not None and not etcd.members and bool(join_url)
    token = config_token(cfg) if joining else server_token(cfg)
    if not joining:
        write_token(token)
    os.makedirs(os.path.dirname(TOKEN), exist_ok=True)
    node_token = os.path.join(os.path.dirname(TOKEN), "node-token")
    if os.path.lexists(node_token) and not (os.path.islink(node_token) and os.readlink(node_token) == TOKEN):
        os.remove(node_token)  # a plain file from an older stand-in
    if not os.path.lexists(node_token):
        os.symlink(TOKEN, node_token)  # k3s keeps node-token as a link to token, for older tools
    # like k3s: the kubeconfig names the bind address, or the loopback address when none (or 0.0.0.0) is set
    api_host = bind if bind not in ("", "0.0.0.0", "::") else "127.0.0.1"
    sans = [address, *([bind] if bind not in ("", "0.0.0.0", "::") else []), *tls_sans(cfg)]

    def certificates():
        # k3s' CAs, the admin's certificate and the API's serving one, and the kubeconfig that carries them
        tls.ensure(address, socket.gethostname(), sans)
        write_kubeconfig(f"https://{api_host}:{port}", cfg)

    certificates()
    handler = make_handler(cluster, token)
    hosts = [bind] if bind else ["127.0.0.1", address]
    servers = [tls.DualServer((host, port), handler) for host in dict.fromkeys(hosts)]
    for srv in servers:
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    if etcd is not None:
        if joining:
            # listening first: the leader sends the data to a new member as soon as it has added it
            token = handler.auth["token"] = join_cluster(etcd, join_url, token, name)
            write_token(token)  # a joined server holds the cluster's token
            certificates()  # and the cluster's CAs (join_cluster kept them): its certificates follow
        elif not etcd.members:
            etcd.initialize()
        threading.Thread(target=etcd.run, daemon=True).start()
    vip = KubeVip(cluster, port, handler)

    def stop(signum, frame):
        vip.release()  # the VIP goes with the server (its kube-vip pod)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    threading.Thread(target=vip.run, daemon=True).start()
    # like k3s, the NVIDIA runtimes are looked for once, when it starts, and written to containerd's config
    runtimes = setup_containerd()
    cards = gpu_cards()
    role_labels = {"node-role.kubernetes.io/control-plane": "true", "node-role.kubernetes.io/master": "true"}
    if etcd is not None:
        role_labels["node-role.kubernetes.io/etcd"] = "true"
    me = {
        "gpus": len(cards),
        "gpu_uuids": [c["uuid"] for c in cards],
        "gpu_cards": cards,
        "name": name,
        "boot_id": boot_id(),
        "address": address,
        "labels": labels_from(cfg),
        "start": start_id(),  # config.yaml's node-label is set again once for each start
        "runtimes": runtimes,
        "version": version(),
        "role_labels": role_labels,
        # registries.yaml, read once at start as k3s does (module registry: where this node pulls images from)
        "registries": registry.load_registries(),
    }
    started = time.time()
    os.makedirs(MANIFESTS, exist_ok=True)
    metrics = {}  # HAMi's metrics listeners (module hami_metrics), started once HAMi's chart is installed
    pages = {}  # HAMi-WebUI's frontend by NodePort (module monitoring_charts), while its Service exists
    front_ends = {}  # Open WebUI by LoadBalancer port (module open_webui_chart), while its Service exists
    # the vLLM engines of the pods on this server's node (module engine)
    engines = engine.Engines(name, address)
    sd_notify(
        "READY=1"
    )  # Type=notify, as k3s: `systemctl start k3s` returns once the token and API are there
    while True:
        if etcd is None:
            cluster.register(me)
            cluster.apply_manifests()
        elif etcd.is_leader():
            cluster.register(me)
            with cluster.lock:
                cluster.state.setdefault("addons", {})[name] = manifest_docs()
            cluster.apply_manifests(etcd_addons(cluster.state, etcd.members))
        else:
            # a follower's node and manifests reach the cluster through the leader (nothing without a quorum)
            leader = etcd.leader_peer()
            with contextlib.suppress(OSError):
                if leader:
                    http_send(leader, "/gpulab/register", {**me, "token": token})
                    http_send(
                        leader, "/gpulab/etcd/addons", {"name": name, "docs": manifest_docs(), "token": token}
                    )
            time.sleep(1 if time.time() - started < 5 else HEARTBEAT_S)
            continue
        serve_hami_metrics(cluster, name, address, cards, metrics)
        serve_webui(cluster, address, pages)
        serve_open_webui(cluster, address, front_ends)
        with cluster.lock:
            pods = json.loads(json.dumps(cluster.state.get("pods") or []))
        try:
            engines.step(pods)
        except OSError as exc:  # the node's disk: the next loop tries again
            print(f'level=error msg="engine stand-in: {exc}"', file=sys.stderr, flush=True)
        if time.time() - started > 2 and "nvidia" not in cluster.state["runtimeclasses"]:
            with cluster.lock:
                for handler_name in RUNTIME_CLASSES:
                    cluster.state["runtimeclasses"][handler_name] = {
                        "apiVersion": "node.k8s.io/v1",
                        "kind": "RuntimeClass",
                        "metadata": {"name": handler_name, "creationTimestamp": now_iso()},
                        "handler": handler_name,
                    }
                cluster.save()
        time.sleep(1 if time.time() - started < 5 else HEARTBEAT_S)

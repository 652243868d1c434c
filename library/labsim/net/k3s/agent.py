"""``k3s agent`` on the stand-in.

``k3s agent`` joins the server named by ``server``/``token``/``token-file`` (config.yaml) or
``K3S_URL``/``K3S_TOKEN`` and keeps its node Ready with a heartbeat; a wrong token (401) or an unreachable
server leaves it unregistered and retrying, as with k3s. Like k3s, it looks for ``nvidia-container-runtime``
once, when it starts. With etcd it learns every server's address from the first it reaches and moves on to
the next when one does not answer (k3s' agent load balancer). A node's ``kubeletVersion`` is the release its
k3s process started with, not the binary on disk now. The ``node-label`` entries of config.yaml are set on the
node at each start of the agent, over the values it has (a label taken off with kubectl is back after the next
start; an entry taken out of config.yaml leaves its label on the node), and ``token-file`` wins over ``token``,
as with k3s. registries.yaml is read once, at start (module ``registry``: where the node's pods pull from).
"""

import json
import os
import socket
import sys
import time
import urllib.error
import urllib.request

from . import engine, hami_metrics, registry
from .common import (
    HEARTBEAT_S,
    boot_id,
    config_token,
    gpu_cards,
    labels_from,
    load_config,
    own_address,
    setup_containerd,
    start_id,
    version,
)


def server_pods(endpoint):
    """The pods the server holds (the vGPU monitor's pod lister), [] when it does not answer."""
    try:
        return json.loads(urllib.request.urlopen(f"http://{endpoint}/gpulab/pods", timeout=3).read() or b"[]")
    except (OSError, ValueError):
        return []


def node_pods(endpoint):
    """The pods the server holds, or None when it does not answer (the engines on the node stay as they are)."""
    try:
        return json.loads(urllib.request.urlopen(f"http://{endpoint}/gpulab/pods", timeout=3).read() or b"[]")
    except (OSError, ValueError):
        return None


def run_agent():
    cfg = load_config()
    url = str(cfg.get("server") or os.environ.get("K3S_URL") or "")
    token = config_token(cfg)
    if not url:
        print('level=fatal msg="--server is required"', file=sys.stderr)
        return 1
    host = url.split("://", 1)[-1].split("/", 1)[0]
    # like k3s' agent load balancer: the address it was given, then every server the cluster names, and on to
    # the next one when the one in use does not answer
    endpoints = [host]
    name = str(cfg.get("node-name") or socket.gethostname())
    # like k3s, the NVIDIA runtimes are looked for once, when it starts, and written to containerd's config
    runtimes = setup_containerd()
    me = {
        "name": name,
        "boot_id": boot_id(),
        "address": own_address(),
        "labels": labels_from(cfg),
        "start": start_id(),  # config.yaml's node-label is set again once for each start
        "runtimes": runtimes,
        "token": token,
        "version": version(),  # the release this agent runs, read when it started
        # registries.yaml, read once at start as k3s does (module registry: where this node pulls images from)
        "registries": registry.load_registries(),
    }
    cards = gpu_cards()
    me.update(gpus=len(cards), gpu_uuids=[c["uuid"] for c in cards], gpu_cards=cards)
    # HAMi's vGPU monitor on this node (module hami_metrics): started once HAMi's device plugin registered it
    monitor = {"server": None, "legacy": False}
    # the vLLM engines of the pods that run on this node (module engine)
    engines = engine.Engines(name, me["address"])
    while True:
        current = endpoints[0]
        req = urllib.request.Request(
            f"http://{current}/gpulab/register", json.dumps(me).encode(), {"Content-Type": "application/json"}
        )
        try:
            reply = json.loads(urllib.request.urlopen(req, timeout=5).read() or b"{}")
            if reply.get("hami_monitor") is not None:
                monitor["legacy"] = bool(reply["hami_monitor"].get("legacy_metrics"))
                if monitor.get("server") is None:
                    monitor["server"] = hami_metrics.serve(
                        me["address"],
                        hami_metrics.MONITOR_NODE_PORT,
                        # the server in use when the monitor is scraped (endpoints turns on failover)
                        lambda servers=endpoints: hami_metrics.monitor_families(
                            name, cards, server_pods(servers[0]), legacy=monitor["legacy"]
                        ),
                    )
            servers = [a for a in reply.get("servers") or [] if a not in endpoints]
            if servers:
                print(f'level=info msg="Adding server to load balancer k3s-agent-load-balancer: {servers}"',
                      file=sys.stderr, flush=True)  # fmt: skip
                endpoints += servers
        except urllib.error.HTTPError as exc:
            print(
                f'level=error msg="failed to get CA certs: {exc.code} {exc.reason}"',
                file=sys.stderr,
                flush=True,
            )
            if exc.code >= 500:
                endpoints.append(endpoints.pop(0))  # a server without a quorum: try the next
        except OSError as exc:
            print(f'level=error msg="failed to contact server {current}: {exc}"', file=sys.stderr, flush=True)
            endpoints.append(endpoints.pop(0))
        pods = node_pods(endpoints[0])
        if pods is not None:
            try:
                engines.step(pods)
            except OSError as exc:  # the node's disk: the next heartbeat tries again
                print(f'level=error msg="engine stand-in: {exc}"', file=sys.stderr, flush=True)
        time.sleep(HEARTBEAT_S)

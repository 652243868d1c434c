#!/usr/bin/python3
"""gpulab lab stand-in for the k3s binary: server, agent, kubectl (a small part), --version.

Served by the lab's file server (``http://ROUTER/k3s/k3s``) and installed by the lab's
``install.sh`` stand-in the way get.k3s.io installs k3s: binary in ``INSTALL_K3S_BIN_DIR``, a
systemd unit ``k3s`` or ``k3s-agent``, ``/etc/rancher/k3s/config.yaml`` read at start. Standard
library only (PyYAML when the host has it, for config.yaml).

* ``k3s server`` keeps the cluster state in ``/var/lib/rancher/k3s/server/db/gpulab-state.json``,
  writes the join token to ``/var/lib/rancher/k3s/server/token`` (``K10<hash>::server:<secret>``)
  and the kubeconfig to ``/etc/rancher/k3s/k3s.yaml``, registers itself as the control-plane node,
  creates k3s' packaged RuntimeClasses (``nvidia``, ``nvidia-experimental``, ``crun`` and the WASM
  ones) a moment after start and answers on ``https-listen-port`` (6443) of ``bind-address`` when
  config.yaml sets one, else of 127.0.0.1 and the node's lab address (plain HTTP: the stand-in's
  clients know). ``node-token`` is a symlink to ``token``, as k3s makes it.
* With ``cluster-init: true`` the server runs embedded etcd, a cluster of one member; a server whose
  config.yaml names ``server`` (the registration address) and the token joins it as a member (class
  ``Etcd``: members, leader, term and revision, replicated data, quorum, leader election). Every server
  answers the API; without a quorum (two of three servers down) the API answers ``etcdserver: request timed
  out`` and kubectl fails. Server nodes carry ``node-role.kubernetes.io/etcd``. Each server's manifests
  folder is applied, the first server's object winning where two place the same one.
* kube-vip (class ``KubeVip``): while the manifests hold kube-vip's DaemonSet with a VIP in ARP mode for the
  control plane, the server that leads (the etcd leader, standing in for the holder of kube-vip's Lease; the one
  server on SQLite) adds ``VIP/32`` to the DaemonSet's ``vip_interface`` (else its default route's), announces
  it with gratuitous ARP (AF_PACKET) and answers the API on it; a server that stops leading or stops
  (SIGTERM) lets it go, and another takes it once etcd has elected it (a few seconds). Without a quorum nobody
  holds it. ``get daemonsets`` lists the manifests' DaemonSets.
* ``k3s agent`` joins the server named by ``server``/``token``/``token-file`` (config.yaml) or
  ``K3S_URL``/``K3S_TOKEN`` and keeps its node Ready with a heartbeat; a wrong token (401) or an
  unreachable server leaves it unregistered and retrying, as with k3s. Like k3s, it looks for
  ``nvidia-container-runtime`` once, when it starts. With etcd it learns every server's address from the
  first it reaches and moves on to the next when one does not answer (k3s' agent load balancer). A node's
  ``kubeletVersion`` is the release its k3s process started with, not the binary on disk now.
* Deployments placed in the manifests folder get one pod each, placed on a node their GPU request fits
  (HAMi's vGPUs, the pinned UUIDs; not a cordoned node). A pod runs its init containers one after the other,
  then its container, which is Ready ``DEPLOY_READY_S`` after it started. The stand-in runs no images: an
  init container ends once every ``http://`` URL in its command, args or env answers, as a poll from inside
  the cluster would see it. ``NAME.NAMESPACE.svc[...]:PORT/PATH`` answers when a Service of the manifests
  has that port and selects a pod that is Ready and running, at its readiness probe's path; anything else
  does not answer, and the pod stays ``Init:0/1``, not Ready. A node that reboots (its agent comes back
  with a new ``/proc/sys/kernel/random/boot_id``) restarts its pods from their init containers; a drained
  node's pods are evicted and placed again once a node takes them (``uncordon``); a changed Deployment is
  recreated (``Recreate``). A k3s-agent restart alone leaves the pods running, as k3s' containerd does.
  The server records when each Deployment was seen, when it was first Ready, and each start of its pod
  (``deployment_history``: ``runs``, with the node's boot id), so tests can check that engines sharing a
  card started one after another, at apply and after a reboot.
* HAMi's HelmChart: where its device plugin runs (the node selector's labels, the runtime class, a card), the
  node gets ``hami.io/node-nvidia-register`` as HAMi's device plugin writes it (JSON: ``id``, ``index``,
  ``count``, ``devmem``, ``devcore``, ``type``, ``mode``, ``health``, zero values left out) from the cards
  nvidia-smi listed when the agent started (a card changed since is not seen until it restarts, as with
  HAMi's plugin), and the Deployment ``<release>-scheduler`` runs kube-scheduler from the chart's image values,
  its tag the server's version without ``+k3s1`` at the chart's install (``get deployment -o json``).
* HAMi's webhook and scheduler: a pod asking for ``nvidia.com/gpu`` goes through the webhook
  (MutatingWebhookConfiguration ``<release>-webhook``): while the scheduler Deployment has a replica it gets
  ``schedulerName: hami-scheduler`` (and the chart's runtime class); scaled to 0 (``kubectl scale``), the
  webhook does not answer and failurePolicy Ignore (the chart's default) creates it unchanged, for
  default-scheduler, while Fail refuses it. HAMi's scheduler places a pod on a card the node's register
  annotation lists (pinned UUIDs, ``count``, ``devmem``, ``devcore``) from what the other pods hold
  (``nvidia.com/gpumem``, ``gpumem-percentage``, ``gpucores``; a pod asking for no memory takes the whole card),
  writes ``hami.io/vgpu-devices-allocated`` (``UUID,NVIDIA,MiB,cores:;``) on it, or leaves it Pending with
  HAMi's reason (``1/1 CardInsufficientMemory``). ``kubectl logs`` of a container whose command runs
  ``nvidia-smi --query-gpu=memory.total`` prints the memory it sees: its share with HAMi-core on, the card's
  with ``CUDA_DISABLE_CONTROL=true`` or under default-scheduler. Also ``create|apply -f FILE|-`` (Pods, also
  ``--dry-run=server``), ``delete pod(s) NAME|-l SEL``, ``scale deployment/NAME --replicas=N``, ``get
  mutatingwebhookconfigurations``.
* ``k3s kubectl`` reaches the server named in the kubeconfig (``KUBECONFIG`` or
  ``/etc/rancher/k3s/k3s.yaml``): ``get nodes|node|runtimeclass|daemonsets`` (``-o json``, ``-o name``,
  ``-o jsonpath={.a.b}``, table; several kinds at once, ``get nodes,runtimeclass -o json``, as one List), ``get pods [NAME] [-n NS|-A] [-l KEY=VALUE]`` (``READY``, ``STATUS``
  such as ``Init:0/1`` or ``Running``, ``RESTARTS``; ``-o json``), ``label node``, ``cordon|uncordon|drain NODE``,
  ``wait --for=condition=Ready node/NAME``, ``wait --for=condition=complete job/NAME`` (a HelmChart's
  install job exists once the server has seen the chart; waiting on one that does not exist is an
  immediate NotFound, as with kubectl), ``rollout status deployment|daemonset/NAME`` (waiting up to
  ``--timeout`` like kubectl); anything else says it is not stood in. Every call is logged (JSON lines)
  to ``/var/log/gpulab-standins.log``.
* The install script stand-in (``K3S_INSTALL`` in ``repo.py``, served as ``install.sh``) writes the
  unit, env file, ``k3s-killall.sh`` and ``k3s-uninstall.sh``/``k3s-agent-uninstall.sh``, as get.k3s.io.
"""

import contextlib
import hashlib
import http.server
import io
import json
import os
import re
import secrets
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

VERSION_FILE = "/var/lib/gpulab-sim/k3s-version"
DEFAULT_VERSION = "v1.33.5+k3s1"
STATE = "/var/lib/rancher/k3s/server/db/gpulab-state.json"
TOKEN = "/var/lib/rancher/k3s/server/token"
KUBECONFIG = "/etc/rancher/k3s/k3s.yaml"
CONFIG = "/etc/rancher/k3s/config.yaml"
MANIFESTS = "/var/lib/rancher/k3s/server/manifests"
PORT = 6443
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
HEARTBEAT_S = 3
NOT_READY_AFTER_S = 40
DEPLOY_READY_S = 2
# a node whose agent has not called for this long runs nothing (its kubelet is down), whatever the API shows
ALIVE_S = 3 * HEARTBEAT_S
BOOT_ID = "/proc/sys/kernel/random/boot_id"
URL_RE = re.compile(r"http://[^\s\"']+")
LOG = "/var/log/gpulab-standins.log"


def log_call(argv, rc):
    with contextlib.suppress(OSError), open(LOG, "a") as f:
        f.write(json.dumps({"time": time.time(), "command": "k3s", "argv": argv, "rc": rc}) + "\n")


def version():
    try:
        with open(VERSION_FILE) as f:
            return f.read().strip() or DEFAULT_VERSION
    except OSError:
        return DEFAULT_VERSION


def now_iso():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def load_config():
    """config.yaml (PyYAML when present, else the flat `key: value` / `- item` subset k3s configs use)."""
    try:
        with open(CONFIG) as f:
            text = f.read()
    except OSError:
        return {}
    try:
        import yaml

        return yaml.safe_load(text) or {}
    except ImportError:
        pass
    cfg, key = {}, None
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        if line.lstrip().startswith("- ") and key:
            cfg.setdefault(key, []).append(line.strip()[2:].strip().strip("'\""))
            continue
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip().strip("'\"")
        cfg[key] = value if value else []
    return cfg


def own_address():
    """The node's lab address (its global IPv4 address)."""
    import subprocess

    out = subprocess.run(["ip", "-4", "-j", "addr"], capture_output=True, text=True).stdout
    for link in json.loads(out or "[]"):
        for a in link.get("addr_info", []):
            if a.get("scope") == "global":
                return a["local"]
    return "127.0.0.1"


def gpu_cards():
    """The cards nvidia-smi lists (none without a working driver): UUID, name and total MiB, read once at start
    like HAMi's device plugin reads them through NVML."""
    import subprocess

    query = ["nvidia-smi", "--query-gpu=uuid,name,memory.total", "--format=csv,noheader,nounits"]
    try:
        proc = subprocess.run(query, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    cards = []
    for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 3 and fields[0].startswith("GPU-"):
            mib = int(fields[2]) if fields[2].isdigit() else 0
            cards.append({"uuid": fields[0], "name": fields[1], "memory_mib": mib})
    return cards


def register_annotation(cards, split, memory_scaling=1, core_scaling=1):
    """`hami.io/node-nvidia-register` as HAMi's device plugin writes it (JSON since 2.8.0): per card id, index,
    count, devmem, devcore, type, mode, health, in that order, Go's omitempty leaving out zero values."""
    out = []
    for index, card in enumerate(cards):
        name = card.get("name") or ""
        entry = {
            "id": card["uuid"],
            "index": index,
            "count": split,
            "devmem": int(card.get("memory_mib", 0) * memory_scaling),
            "devcore": int(100 * core_scaling),
            "type": name if name.startswith("NVIDIA") else f"NVIDIA-{name}",
            "mode": "hami-core",
            "health": True,
        }
        out.append({k: v for k, v in entry.items() if v not in (0, "", False, None)})
    return json.dumps(out, separators=(",", ":"))


def stripped_version(v):
    """HAMi's chart takes the kube-scheduler tag from the server's version without `+k3s1`."""
    m = re.match(r"^(v\d+\.\d+\.\d+)", v)
    return m[1] if m else v


def kube_scheduler_image(values, server_version):
    """The kube-scheduler image HAMi's chart renders: global.imageRegistry over the image's registry, the tag
    from the values or else the server's version (`resolvedKubeSchedulerTag`)."""
    image = ((values.get("scheduler") or {}).get("kubeScheduler") or {}).get("image") or {}
    registry = (
        (values.get("global") or {}).get("imageRegistry")
        or image.get("registry")
        or ("registry.cn-hangzhou.aliyuncs.com")
    )
    repository = image.get("repository") or "google_containers/kube-scheduler"
    tag = str(image.get("tag") or "").strip() or stripped_version(server_version)
    return f"{registry}/{repository}:{tag}"


def boot_id():
    """This boot of the host (a new one after each reboot)."""
    try:
        with open(BOOT_ID) as f:
            return f.read().strip()
    except OSError:
        return ""


def labels_from(cfg):
    labels = {}
    items = cfg.get("node-label") or []
    for item in [items] if isinstance(items, str) else items:
        k, _, v = str(item).partition("=")
        labels[k] = v
    return labels


def init_urls(container):
    """The http:// URLs an init container polls: those named in its command, args or env."""
    words = [*(container.get("command") or []), *(container.get("args") or [])]
    words += [str(e.get("value", "")) for e in container.get("env") or []]
    return [u for w in words for u in URL_RE.findall(str(w))]


def pod_object(pod):
    """A pod of the model as `kubectl get pod -o json` shows it (the parts the lab reads)."""
    inits, passed = pod["init"], pod["init_passed"]
    running = pod["started"] is not None
    ready = pod["ready"] is not None
    init_statuses = [
        {
            "name": n,
            "ready": i < passed,
            "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}
            if i < passed
            else (
                {"running": {}} if i == passed and pod["node"] else {"waiting": {"reason": "PodInitializing"}}
            ),
        }
        for i, n in enumerate(inits)
    ]
    statuses = [
        {
            "name": n,
            "ready": ready,
            "started": running,
            "restartCount": pod["restarts"],
            "state": {"running": {}} if running else {"waiting": {"reason": "PodInitializing"}},
        }
        for n in pod["containers"]
    ]

    def cond(kind, ok):
        return {"type": kind, "status": "True" if ok else "False"}

    scheduled = cond("PodScheduled", pod["node"] is not None)
    if pod["node"] is None and pod.get("reason"):
        scheduled.update(reason="Unschedulable", message=pod["reason"])
    spec = pod.get("spec") or {}
    containers = {c.get("name"): c for c in spec.get("containers") or []}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod["name"], "namespace": pod["namespace"], "labels": pod["labels"],
                     "annotations": pod.get("annotations") or {}},
        "spec": {"nodeName": pod["node"], "schedulerName": pod.get("scheduler") or "default-scheduler",
                 **({"runtimeClassName": spec["runtimeClassName"]} if spec.get("runtimeClassName") else {}),
                 "initContainers": [{"name": n} for n in inits],
                 "containers": [{"name": n, **{k: v for k, v in containers.get(n, {}).items()
                                               if k in ("image", "resources", "env", "command", "args")}}
                                for n in pod["containers"]]},
        "status": {
            "phase": "Running" if running else "Pending",
            "conditions": [
                scheduled,
                cond("Initialized", passed >= len(inits)),
                cond("ContainersReady", ready),
                cond("Ready", ready),
            ],
            "initContainerStatuses": init_statuses,
            "containerStatuses": statuses,
        },
    }  # fmt: skip


def pod_status(pod):
    """kubectl's STATUS column: Pending, Init:N/M, PodInitializing, Running."""
    if pod["node"] is None:
        return "Pending"
    if pod["init_passed"] < len(pod["init"]):
        return f"Init:{pod['init_passed']}/{len(pod['init'])}"
    return "Running" if pod["started"] is not None else "PodInitializing"


HAMI_SCHEDULER = "hami-scheduler"
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores")


def gpu_request(spec):
    """A pod's NVIDIA request, summed over its containers: count, gpumem (MiB), gpumem-percentage, gpucores."""
    out = {"count": 0, "mem": 0, "percent": 0, "cores": 0}
    for c in spec.get("containers") or []:
        res = c.get("resources") or {}
        limits = {**(res.get("requests") or {}), **(res.get("limits") or {})}
        out["count"] += int(limits.get("nvidia.com/gpu", 0) or 0)
        out["mem"] += int(limits.get("nvidia.com/gpumem", 0) or 0)
        out["percent"] += int(limits.get("nvidia.com/gpumem-percentage", 0) or 0)
        out["cores"] += int(limits.get("nvidia.com/gpucores", 0) or 0)
    return out


def hami_core_on(spec):
    """HAMi-core limits a container unless its env sets CUDA_DISABLE_CONTROL=true (server.go)."""
    return not any(
        e.get("name") == "CUDA_DISABLE_CONTROL" and str(e.get("value")).lower() == "true"
        for c in spec.get("containers") or []
        for e in c.get("env") or []
    )


def decode_allocated(text):
    """`hami.io/vgpu-devices-allocated`: `UUID,TYPE,usedmem,usedcores:` per card, `;` between containers."""
    out = []
    for container in (text or "").split(";"):
        for item in container.split(":"):
            fields = item.split(",")
            if len(fields) == 4 and fields[0]:
                out.append(
                    {"uuid": fields[0], "type": fields[1], "mem": int(fields[2]), "cores": int(fields[3])}
                )
    return out


def webhook_configuration(hami):
    """HAMi's MutatingWebhookConfiguration (chart template scheduler/webhook.yaml), as the stand-in keeps it."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": f"{hami['release']}-webhook"},
        "webhooks": [{
            "name": "vgpu.hami.io",
            "failurePolicy": hami["failure_policy"],
            "sideEffects": "None",
            "admissionReviewVersions": ["v1beta1"],
            "clientConfig": {"service": {"name": f"{hami['release']}-scheduler", "namespace": hami["namespace"],
                                         "path": "/webhook", "port": 443}},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
        }],
    }  # fmt: skip


def scheduler_deployment(name, namespace, kube_scheduler, chart_version):
    """HAMi's scheduler Deployment (kubectl get deployment -o json): its two containers and their images."""
    hami = f"docker.io/projecthami/hami:v{chart_version or '2.10.0'}"
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"app.kubernetes.io/component": name}},
        "spec": {"replicas": 1, "template": {"spec": {
            "schedulerName": "default-scheduler",
            "containers": [{"name": "kube-scheduler", "image": kube_scheduler},
                           {"name": "vgpu-scheduler-extender", "image": hami}]}}},
        "status": {"replicas": 1, "readyReplicas": 1, "availableReplicas": 1},
    }  # fmt: skip


def node_object(name, node):
    ready = time.time() - node["heartbeat"] < NOT_READY_AFTER_S
    labels = {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        **node.get("labels", {}),
    }
    cond = {
        "type": "Ready",
        "status": "True" if ready else "Unknown",
        "reason": "KubeletReady" if ready else "NodeStatusUnknown",
        "message": "kubelet is posting ready status" if ready else "Kubelet stopped posting node status.",
        "lastHeartbeatTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(node["heartbeat"])),
    }
    res = {"cpu": str(node.get("cpus", 1)), "memory": f"{node.get('memory_kib', 1048576)}Ki", "pods": "110"}
    if node.get("vgpus"):
        res["nvidia.com/gpu"] = str(node["vgpus"])
    annotations = {"gpulab.lab/runtimes": ",".join(node.get("runtimes", []))}
    if node.get("hami_register"):
        annotations["hami.io/node-nvidia-register"] = node["hami_register"]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": annotations,
            "creationTimestamp": node.get("created", now_iso()),
        },
        "spec": {
            "podCIDR": node.get("pod_cidr", "10.42.0.0/24"),
            **(
                {
                    "unschedulable": True,
                    "taints": [{"effect": "NoSchedule", "key": "node.kubernetes.io/unschedulable"}],
                }
                if node.get("unschedulable")
                else {}
            ),
        },
        "status": {
            "conditions": [cond],
            "addresses": [
                {"type": "InternalIP", "address": node["address"]},
                {"type": "Hostname", "address": name},
            ],
            "capacity": res,
            "allocatable": res,
            "nodeInfo": {
                "architecture": "amd64",
                "containerRuntimeVersion": "containerd://2.0.5-k3s2",
                "kubeletVersion": node.get("version", version()),
                "kubeProxyVersion": node.get("version", version()),
                "operatingSystem": "linux",
                "osImage": "Ubuntu 24.04.3 LTS",
            },
        },
    }


# --- server -------------------------------------------------------------------------------------------------


def manifest_docs():
    """The objects of this server's manifests folder (k3s' deploy controller reads it)."""
    import yaml

    docs = []
    with contextlib.suppress(OSError):
        for fname in sorted(os.listdir(MANIFESTS)):
            if fname.endswith((".yaml", ".yml")):
                with open(os.path.join(MANIFESTS, fname)) as f, contextlib.suppress(yaml.YAMLError):
                    docs += [d for d in yaml.safe_load_all(f) if isinstance(d, dict)]
    return docs


class Cluster:
    def __init__(self, path=None):
        self.lock = threading.Lock()
        self.path = path or STATE
        # embedded etcd (class Etcd) when the server runs with cluster-init or joined one; None on SQLite
        self.etcd = None
        try:
            with open(self.path) as f:
                self.state = json.load(f)
        except (OSError, ValueError):
            self.state = {"nodes": {}, "runtimeclasses": {}, "daemonsets": []}

    def save(self):
        if self.etcd is not None:
            # a write through etcd's leader: a new revision, sent to the other members at once
            self.state["revision"] = self.state.get("revision", 0) + 1
            self.etcd.wake.set()
        self.write()

    def write(self):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path + ".tmp", "w") as f:
            json.dump(self.state, f)
        os.replace(self.path + ".tmp", self.path)

    def replace(self, state):
        """A member's copy of the data, as its leader sent it."""
        with self.lock:
            self.state = state
            self.write()

    def apply_manifests(self, docs=None):
        """The HelmCharts in the manifests folder (or `docs`: with etcd, every server's folder), as k3s' helm
        controller would leave them installed.

        Only HAMi's shape is modelled: the install job completes, the device-plugin DaemonSet and the
        scheduler Deployment roll out, and every node that matches the device plugin's node selector, runs
        the chart's runtime class and has GPUs offers deviceSplitCount x its cards as nvidia.com/gpu.
        """
        import yaml

        docs = manifest_docs() if docs is None else docs
        charts = [d for d in docs if d.get("kind") == "HelmChart"]
        with self.lock:
            seen = self.state.setdefault("charts_seen", {})
            jobs, daemonsets, deployments, vgpus, present, objects = {}, [], {}, {}, set(), {}
            hami = None
            for chart in charts:
                meta, spec = chart.get("metadata", {}), chart.get("spec", {})
                name, ns = meta.get("name", "chart"), meta.get("namespace", "kube-system")
                target = spec.get("targetNamespace") or ns
                present.add(f"{ns}/{name}")
                first = seen.setdefault(f"{ns}/{name}", time.time())
                if time.time() - first < 2:
                    continue  # the install job runs for a moment
                values = yaml.safe_load(spec.get("valuesContent") or "") or {}
                plugin = values.get("devicePlugin") or {}
                split = int(plugin.get("deviceSplitCount", 10))
                selector = plugin.get("nvidiaNodeSelector") or {"gpu": "on"}
                runtime = plugin.get("runtimeClassName")
                jobs[f"{ns}/helm-install-{name}"] = {"complete": True}
                image = "docker.io/projecthami/hami:v2.7.0"
                containers = [
                    {"name": "device-plugin", "image": image},
                    {"name": "vgpu-monitor", "image": image},
                ]
                daemonsets.append(
                    {
                        "apiVersion": "apps/v1",
                        "kind": "DaemonSet",
                        "metadata": {"name": f"{name}-device-plugin", "namespace": target},
                        "spec": {"template": {"spec": {"containers": containers}}},
                    }
                )
                deployments[f"{target}/{name}-scheduler"] = {"ready": True}
                # the chart renders the kube-scheduler tag from the server's version when it is installed
                # (again only when the HelmChart changes, as k3s' helm controller does)
                digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
                installed = self.state.setdefault("charts_installed", {})
                if (installed.get(f"{ns}/{name}") or {}).get("digest") != digest:
                    installed[f"{ns}/{name}"] = {"digest": digest, "kube_version": version()}
                kube_version = installed[f"{ns}/{name}"]["kube_version"]
                objects[f"{target}/{name}-scheduler"] = scheduler_deployment(
                    f"{name}-scheduler",
                    target,
                    kube_scheduler_image(values, kube_version),
                    spec.get("version"),
                )
                scaling = float(plugin.get("deviceMemoryScaling", 1) or 1)
                webhook = ((values.get("scheduler") or {}).get("admissionWebhook")) or {}
                hami = {
                    "release": name,
                    "namespace": target,
                    "runtime": runtime,
                    "failure_policy": webhook.get("failurePolicy") or "Ignore",
                    "enabled": webhook.get("enabled", True) is not False,
                }
                replicas = self.state.get("scaled", {}).get(f"{target}/{name}-scheduler", 1)
                objects[f"{target}/{name}-scheduler"]["spec"]["replicas"] = replicas
                if replicas == 0:
                    objects[f"{target}/{name}-scheduler"]["status"] = {"replicas": 0}
                for node_name, node in self.state["nodes"].items():
                    labels = node.get("labels", {})
                    matches = all(str(labels.get(k)) == str(v) for k, v in selector.items())
                    if (
                        matches
                        and node.get("gpus")
                        and (runtime is None or runtime in node.get("runtimes", []))
                    ):
                        vgpus[node_name] = node["gpus"] * split
                        # the device plugin registers the cards it found when it started (the agent's)
                        node["hami_register"] = register_annotation(node.get("gpu_cards", []), split, scaling)
            for key in [k for k in seen if k not in present]:
                del seen[key]  # a chart taken out is uninstalled
            for node_name, node in self.state["nodes"].items():
                node["vgpus"] = vgpus.get(node_name, 0)
            self.state["hami"] = hami
            for doc in docs:  # a DaemonSet of the manifests (kube-vip's) is listed as placed
                if doc.get("kind") == "DaemonSet" and (doc.get("metadata") or {}).get("name"):
                    meta = doc["metadata"]
                    template = ((doc.get("spec") or {}).get("template") or {}).get("spec") or {}
                    daemonsets.append(
                        {
                            "apiVersion": "apps/v1",
                            "kind": "DaemonSet",
                            "metadata": {"name": meta["name"], "namespace": meta.get("namespace", "default")},
                            "spec": {"template": {"spec": {"containers": template.get("containers") or []}}},
                        }
                    )
            deployments.update(self.run_pods(docs))
            self.step_direct_pods()
            self.state.update(
                jobs=jobs, daemonsets=daemonsets, deployments=deployments, deployment_objects=objects
            )
            self.save()

    # --- pods of the Deployments (called with the lock held) -------------------------------------

    def run_pods(self, docs):
        """One step of every Deployment's pod; their rollout status by `namespace/name`."""
        history = self.state.setdefault("deployment_history", {})
        found = {}
        for doc in docs:
            if doc.get("kind") == "Deployment":
                meta = doc.get("metadata", {})
                found[f"{meta.get('namespace', 'default')}/{meta.get('name')}"] = doc
        self.current_keys = set(found)
        services = {
            (d.get("metadata", {}).get("namespace", "default"), d.get("metadata", {}).get("name")): d
            for d in docs
            if d.get("kind") == "Service"
        }
        now, out, pods = time.time(), {}, []
        for key, doc in found.items():
            digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]
            entry = history.get(key)
            if entry is None or entry["digest"] != digest:
                # a new or changed Deployment rolls out again (Recreate: the old pod goes first)
                entry = history[key] = {
                    "digest": digest,
                    "seen": now,
                    "ready_at": None,
                    "runs": [],
                    "pod": None,
                }
            if str((doc.get("spec") or {}).get("replicas", 1)) == "0":
                entry["pod"] = None
                out[key] = {"ready": True, "seen": entry["seen"], "ready_at": entry["ready_at"]}
                continue
            pod = self.step_pod(key, doc, entry, found, services, now)
            pods.append(pod)
            ready = pod["ready"] is not None
            out[key] = {
                "ready": ready,
                "seen": entry["seen"],
                "ready_at": entry["ready_at"],
                "pod": pod["name"],
            }
        self.state["pods"] = pods
        return out

    def alive(self, node_name):
        """Whether a node runs its pods now: its agent (kubelet) called lately."""
        node = self.state["nodes"].get(node_name or "")
        return bool(node) and time.time() - node.get("heartbeat", 0) < ALIVE_S

    def step_pod(self, key, doc, entry, found, services, now):
        """Move a Deployment's pod on by one step: placed, rebooted or evicted, init containers, started, Ready."""
        ns, name = key.split("/", 1)
        template = (doc.get("spec") or {}).get("template") or {}
        spec = template.get("spec") or {}
        inits = spec.get("initContainers") or []
        pod = entry.get("pod")
        node = self.state["nodes"].get(pod["node"]) if pod and pod.get("node") else None
        if pod and pod.get("node") and (node is None or node.get("drained", 0) > pod["created"]):
            pod = None  # evicted by a drain (or its node is gone): a new pod is made and placed again
        if pod is None:
            suffix = "".join(secrets.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))
            pod = entry["pod"] = {
                "name": f"{name}-{entry['digest'][:10]}-{suffix}",
                "namespace": ns,
                "labels": dict((template.get("metadata") or {}).get("labels") or {}),
                "init": [c.get("name") for c in inits],
                "containers": [c.get("name") for c in spec.get("containers") or []],
                "node": None,
                "boot": None,
                "created": now,
                "init_passed": 0,
                "started": None,
                "ready": None,
                "restarts": 0,
            }
            annotations = dict((template.get("metadata") or {}).get("annotations") or {})
            scheduler, _refused, mutated = self.admit(ns, spec)
            pod.update(annotations=annotations, scheduler=scheduler, spec=mutated)
        if pod["node"] is None:
            if pod.get("scheduler") == HAMI_SCHEDULER and gpu_request(spec)["count"]:
                if not self.hami_schedule(pod):
                    return pod  # Pending, with HAMi's reason
                target = pod["node"]
            else:
                target = self.placement(doc)
                if target is None:
                    return pod  # Pending
            pod.update(node=target, boot=self.state["nodes"][target].get("boot_id"))
        node = self.state["nodes"][pod["node"]]
        if not self.alive(pod["node"]):
            return pod  # the node is down: nothing runs, and the API keeps showing the last status
        if node.get("boot_id") != pod["boot"]:
            # the node rebooted: the pod's sandbox is gone, its init containers and its container run again
            pod.update(boot=node.get("boot_id"), init_passed=0, started=None, ready=None)
            pod["restarts"] += 1
        while pod["init_passed"] < len(inits):
            urls = init_urls(inits[pod["init_passed"]])
            if not all(self.answers(url, found, services) for url in urls):
                return pod  # Init:N/M, not Ready
            pod["init_passed"] += 1
        if pod["started"] is None:
            pod["started"] = now
        if pod["ready"] is None and now - pod["started"] >= DEPLOY_READY_S:
            pod["ready"] = now
            entry["runs"].append(
                {"pod": pod["name"], "boot": pod["boot"], "started": pod["started"], "ready": now}
            )
            if entry["ready_at"] is None:
                entry["ready_at"] = now
        return pod

    def answers(self, url, found, services):
        """Whether a poll of `url` from inside the cluster gets a 2xx: a Service's port, a Ready running pod
        behind it, the path of that pod's readiness probe."""
        m = re.match(r"^http://([^/:]+)(?::(\d+))?(/[^?#]*)?", url)
        if not m:
            return False
        parts = m[1].split(".")
        if len(parts) < 2 or (len(parts) > 2 and parts[2] != "svc"):
            return False  # not a Service name this model resolves
        svc = services.get((parts[1], parts[0]))
        if svc is None:
            return False  # NXDOMAIN
        port = int(m[2] or 80)
        svc_spec = svc.get("spec") or {}
        sport = next((p for p in svc_spec.get("ports") or [] if int(p.get("port", 0)) == port), None)
        if sport is None:
            return False
        selector = svc_spec.get("selector") or {}
        for key, doc in found.items():
            if key.split("/", 1)[0] != parts[1]:
                continue
            template = (doc.get("spec") or {}).get("template") or {}
            labels = (template.get("metadata") or {}).get("labels") or {}
            if not selector or any(labels.get(k) != v for k, v in selector.items()):
                continue
            pod = (self.state.get("deployment_history", {}).get(key) or {}).get("pod")
            node = self.state["nodes"].get((pod or {}).get("node") or "")
            if (
                not pod
                or pod["ready"] is None
                or not self.alive(pod["node"])
                or node.get("boot_id") != pod["boot"]
            ):
                continue
            for c in (template.get("spec") or {}).get("containers") or []:
                target = sport.get("targetPort", port)
                ports = c.get("ports") or []
                if not any(target in (p.get("name"), p.get("containerPort")) for p in ports):
                    continue
                probe = ((c.get("readinessProbe") or {}).get("httpGet") or {}).get("path")
                path = m[3] or "/"
                if probe is None or "/" + str(probe).lstrip("/") == path:
                    return True
        return False

    # --- HAMi: its webhook and its scheduler's card accounting (called with the lock held) ----------------

    def webhook_answers(self):
        """Whether HAMi's mutating webhook answers: the chart is installed and its scheduler has a replica."""
        hami = self.state.get("hami")
        if not hami or not hami.get("enabled"):
            return False
        key = f"{hami['namespace']}/{hami['release']}-scheduler"
        return self.state.get("scaled", {}).get(key, 1) != 0

    def admit(self, namespace, spec):
        """A pod created now, through HAMi's webhook: (its schedulerName, the refusal or None, its spec).

        The webhook sends a pod asking for NVIDIA resources to hami-scheduler (and sets the chart's
        runtimeClassName when the pod has none). When it does not answer, failurePolicy Ignore (the chart's
        default) creates the pod as it is, for default-scheduler: the fail-open HAMi users report; Fail refuses it.
        """
        spec = json.loads(json.dumps(spec))
        wanted = spec.get("schedulerName") or "default-scheduler"
        if not gpu_request(spec)["count"] or wanted != "default-scheduler":
            return wanted, None, spec
        hami = self.state.get("hami")
        if hami and hami.get("enabled") and not self.webhook_answers():
            if hami["failure_policy"] == "Fail":
                svc = f"{hami['release']}-scheduler.{hami['namespace']}.svc"
                return (
                    wanted,
                    (
                        f'Internal error occurred: failed calling webhook "vgpu.hami.io": failed to call webhook: '
                        f'Post "https://{svc}:443/webhook?timeout=10s": no endpoints available for service '
                        f'"{hami["release"]}-scheduler"'
                    ),
                    spec,
                )
            return wanted, None, spec
        if not hami or not hami.get("enabled"):
            return wanted, None, spec
        spec["schedulerName"] = HAMI_SCHEDULER
        if hami.get("runtime") and not spec.get("runtimeClassName"):
            spec["runtimeClassName"] = hami["runtime"]
        return HAMI_SCHEDULER, None, spec

    def gpu_pods(self):
        """Every pod that holds an allocation now (the Deployments' and the ones created with kubectl)."""
        keys = getattr(self, "current_keys", set(self.state.get("deployment_history", {})))
        history = self.state.get("deployment_history", {})
        pods = [(history[k] or {}).get("pod") for k in keys if k in history]
        return [p for p in pods + list(self.state.get("direct_pods", {}).values()) if p]

    def hami_schedule(self, pod):
        """HAMi's filter for one pod: the first node with cards that fit (count, memory, cores, pinned UUIDs).
        Placed: node, annotations hami.io/vgpu-node and vgpu-devices-allocated, the memory its container sees.
        Not: the pod's reason, as HAMi's extender reports it."""
        spec, ann = pod.get("spec") or {}, pod.get("annotations") or {}
        req = gpu_request(spec)
        pins = [u.strip() for u in str(ann.get("nvidia.com/use-gpuuuid", "")).split(",") if u.strip()]
        used = {}
        for other in self.gpu_pods():
            if other is pod or other.get("node") is None:
                continue
            for a in decode_allocated((other.get("annotations") or {}).get("hami.io/vgpu-devices-allocated")):
                u = used.setdefault(a["uuid"], {"mem": 0, "cores": 0, "count": 0})
                u["mem"] += a["mem"]
                u["cores"] += a["cores"]
                u["count"] += 1
        reasons, candidates = {}, 0
        for name, node in sorted(self.state["nodes"].items()):
            if node.get("unschedulable") or not self.alive(name) or not node.get("hami_register"):
                continue
            candidates += 1
            picked, why = [], {}
            for card in json.loads(node["hami_register"]):
                u = used.get(card["id"], {"mem": 0, "cores": 0, "count": 0})
                mem = req["mem"] or (
                    card["devmem"] * req["percent"] // 100 if req["percent"] else card["devmem"]
                )
                if pins and card["id"] not in pins:
                    why["CardUuidMismatch"] = why.get("CardUuidMismatch", 0) + 1
                elif u["count"] >= card.get("count", 10):
                    why["CardTimeSlicingExhausted"] = why.get("CardTimeSlicingExhausted", 0) + 1
                elif u["mem"] + mem > card["devmem"]:
                    why["CardInsufficientMemory"] = why.get("CardInsufficientMemory", 0) + 1
                elif u["cores"] + req["cores"] > card.get("devcore", 100):
                    why["CardInsufficientCore"] = why.get("CardInsufficientCore", 0) + 1
                else:
                    picked.append((card, mem))
                if len(picked) == req["count"]:
                    break
            if len(picked) == req["count"]:
                allocated = "".join(f"{c['id']},NVIDIA,{m},{req['cores']}:" for c, m in picked) + ";"
                core = hami_core_on(spec)
                pod["annotations"] = {
                    **ann,
                    "hami.io/vgpu-node": name,
                    "hami.io/vgpu-time": str(int(time.time())),
                    "hami.io/vgpu-devices-to-allocate": ";",
                    "hami.io/vgpu-devices-allocated": allocated,
                    "hami.io/bind-phase": "success",
                }
                pod.update(
                    node=name, reason=None, visible_mib=[m if core else c["devmem"] for c, m in picked]
                )
                return True
            cards = len(json.loads(node["hami_register"]))
            reasons[name] = (
                ", ".join(f"{n}/{cards} {r}" for r, n in sorted(why.items())) or "NodeInsufficientDevice"
            )
        detail = "; ".join(f"{n}: {r}" for n, r in reasons.items())
        pod["reason"] = (
            f"0/{len(self.state['nodes'])} nodes are available: no available node, {candidates} nodes do not meet"
            + (f" ({detail})" if detail else "")
        )
        return False

    def create_pods(self, docs, dry_run):
        """kubectl create -f: each Pod through the webhook, then (not in a dry run) kept and scheduled."""
        made = []
        direct = self.state.setdefault("direct_pods", {})
        for doc in docs:
            meta = doc.get("metadata") or {}
            ns, name = meta.get("namespace") or "default", meta.get("name")
            if doc.get("kind") != "Pod" or not name:
                return None, f"the stand-in creates Pods only, not {doc.get('kind')} {name}"
            if f"{ns}/{name}" in direct and not dry_run:
                return None, f'pods "{name}" already exists'
            scheduler, refused, spec = self.admit(ns, doc.get("spec") or {})
            if refused:
                return None, refused
            pod = {
                "name": name, "namespace": ns, "labels": dict(meta.get("labels") or {}),
                "annotations": dict(meta.get("annotations") or {}), "spec": spec, "scheduler": scheduler,
                "init": [], "init_passed": 0, "containers": [c.get("name") for c in spec.get("containers") or []],
                "node": None, "boot": None, "created": time.time(), "started": None, "ready": None,
                "restarts": 0, "reason": None, "direct": True,
            }  # fmt: skip
            if not dry_run:
                direct[f"{ns}/{name}"] = pod
            made.append(pod)
        if not dry_run:
            self.step_direct_pods()
            self.save()
        return made, None

    def step_direct_pods(self):
        """The kubectl-created pods: scheduled (HAMi's or the default scheduler), then running."""
        for pod in self.state.get("direct_pods", {}).values():
            if pod["node"] is None:
                req = gpu_request(pod["spec"])
                if pod["scheduler"] == HAMI_SCHEDULER and req["count"]:
                    if not self.hami_schedule(pod):
                        continue
                else:
                    name = next((n for n, v in sorted(self.state["nodes"].items()) if self.alive(n)
                                 and not v.get("unschedulable") and v.get("vgpus", 0) >= req["count"]), None)  # fmt: skip
                    if name is None:
                        pod["reason"] = (
                            f"0/{len(self.state['nodes'])} nodes are available: Insufficient nvidia.com/gpu"
                        )
                        continue
                    card = (self.state["nodes"][name].get("gpu_cards") or [{}])[0]
                    pod.update(
                        node=name, reason=None, visible_mib=[card.get("memory_mib", 0)] * max(req["count"], 1)
                    )
                pod["boot"] = self.state["nodes"][pod["node"]].get("boot_id")
            if pod["started"] is None and self.alive(pod["node"]):
                pod["started"] = pod["ready"] = time.time()

    def delete_pods(self, namespace, names, selector):
        direct = self.state.get("direct_pods", {})
        gone = []
        for key, pod in list(direct.items()):
            if pod["namespace"] != namespace:
                continue
            if (names and pod["name"] in names) or (
                selector and all(pod["labels"].get(k) == v for k, v in selector.items())
            ):
                gone.append(direct.pop(key)["name"])
        self.save()
        return gone

    def placement(self, deployment):
        """The node a Deployment's pod runs on, or None (Pending): GPU requests need HAMi's vGPUs, a pinned
        UUID that card; a cordoned node takes no new pods."""
        template = (deployment.get("spec") or {}).get("template") or {}
        annotations = (template.get("metadata") or {}).get("annotations") or {}
        wanted = 0
        for c in (template.get("spec") or {}).get("containers") or []:
            limits = ((c.get("resources") or {}).get("limits")) or {}
            wanted += int(limits.get("nvidia.com/gpu", 0) or 0)
        pins = [u.strip() for u in str(annotations.get("nvidia.com/use-gpuuuid", "")).split(",") if u.strip()]
        for name, node in sorted(self.state["nodes"].items()):
            if node.get("unschedulable") or not self.alive(name):
                continue
            if not wanted or (
                node.get("vgpus", 0) >= wanted and all(u in node.get("gpu_uuids", []) for u in pins)
            ):
                return name
        return None

    def register(self, info):
        with self.lock:
            nodes = self.state["nodes"]
            node = nodes.setdefault(info["name"], {"created": now_iso(), "labels": {}})
            # node-label applies when a node registers; later `kubectl label` changes stay
            if not node.get("registered"):
                node["labels"].update(info.get("labels", {}))
                node["registered"] = True
            node.update(
                gpus=int(info.get("gpus", 0)),
                gpu_uuids=list(info.get("gpu_uuids", [])),
                gpu_cards=list(info.get("gpu_cards", [])),
                address=info["address"],
                heartbeat=time.time(),
                runtimes=info.get("runtimes", []),
                boot_id=info.get("boot_id", ""),
                # the release the node's k3s runs (read when it started), not the binary on disk now
                version=info.get("version") or version(),
                pod_cidr=f"10.42.{sorted(nodes).index(info['name'])}.0/24",
            )
            for k, v in info.get("role_labels", {}).items():
                node["labels"][k] = v
            self.save()


def server_token(cfg):
    secret = str(cfg.get("token") or "")
    if not secret:
        try:
            with open(TOKEN) as f:
                return f.read().strip()
        except OSError:
            secret = secrets.token_hex(16)
    ca_hash = hashlib.sha256(f"gpulab-lab-ca:{socket.gethostname()}".encode()).hexdigest()
    return secret if secret.startswith("K10") else f"K10{ca_hash}::server:{secret}"


def token_ok(given, token):
    given = (given or "").strip()
    return bool(given) and (given == token or given == token.split("::server:", 1)[-1])


ETCD_META = "/var/lib/rancher/k3s/server/db/etcd/gpulab-member.json"
ETCD_TICK_S = 1
# etcd's election timeout (and its leader's CheckQuorum): a follower that has not heard its leader for this long
# starts an election; a leader that has not reached a quorum of members for this long steps down
ELECTION_S = 3
NO_QUORUM = "etcdserver: request timed out"


def http_send(peer, path, body=None, timeout=1.0):
    """One request to another server (`http://host:port`): (status, JSON reply); OSError when it does not answer."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{peer}{path}", data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read() or b"{}")
        except ValueError:
            return exc.code, {}


class Etcd:
    """k3s' embedded etcd, as far as the lab relies on it.

    A server started with ``cluster-init`` makes a one-member cluster; a server whose config.yaml names
    ``server`` (the registration address) and the cluster token joins through that address and is added as a
    member (``/gpulab/etcd/join``; a wrong token is 401 and a server without etcd refuses, as k3s does). The
    members' list and term live in ``ETCD_META``; every member keeps a copy of the data (``STATE``).

    One member leads: only it writes, every change is a new ``revision`` sent to the others
    (``/gpulab/etcd/append``, also every ``ETCD_TICK_S`` as raft's heartbeat). A follower answers the API by
    asking its leader; without a leader (no quorum: fewer than ``len(members) // 2 + 1`` members answer) the
    API answers ``etcdserver: request timed out`` and kubectl fails. A follower that has not heard its leader
    for ``ELECTION_S`` holds an election among the members that answer, if they are a quorum: the one with
    the newest revision (the first to have joined among equals) takes the next term, as raft elects a member
    whose log is up to date. A leader that reaches no quorum for ``ELECTION_S`` steps down (CheckQuorum).
    No partitions are modelled: a member either answers everyone or is down. ``/gpulab/etcd/status`` shows a
    member's view (name, leader, term, revision, members), for the tests.

    ``send(peer, path, body)`` and ``clock`` are the network and the time, so the tests can step it.
    """

    def __init__(self, name, peer, cluster, send=http_send, clock=time.time, meta=ETCD_META):
        self.name, self.peer, self.cluster = name, peer, cluster
        self.send, self.clock, self.meta = send, clock, meta
        self.lock = threading.RLock()
        self.wake = threading.Event()
        try:
            with open(meta) as f:
                saved = json.load(f)
        except (OSError, ValueError):
            saved = {}
        self.members = saved.get("members", [])
        self.term = saved.get("term", 0)
        self.leader = None
        self.leader_seen = self.quorum_seen = 0.0

    def persist(self):
        os.makedirs(os.path.dirname(self.meta), exist_ok=True)
        with open(self.meta + ".tmp", "w") as f:
            json.dump({"name": self.name, "members": self.members, "term": self.term}, f)
        os.replace(self.meta + ".tmp", self.meta)

    def quorum(self):
        return len(self.members) // 2 + 1

    def revision(self):
        return self.cluster.state.get("revision", 0)

    def is_leader(self):
        return self.leader == self.name

    def peer_of(self, name):
        return next((m["peer"] for m in self.members if m["name"] == name), None)

    def leader_peer(self):
        """The leader's API when another member leads, else None."""
        return None if self.leader in (None, self.name) else self.peer_of(self.leader)

    def others(self):
        return [m for m in self.members if m["name"] != self.name]

    def status(self):
        # read without the lock: a member asked during its own round must still answer
        return {"name": self.name, "leader": self.leader, "term": self.term, "revision": self.revision(),
                "members": [m["name"] for m in self.members], "quorum": self.leader is not None}  # fmt: skip

    def initialize(self):
        """cluster-init on a server with no etcd data yet: a cluster of one member, which leads it."""
        with self.lock:
            self.members = [{"name": self.name, "peer": self.peer}]
            self.term, self.leader = 1, self.name
            self.quorum_seen = self.clock()
            self.persist()

    def add_member(self, name, peer):
        """The leader adds a joining server (again, with its new address, when it joins once more)."""
        with self.lock:
            self.members = [m for m in self.members if m["name"] != name] + [{"name": name, "peer": peer}]
            self.persist()
            self.wake.set()
            with self.cluster.lock:
                state = json.loads(json.dumps(self.cluster.state))
            return {"members": list(self.members), "term": self.term, "leader": self.leader, "state": state}

    def joined(self, reply):
        """This server's side of a join: the members, the leader and the data it answered with."""
        with self.lock:
            self.members, self.term, self.leader = reply["members"], reply["term"], reply["leader"]
            self.leader_seen = self.clock()
            self.cluster.replace(reply["state"])
            self.persist()

    def append(self, msg):
        """The leader's heartbeat with the data: followed unless this member knows a newer term."""
        with self.lock:
            if msg["term"] < self.term:
                return 409, {"error": "stale term", "term": self.term}
            changed = (msg["term"], msg["members"]) != (self.term, self.members)
            self.term, self.leader, self.members = msg["term"], msg["leader"], msg["members"]
            self.leader_seen = self.clock()
            if changed:
                self.persist()
        if msg["state"].get("revision", 0) != self.revision():
            self.cluster.replace(msg["state"])
        return 200, {"ok": True}

    def tick(self):
        """One round: the leader sends the data and checks its quorum; a follower without a leader elects one.
        No lock is held while another member is asked (it may be asking this one at the same time)."""
        now = self.clock()
        with self.lock:
            term, others = self.term, self.others()
            leading = self.is_leader()
            if not leading and self.leader is not None and now - self.leader_seen < ELECTION_S:
                return
        if leading:
            self.lead(now, term, others)
        else:
            self.elect(now, term, others)

    def lead(self, now, term, others):
        with self.cluster.lock:
            state = json.loads(json.dumps(self.cluster.state))
        msg = {"term": term, "leader": self.name, "members": self.members, "state": state}
        acks, newer = 1, False
        for m in others:
            try:
                code, body = self.send(m["peer"], "/gpulab/etcd/append", msg)
            except OSError:
                continue
            acks += code == 200
            newer = newer or body.get("term", 0) > term
        with self.lock:
            if self.term != term or not self.is_leader():
                return
            if newer:
                self.leader = None  # another member leads a newer term
            elif acks >= self.quorum():
                self.quorum_seen = now
            elif now - self.quorum_seen >= ELECTION_S:
                self.leader = None  # CheckQuorum: no quorum answers, so this member leads no more

    def elect(self, now, term, others):
        with self.lock:
            self.leader = None
        views = [self.status()]
        for m in others:
            try:
                code, body = self.send(m["peer"], "/gpulab/etcd/status")
            except OSError:
                continue
            if code == 200 and body.get("name") == m["name"]:
                views.append(body)
        with self.lock:
            if self.leader is not None or self.term != term or len(views) < self.quorum():
                return  # a leader was heard meanwhile, or no quorum: no leader, the API does not answer
            leading = [v for v in views if v["leader"] == v["name"] and v["term"] >= term]
            if leading:
                best = max(leading, key=lambda v: v["term"])
                self.leader, self.term, self.leader_seen = best["name"], best["term"], now
                return
            order = {m["name"]: i for i, m in enumerate(self.members)}
            best = max(views, key=lambda v: (v["revision"], -order.get(v["name"], len(order))))
            if best["name"] == self.name:
                self.term = max(v["term"] for v in views) + 1
                self.leader, self.quorum_seen = self.name, now
                self.persist()
                self.wake.set()

    def run(self):
        while True:
            self.tick()
            self.wake.wait(ETCD_TICK_S)
            self.wake.clear()


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
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def body(self):
            return json.loads(self.raw() or b"{}")

        def do_GET(self):
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
            if self.path == "/gpulab/pods":
                pods = state.get("pods", []) + list(state.get("direct_pods", {}).values())
                return self.reply(200, [{**p, "status": pod_status(p)} for p in pods])
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
                    200, {**etcd.add_member(info["name"], info["peer"]), "token": auth["token"]}
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
                return self.reply(200, {"ok": True, **({"servers": servers} if servers else {})})
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


# POST path -> an edit of the node the request names, made under the cluster lock and saved on 200.
NODE_EDITS = {"/gpulab/cordon": _cordon, "/gpulab/label": _label}


def sd_notify(message):
    """Tell the service manager (systemd's Type=notify) how the service is, as k3s does; no-op without one."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return
    if path.startswith("@"):
        path = "\0" + path[1:]  # an abstract socket
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(message.encode(), path)


def truthy(value):
    return value is True or str(value).lower() == "true"


def write_token(token):
    os.makedirs(os.path.dirname(TOKEN), exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.remove(TOKEN + ".tmp")
    with os.fdopen(os.open(TOKEN + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(token + "\n")  # never readable by others, not even for a moment
    os.replace(TOKEN + ".tmp", TOKEN)


def given_token(cfg):
    """The token config.yaml gives: `token`, else the file `token-file` names."""
    token = str(cfg.get("token") or os.environ.get("K3S_TOKEN") or "")
    path = cfg.get("token-file") or os.environ.get("K3S_TOKEN_FILE")
    if not token and path:
        with contextlib.suppress(OSError), open(path) as f:
            token = f.read().strip()
    return token


def join_cluster(etcd, url, token, name):
    """A server that names `server`: join etcd through that address with the token (again until it answers,
    as systemd restarts k3s after a failed join); the cluster's token from then on."""
    host = url.split("://", 1)[-1].split("/", 1)[0]
    while True:
        try:
            code, body = http_send(f"http://{host}", "/gpulab/etcd/join",
                                   {"token": token, "name": name, "peer": etcd.peer}, timeout=10)  # fmt: skip
        except OSError as exc:
            code, body = 0, {"error": f"failed to contact server {host}: {exc}"}
        if code == 200:
            etcd.joined(body)
            return body["token"]
        if code == 401:
            body = {"error": f"failed to get CA certs: https://{host}/cacerts: 401 Unauthorized"}
        print(f'level=error msg="starting kubernetes: preparing server: failed to join the cluster through {host}: '
              f'{body.get("error")}"', file=sys.stderr, flush=True)  # fmt: skip
        time.sleep(2)


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
    token = given_token(cfg) if joining else server_token(cfg)
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
    os.makedirs(os.path.dirname(KUBECONFIG), exist_ok=True)
    with open(KUBECONFIG, "w") as f:
        f.write(
            f"apiVersion: v1\nclusters:\n- cluster:\n    server: https://{api_host}:{port}\n  name: default\n"
            "contexts:\n- context:\n    cluster: default\n    user: default\n  name: default\n"
            "current-context: default\nkind: Config\nusers:\n- name: default\n  user: {}\n"
        )
    os.chmod(KUBECONFIG, int(str(cfg.get("write-kubeconfig-mode") or "600"), 8))
    handler = make_handler(cluster, token)
    hosts = [bind] if bind else ["127.0.0.1", address]
    servers = [http.server.ThreadingHTTPServer((host, port), handler) for host in dict.fromkeys(hosts)]
    for srv in servers:
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    if etcd is not None:
        if joining:
            # listening first: the leader sends the data to a new member as soon as it has added it
            token = handler.auth["token"] = join_cluster(etcd, join_url, token, name)
            write_token(token)  # a joined server holds the cluster's token
        elif not etcd.members:
            etcd.initialize()
        threading.Thread(target=etcd.run, daemon=True).start()
    vip = KubeVip(cluster, port, handler)

    def stop(signum, frame):
        vip.release()  # the VIP goes with the server (its kube-vip pod)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    threading.Thread(target=vip.run, daemon=True).start()
    runtimes = ["nvidia"] if os.path.exists("/usr/bin/nvidia-container-runtime") else []
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
        "runtimes": runtimes,
        "version": version(),
        "role_labels": role_labels,
    }
    started = time.time()
    os.makedirs(MANIFESTS, exist_ok=True)
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


def etcd_addons(state, members):
    """Every server's manifests, in the order the servers joined; an object two servers place is the first's."""
    docs, seen = [], set()
    for m in members:
        for d in (state.get("addons") or {}).get(m["name"], []):
            meta = d.get("metadata") or {}
            key = (d.get("kind"), meta.get("namespace"), meta.get("name"))
            if key not in seen:
                seen.add(key)
                docs.append(d)
    return docs


# --- kube-vip -------------------------------------------------------------------------------------------------

KUBE_VIP_TICK_S = 0.5
# gratuitous ARPs sent when this server takes the VIP (kube-vip sends a few, then repeats them)
GARP_COUNT = 3


def kube_vip_spec(docs):
    """The control-plane VIP kube-vip's DaemonSet in the manifests asks for in ARP mode: {address, interface,
    leader_election}, or None (no such DaemonSet, no address, or not ARP/control plane/hostNetwork)."""
    for d in docs:
        if d.get("kind") != "DaemonSet":
            continue
        spec = ((d.get("spec") or {}).get("template") or {}).get("spec") or {}
        for c in spec.get("containers") or []:
            if "kube-vip" not in str(c.get("image", "")):
                continue
            env = {e.get("name"): str(e.get("value")) for e in c.get("env") or [] if "value" in e}
            if (
                truthy(env.get("vip_arp"))
                and truthy(env.get("cp_enable"))
                and env.get("address")
                and truthy(spec.get("hostNetwork"))
            ):
                return {
                    "address": env["address"],
                    "interface": env.get("vip_interface") or "",
                    "leader_election": truthy(env.get("vip_leaderelection")),
                }
    return None


def default_interface():
    """The interface of the default route ('' without one), where kube-vip holds a VIP with no vip_interface."""
    import subprocess

    out = subprocess.run(
        ["ip", "-4", "-j", "route", "show", "default"], capture_output=True, text=True
    ).stdout
    routes = json.loads(out or "[]")
    return routes[0].get("dev", "") if routes else ""


def link_mac(iface):
    import subprocess

    out = subprocess.run(["ip", "-j", "link", "show", "dev", iface], capture_output=True, text=True).stdout
    links = json.loads(out or "[]")
    return bytes.fromhex(links[0]["address"].replace(":", "")) if links else None


def gratuitous_arp(address, iface, count=GARP_COUNT):
    """Announce `address` at `iface`'s MAC to the LAN: gratuitous ARP requests and replies (sender and target the
    VIP, to the broadcast address) through an AF_PACKET socket, as kube-vip's ARP mode does, so that every
    neighbour's cache moves to this server at once. Returns the frames sent."""
    import struct

    mac = link_mac(iface)
    if mac is None:
        return 0
    ip = socket.inet_aton(address)
    sent = 0
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as sock:
        sock.bind((iface, 0))
        for _ in range(count):
            for op, target in ((1, b"\x00" * 6), (2, b"\xff" * 6)):
                arp = struct.pack("!HHBBH", 1, 0x0800, 6, 4, op) + mac + ip + target + ip
                sock.send(b"\xff" * 6 + mac + b"\x08\x06" + arp)
                sent += 1
    return sent


class KubeVip:
    """kube-vip's DaemonSet on this server (hostNetwork, ARP mode, leader election): while the cluster's manifests
    hold kube-vip with a VIP and this server leads (the etcd leader stands in for the holder of kube-vip's Lease
    plndr-cp-lock; one server on SQLite always leads), the VIP is on its LAN interface as ``ADDRESS/32``, announced
    with gratuitous ARP, and the API answers on it. A server that stops leading, or stops (SIGTERM: ``systemctl
    stop k3s``), lets it go; without a quorum nobody holds it, as kube-vip cannot renew its Lease then."""

    def __init__(self, cluster, port, handler, log=None):
        self.cluster, self.port, self.handler = cluster, port, handler
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.held = None  # (address, interface)
        self.server = None
        self.lock = threading.Lock()

    def wanted(self):
        etcd = self.cluster.etcd
        with self.cluster.lock:
            docs = etcd_addons(self.cluster.state, etcd.members) if etcd is not None else manifest_docs()
        spec = kube_vip_spec(docs)
        if spec is None or not (etcd is None or etcd.is_leader()):
            return None
        return spec["address"], spec["interface"] or default_interface()

    def step(self):
        want = self.wanted()
        with self.lock:
            if want == self.held:
                return
            self._release()
            if want is not None and want[1]:
                self._take(*want)

    def _take(self, address, iface):
        import subprocess

        added = subprocess.run(
            ["ip", "addr", "replace", f"{address}/32", "dev", iface], capture_output=True, text=True
        )
        if added.returncode != 0:
            self.log(f'level=error msg="kube-vip: adding {address} to {iface}: {added.stderr.strip()}"')
            return
        try:
            server = http.server.ThreadingHTTPServer((address, self.port), self.handler)
        except OSError as e:
            subprocess.run(["ip", "addr", "del", f"{address}/32", "dev", iface], capture_output=True)
            self.log(f'level=error msg="kube-vip: the API cannot listen on {address}:{self.port}: {e}"')
            return
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.server, self.held = server, (address, iface)
        try:
            gratuitous_arp(address, iface)
        except OSError as e:
            self.log(f'level=warning msg="kube-vip: gratuitous ARP for {address} on {iface}: {e}"')
        self.log(f'level=info msg="kube-vip: this server holds the VIP {address} on {iface}"')

    def _release(self):
        import subprocess

        if self.held is None:
            return
        address, iface = self.held
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        subprocess.run(["ip", "addr", "del", f"{address}/32", "dev", iface], capture_output=True)
        self.server, self.held = None, None
        self.log(f'level=info msg="kube-vip: this server lets the VIP {address} go"')

    def release(self):
        with self.lock:
            self._release()

    def run(self):
        while True:
            try:
                self.step()
            except Exception as e:  # kube-vip's pod restarts; the stand-in says why and keeps trying
                self.log(f'level=error msg="kube-vip: {type(e).__name__}: {e}"')
            time.sleep(KUBE_VIP_TICK_S)


# --- agent --------------------------------------------------------------------------------------------------


def run_agent():
    cfg = load_config()
    url = str(cfg.get("server") or os.environ.get("K3S_URL") or "")
    token = str(cfg.get("token") or os.environ.get("K3S_TOKEN") or "")
    token_file = cfg.get("token-file") or os.environ.get("K3S_TOKEN_FILE")
    if not token and token_file:
        with contextlib.suppress(OSError), open(token_file) as f:
            token = f.read().strip()
    if not url:
        print('level=fatal msg="--server is required"', file=sys.stderr)
        return 1
    host = url.split("://", 1)[-1].split("/", 1)[0]
    # like k3s' agent load balancer: the address it was given, then every server the cluster names, and on to
    # the next one when the one in use does not answer
    endpoints = [host]
    name = str(cfg.get("node-name") or socket.gethostname())
    # like k3s, the agent looks for the NVIDIA runtime once, when it starts
    runtimes = ["nvidia"] if os.path.exists("/usr/bin/nvidia-container-runtime") else []
    me = {
        "name": name,
        "boot_id": boot_id(),
        "address": own_address(),
        "labels": labels_from(cfg),
        "runtimes": runtimes,
        "token": token,
        "version": version(),  # the release this agent runs, read when it started
    }
    cards = gpu_cards()
    me.update(gpus=len(cards), gpu_uuids=[c["uuid"] for c in cards], gpu_cards=cards)
    while True:
        current = endpoints[0]
        req = urllib.request.Request(
            f"http://{current}/gpulab/register", json.dumps(me).encode(), {"Content-Type": "application/json"}
        )
        try:
            reply = json.loads(urllib.request.urlopen(req, timeout=5).read() or b"{}")
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
        time.sleep(HEARTBEAT_S)


# --- kubectl ------------------------------------------------------------------------------------------------


def api_server():
    """``host:port`` of the server the kubeconfig names (``KUBECONFIG``, else k3s' own kubeconfig)."""
    path = (os.environ.get("KUBECONFIG") or KUBECONFIG).split(":")[0]
    with contextlib.suppress(OSError), open(path) as f:
        for line in f:
            key, _, value = line.strip().partition(":")
            if key == "server" and "://" in value:
                return value.strip().split("://", 1)[1].rstrip("/")
    return f"127.0.0.1:{PORT}"


def api_get(path):
    server = api_server()
    try:
        with urllib.request.urlopen(f"http://{server}{path}", timeout=5) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as exc:
        if exc.code == 504:  # etcd without a quorum: the API server answers nothing but this
            print(f"Error from server: {NO_QUORUM}", file=sys.stderr)
            sys.exit(1)
        print(
            f"The connection to the server {server} was refused - did you specify the right host or port?",
            file=sys.stderr,
        )
        sys.exit(1)
    except OSError:
        print(
            f"The connection to the server {server} was refused - did you specify the right host or port?",
            file=sys.stderr,
        )
        sys.exit(1)


def jsonpath(obj, expr):
    expr = expr.strip()
    if expr.startswith("{") and expr.endswith("}"):
        expr = expr[1:-1]
    for part in [p for p in expr.lstrip(".").split(".") if p]:
        obj = obj.get(part, "") if isinstance(obj, dict) else ""
    return obj if isinstance(obj, str) else json.dumps(obj)


def output(items, kind, fmt, single):
    if fmt == "json":
        print(
            json.dumps(items[0] if single else {"apiVersion": "v1", "items": items, "kind": "List"}, indent=4)
        )
    elif fmt and fmt.startswith("jsonpath="):
        print(" ".join(jsonpath(i, fmt.split("=", 1)[1]) for i in items), end="")
    elif fmt == "name":
        for i in items:
            print(f"{kind}/{i['metadata']['name']}")
    elif kind == "node":
        print(f"{'NAME':<16} {'STATUS':<10} {'ROLES':<22} {'AGE':<5} VERSION")
        for i in items:
            ready = i["status"]["conditions"][0]["status"] == "True"
            roles = ",".join(
                sorted(k.split("/", 1)[1] for k in i["metadata"]["labels"] if k.startswith("node-role"))
            )
            print(
                f"{i['metadata']['name']:<16} {'Ready' if ready else 'NotReady':<10} {roles or '<none>':<22} "
                f"{'1m':<5} {i['status']['nodeInfo']['kubeletVersion']}"
            )
    else:
        print("NAME")
        for i in items:
            print(i["metadata"]["name"])


def duration_s(text):
    """kubectl's --timeout: 30s, 5m, 1h, 1m30s; 0 or no unit means seconds."""
    total, num = 0.0, ""
    for ch in text:
        if ch.isdigit() or ch == ".":
            num += ch
        else:
            total += float(num or 0) * {"s": 1, "m": 60, "h": 3600}.get(ch, 1)
            num = ""
    return total + float(num or 0)


def post(path, body):
    """POST to the server; (reply, None) or (None, the error kubectl prints)."""
    req = urllib.request.Request(
        f"http://{api_server()}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return json.load(resp), None
    except urllib.error.HTTPError as exc:
        if exc.code == 504:
            return None, f"Error from server: {NO_QUORUM}"
        return None, f"Error from server (NotFound): {json.load(exc).get('error')}"
    except OSError:
        return api_get("/none"), "unreachable"


def until(check, timeout_s, interval_s=0.5):
    """Poll check() until it returns true or timeout_s passed (kubectl's waits); its last answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result or time.monotonic() >= deadline:
            return result
        time.sleep(interval_s)


def get_pods(rest, namespace, all_namespaces, selector, fmt):
    """kubectl get pods: the Deployments' pods, a table like kubectl's or -o json / -o name."""
    names = rest[2:] or ([rest[1].split("/", 1)[1]] if "/" in rest[1] else [])
    wanted = dict(p.partition("=")[::2] for p in selector.split(",") if p)
    pods = [
        p
        for p in api_get("/gpulab/pods")
        if (all_namespaces or p["namespace"] == namespace)
        and all(p["labels"].get(k) == v for k, v in wanted.items())
    ]
    by_name = {p["name"]: p for p in pods}
    for n in names:
        if n not in by_name:
            print(f'Error from server (NotFound): pods "{n}" not found', file=sys.stderr)
            return 1
    pods = [by_name[n] for n in names] if names else pods
    if fmt == "json":
        objects = [pod_object(p) for p in pods]
        single = len(names) == 1
        print(
            json.dumps(
                objects[0] if single else {"apiVersion": "v1", "items": objects, "kind": "List"}, indent=4
            )
        )
    elif fmt == "name":
        for p in pods:
            print(f"pod/{p['name']}")
    elif not pods:
        where = "any namespace" if all_namespaces else f"{namespace} namespace"
        print(f"No resources found in {where}.", file=sys.stderr)
    else:
        print(f"{'NAME':<40} {'READY':<7} {'STATUS':<16} {'RESTARTS':<9} AGE")
        for p in pods:
            ready = f"{int(p['ready'] is not None)}/{len(p['containers'])}"
            age = f"{max(0, int(time.time() - p['created']))}s"
            print(f"{p['name']:<40} {ready:<7} {p['status']:<16} {p['restarts']:<9} {age}")
    return 0


def create_pods(filename, namespace, dry_run, fmt):
    """kubectl create|apply -f FILE (or -): Pods, through HAMi's webhook; --dry-run=server keeps nothing."""
    import yaml

    try:
        if filename == "-":
            text = sys.stdin.read()
        else:
            with open(filename) as f:
                text = f.read()
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    docs = [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]
    for d in docs:
        d.setdefault("metadata", {}).setdefault("namespace", namespace)
    req = urllib.request.Request(
        f"http://{api_server()}/gpulab/pods/create",
        json.dumps({"docs": docs, "dry_run": dry_run}).encode(),
        {"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            pods = json.load(resp)["pods"]
    except urllib.error.HTTPError as exc:
        name = (docs[0].get("metadata") or {}).get("name") if docs else "?"
        print(f'Error from server (InternalError): error when creating "{filename}": {json.load(exc)["error"]}'
              f" (pod {name})", file=sys.stderr)  # fmt: skip
        return 1
    except OSError:
        return api_get("/none") or 1
    if fmt == "json":
        print(json.dumps(pods[0] if len(pods) == 1 else {"kind": "List", "items": pods}, indent=4))
    elif fmt and fmt.startswith("jsonpath="):
        print(" ".join(jsonpath(p, fmt.split("=", 1)[1]) for p in pods), end="")
    else:
        for p in pods:
            print(f"pod/{p['metadata']['name']} created{' (server dry run)' if dry_run else ''}")
    return 0


def pod_logs(name, namespace):
    """kubectl logs: the stand-in runs no image, but a container whose command calls nvidia-smi for
    memory.total prints the memory it sees: its share when HAMi-core is on (HAMi's allocation), else the card."""
    pod = next(
        (p for p in api_get("/gpulab/pods") if p["name"] == name and p["namespace"] == namespace), None
    )
    if pod is None:
        print(f'Error from server (NotFound): pods "{name}" not found', file=sys.stderr)
        return 1
    if pod.get("started") is None:
        container = (pod.get("containers") or ["?"])[0]
        print(f'Error from server (BadRequest): container "{container}" in pod "{name}" is waiting to start: '
              "ContainerCreating", file=sys.stderr)  # fmt: skip
        return 1
    for c in (pod.get("spec") or {}).get("containers") or []:
        words = " ".join([*(c.get("command") or []), *(c.get("args") or [])])
        if "nvidia-smi" in words and "memory.total" in words:
            for mib in pod.get("visible_mib") or []:
                print(mib if "nounits" in words else f"{mib} MiB")
    return 0


def kubectl(args):
    fmt, rest, overwrite, namespace = "", [], False, "default"
    timeout_s, condition, selector, all_namespaces = 30.0, "", "", False
    filename, replicas, dry_run, ignore_not_found = None, None, False, False
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-o", "--output"):
            fmt, i = args[i + 1], i + 2
            continue
        if a.startswith(("-o=", "--output=")):
            fmt = a.split("=", 1)[1]
        elif a.startswith("-o") and len(a) > 2:
            fmt = a[2:]
        elif a in ("-n", "--namespace"):
            namespace = args[i + 1]
            i += 1
        elif a.startswith("--namespace="):
            namespace = a.split("=", 1)[1]
        elif a.startswith("--for="):
            condition = a.split("=", 1)[1]
        elif a.startswith("--timeout="):
            timeout_s = duration_s(a.split("=", 1)[1])
        elif a in ("-f", "--filename"):
            filename = args[i + 1]
            i += 1
        elif a.startswith(("--filename=", "--replicas=", "--dry-run=")):
            key, _, value = a.partition("=")
            if key == "--filename":
                filename = value
            elif key == "--replicas":
                replicas = int(value)
            else:
                dry_run = value == "server"
        elif a.startswith(("--wait=", "--ignore-not-found", "--now")):
            ignore_not_found = ignore_not_found or a.startswith("--ignore-not-found")
        elif a in ("--ignore-daemonsets", "--delete-emptydir-data", "--force") or a.startswith(
            ("--ignore-daemonsets=", "--delete-emptydir-data=", "--force=", "--grace-period=")
        ):
            pass
        elif a == "--overwrite":
            overwrite = True
        elif a in ("-A", "--all-namespaces"):
            all_namespaces = True
        elif a in ("-l", "--selector"):
            selector = args[i + 1]
            i += 1
        elif a.startswith("--selector="):
            selector = a.split("=", 1)[1]
        else:
            rest.append(a)
        i += 1
    if rest[:1] == ["get"] and len(rest) >= 2 and rest[1].split("/", 1)[0].lower() in ("pod", "pods", "po"):
        return get_pods(rest, namespace, all_namespaces, selector, fmt)
    if rest[:1] in (["create"], ["apply"]) and filename:
        return create_pods(filename, namespace, dry_run, fmt)
    if rest[:1] == ["delete"] and len(rest) >= 2 and rest[1].split("/", 1)[0] in ("pod", "pods", "po"):
        names = rest[2:] or ([rest[1].split("/", 1)[1]] if "/" in rest[1] else [])
        wanted = dict(p.partition("=")[::2] for p in selector.split(",") if p)
        reply, err = post("/gpulab/pods/delete", {"namespace": namespace, "names": names, "selector": wanted})
        if err:
            print(err, file=sys.stderr)
            return 1
        for n in reply["deleted"]:
            print(f'pod "{n}" deleted')
        missing = [n for n in names if n not in reply["deleted"]]
        if missing and not ignore_not_found:
            print(f'Error from server (NotFound): pods "{missing[0]}" not found', file=sys.stderr)
            return 1
        if not names and not reply["deleted"]:
            print("No resources found", file=sys.stderr)
        return 0
    if rest[:1] == ["scale"] and len(rest) == 2 and replicas is not None:
        kind, _, name = rest[1].partition("/")
        if f"{namespace}/{name}" not in api_get("/gpulab/deployments") or kind not in (
            "deployment",
            "deploy",
        ):
            print(f'Error from server (NotFound): deployments.apps "{name}" not found', file=sys.stderr)
            return 1
        post("/gpulab/scale", {"deployment": f"{namespace}/{name}", "replicas": replicas})
        print(f"deployment.apps/{name} scaled")
        return 0
    if rest[:1] == ["logs"] and len(rest) == 2:
        return pod_logs(rest[1].removeprefix("pod/"), namespace)
    if rest[:1] == ["get"] and len(rest) == 2 and "," in rest[1] and fmt == "json":
        # `get nodes,runtimeclass -o json`: one List of every kind named, each item with its own kind
        items = []
        for one in rest[1].split(","):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rc = kubectl([one if a == rest[1] else a for a in args])
            if rc != 0:
                return rc
            items.extend(json.loads(out.getvalue())["items"])
        print(json.dumps({"apiVersion": "v1", "items": items, "kind": "List"}, indent=4))
        return 0
    if rest[:1] == ["get"] and len(rest) >= 2:
        kind = rest[1].split("/", 1)[0].lower()
        names = rest[2:] or ([rest[1].split("/", 1)[1]] if "/" in rest[1] else [])
        if kind in ("node", "nodes", "no"):
            all_items, kind, resource = api_get("/gpulab/nodes"), "node", "nodes"
        elif kind in ("runtimeclass", "runtimeclasses"):
            all_items, kind = api_get("/gpulab/runtimeclasses"), "runtimeclass.node.k8s.io"
            resource = "runtimeclasses.node.k8s.io"
        elif kind in ("deployment", "deployments", "deploy"):
            all_items = {
                key.split("/", 1)[1]: d
                for key, d in api_get("/gpulab/deployments").items()
                if all_namespaces or key.split("/", 1)[0] == namespace
            }
            kind, resource = "deployment.apps", "deployments.apps"
        elif kind in ("mutatingwebhookconfiguration", "mutatingwebhookconfigurations"):
            all_items, kind = (
                api_get("/gpulab/webhooks"),
                "mutatingwebhookconfiguration.admissionregistration.k8s.io",
            )
            resource = "mutatingwebhookconfigurations.admissionregistration.k8s.io"
        elif kind in ("daemonset", "daemonsets", "ds"):
            all_items, kind = (
                {d["metadata"]["name"]: d for d in api_get("/gpulab/daemonsets")},
                "daemonset.apps",
            )
            resource = "daemonsets.apps"
        else:
            print(f'error: the server doesn\'t have a resource type "{rest[1]}"', file=sys.stderr)
            return 1
        for n in names:
            if n not in all_items:
                print(f'Error from server (NotFound): {resource} "{n}" not found', file=sys.stderr)
                return 1
        items = [all_items[n] for n in names] if names else list(all_items.values())
        output(items, kind, fmt, single=len(names) == 1)
        return 0
    if rest[:2] in (["label", "node"], ["label", "nodes"]) and len(rest) >= 4:
        node, pairs = rest[2], rest[3:]
        labels = {p.split("=", 1)[0]: p.split("=", 1)[1] if "=" in p else "" for p in pairs}
        body = json.dumps({"node": node, "labels": labels, "overwrite": overwrite}).encode()
        req = urllib.request.Request(
            f"http://{api_server()}/gpulab/label", body, {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                changed = json.load(resp)["changed"]
        except urllib.error.HTTPError as exc:
            print(f"error: {json.load(exc).get('error')}", file=sys.stderr)
            return 1
        except OSError:
            return api_get("/none") or 1
        print(f"node/{node} {'labeled' if changed else 'not labeled'}")
        return 0
    if rest[:1] in (["cordon"], ["uncordon"], ["drain"]) and len(rest) == 2:
        verb, node = rest
        reply, err = post(
            "/gpulab/cordon", {"node": node, "unschedulable": verb != "uncordon", "drain": verb == "drain"}
        )
        if err:
            print(err, file=sys.stderr)
            return 1
        done = {"cordon": "cordoned", "drain": "cordoned", "uncordon": "uncordoned"}[verb]
        print(f"node/{node} {done if reply['changed'] else 'already ' + done}")
        if verb == "drain":
            print(f"node/{node} drained")
        return 0
    if rest[:1] == ["wait"] and len(rest) == 2 and rest[1].startswith(("node/", "nodes/")):
        name = rest[1].split("/", 1)[1]
        if condition.lower() != "condition=ready":
            print(f"error: `--for={condition}` on nodes is not stood in", file=sys.stderr)
            return 1
        if name not in api_get("/gpulab/nodes"):
            print(f'Error from server (NotFound): nodes "{name}" not found', file=sys.stderr)
            return 1

        def node_ready():
            node = api_get("/gpulab/nodes").get(name)
            return bool(node) and node["status"]["conditions"][0]["status"] == "True"

        if until(node_ready, timeout_s):
            print(f"node/{name} condition met")
            return 0
        print(f"error: timed out waiting for the condition on nodes/{name}", file=sys.stderr)
        return 1
    if rest[:1] == ["wait"] and len(rest) == 2 and rest[1].startswith("job/"):
        name = rest[1].split("/", 1)[1]
        key = f"{namespace}/{name}"

        def job():
            workloads = api_get("/gpulab/workloads")
            return workloads["jobs"].get(key) or ({} if key in workloads.get("jobs_started", []) else None)

        if job() is None:  # like kubectl: a job that does not exist (yet) is an error at once
            print(f'Error from server (NotFound): jobs.batch "{name}" not found', file=sys.stderr)
            return 1
        if until(lambda: (job() or {}).get("complete"), timeout_s):
            print(f"job.batch/{name} condition met")
            return 0
        print(f"error: timed out waiting for the condition on jobs/{name}", file=sys.stderr)
        return 1
    if rest[:2] == ["rollout", "status"] and len(rest) == 3:
        kind, _, name = rest[2].partition("/")
        ready = True
        if kind in ("daemonset", "ds"):
            found = any(
                d["metadata"]["name"] == name and d["metadata"]["namespace"] == namespace
                for d in api_get("/gpulab/daemonsets")
            )
            what = "daemon set"
        else:
            # like kubectl, wait up to --timeout for a Deployment that exists to become available
            def deployment():
                return api_get("/gpulab/workloads")["deployments"].get(f"{namespace}/{name}")

            entry = deployment()
            if entry is not None and not entry.get("ready"):
                until(lambda: (deployment() or {}).get("ready"), timeout_s)
                entry = deployment()
            found, ready = entry is not None, bool(entry and entry.get("ready"))
            what = "deployment"
        if found and not ready:
            print(
                f'Waiting for deployment "{name}" rollout to finish: 0 of 1 updated replicas are available...'
            )
            print("error: timed out waiting for the condition", file=sys.stderr)
            return 1
        if found:
            print(f'{what} "{name}" successfully rolled out')
            return 0
        print(f'Error from server (NotFound): {kind}s.apps "{name}" not found', file=sys.stderr)
        return 1
    print(f"error: `kubectl {' '.join(args)}` is not stood in by the gpulab lab's k3s", file=sys.stderr)
    return 1


def main(argv):
    if not argv or argv[0] in ("--version", "-v", "version"):
        print(f"k3s version {version()} (0000000a)\ngo version go1.24.6")
        return 0
    cmd, args = argv[0], argv[1:]
    if cmd == "server":
        try:
            import yaml  # noqa: F401 - the HelmChart controller reads the manifests with it
        except ImportError:
            # the real k3s parses YAML itself; this stand-in borrows the guest's PyYAML (python3-yaml,
            # in every Ubuntu cloud image as cloud-init's dependency) and says so instead of hanging
            print("gpulab lab k3s stand-in: `k3s server` needs python3-yaml in this host", file=sys.stderr)
            return 1
        return run_server()
    if cmd == "agent":
        return run_agent()
    if cmd == "kubectl":
        return kubectl(args)
    print(f"gpulab lab k3s stand-in: `k3s {cmd}` is not stood in", file=sys.stderr)
    return 1


if __name__ == "__main__":
    name = os.path.basename(sys.argv[0])
    argv = ["kubectl", *sys.argv[1:]] if name == "kubectl" else sys.argv[1:]
    rc = main(argv)
    if argv[:1] not in (["server"], ["agent"]):
        log_call(argv, rc)
    sys.exit(rc)

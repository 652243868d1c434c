"""The k3s stand-in's cluster state: nodes, the manifests folder's objects, the Deployments' pods.

The state is one JSON document (``STATE``, in k3s' server data folder); with embedded etcd every member keeps a
copy (module ``etcd``).

* Deployments placed in the manifests folder get one pod each, placed on a node their GPU request fits
  (HAMi's vGPUs, the pinned UUIDs; not a cordoned node); a GPU pod that went around HAMi's webhook is placed by
  default-scheduler and rejected by the kubelet (module ``hami``), and the Deployment makes a new one. A pod runs its init containers one after the other,
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
* A node's ``kubeletVersion`` is the release its k3s process started with, not the binary on disk now.
"""

import contextlib
import hashlib
import json
import os
import re
import secrets
import threading
import time

from . import engine, hami, monitoring_charts, open_webui_chart, registry
from .common import HEARTBEAT_S, now_iso, version

STATE = "/var/lib/rancher/k3s/server/db/gpulab-state.json"
MANIFESTS = "/var/lib/rancher/k3s/server/manifests"
NOT_READY_AFTER_S = 40
DEPLOY_READY_S = 2
# a node whose agent has not called for this long runs nothing (its kubelet is down), whatever the API shows
ALIVE_S = 3 * HEARTBEAT_S
URL_RE = re.compile(r"http://[^\s\"']+")


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
    pull = pod.get("pull")

    def pulling(here):
        """The kubelet's waiting state of the container whose image it cannot pull (module registry)."""
        return {"waiting": {"reason": pull["reason"], "message": pull["message"]}} if pull and here else None

    init_statuses = [
        {
            "name": n,
            "ready": i < passed,
            "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}
            if i < passed
            else (
                pulling(i == passed)
                or (
                    {"running": {}}
                    if i == passed and pod["node"]
                    else {"waiting": {"reason": "PodInitializing"}}
                )
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
            "state": {"running": {}}
            if running
            else pulling(bool(pull) and passed >= len(inits) and n == pull["container"])
            or {"waiting": {"reason": "PodInitializing"}},
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
    inits_spec = {c.get("name"): c for c in spec.get("initContainers") or []}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod["name"], "namespace": pod["namespace"], "labels": pod["labels"],
                     "annotations": pod.get("annotations") or {}},
        "spec": {"nodeName": pod["node"], "schedulerName": pod.get("scheduler") or "default-scheduler",
                 **({"runtimeClassName": spec["runtimeClassName"]} if spec.get("runtimeClassName") else {}),
                 "initContainers": [{"name": n, **({"image": inits_spec[n]["image"]} if inits_spec.get(n, {}).get("image")
                                                   else {})} for n in inits],
                 "containers": [{"name": n, **{k: v for k, v in containers.get(n, {}).items()
                                               if k in ("image", "resources", "env", "command", "args")}}
                                for n in pod["containers"]]},
        "status": {
            "phase": "Failed" if pod.get("phase") == "Failed" else ("Running" if running else "Pending"),
            **({"reason": pod["failed_reason"], "message": pod["failed_message"]}
               if pod.get("phase") == "Failed" else {}),
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
    """kubectl's STATUS column: Pending, Init:N/M, PodInitializing, Running, or a Failed pod's reason."""
    if pod.get("phase") == "Failed":
        return pod.get("failed_reason") or "Error"
    if pod["node"] is None:
        return "Pending"
    if pod["init_passed"] < len(pod["init"]):
        if pod.get("pull"):
            return f"Init:{pod['pull']['reason']}"
        return f"Init:{pod['init_passed']}/{len(pod['init'])}"
    if pod.get("pull") and pod["started"] is None:
        return pod["pull"]["reason"]
    return "Running" if pod["started"] is not None else "PodInitializing"


# The condition k3s' etcd member controller gives a node with the etcd role (the status and reason are k3s';
# the messages are the stand-in's own words): pkg/etcd/etcd.go @2614da01 (setEtcdStatusCondition)
ETCD_CONDITIONS = {
    "voter": ("True", "MemberNotLearner", "voting member of etcd"),
    "unhealthy": ("False", "Unhealthy", "etcd member does not answer"),
    "unjoined": ("False", "NotAMember", "not a member of etcd"),
}


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
    conditions = [cond]
    if node.get("etcd_status") in ETCD_CONDITIONS:
        status, reason, message = ETCD_CONDITIONS[node["etcd_status"]]
        conditions.append({"type": "EtcdIsVoter", "status": status, "reason": reason, "message": message})
    res = {"cpu": str(node.get("cpus", 1)), "memory": f"{node.get('memory_kib', 1048576)}Ki", "pods": "110"}
    if node.get("vgpus"):
        res["nvidia.com/gpu"] = str(node["vgpus"])
    annotations = {"gpulab.lab/runtimes": ",".join(node.get("runtimes", [])), **node.get("annotations", {})}
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
            "conditions": conditions,
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
        controller would leave them installed (a chart's install job runs for a moment, then completes; what
        the chart installs is HAMi's, :func:`hami.install_chart`), then a step of the Deployments' pods."""
        docs = manifest_docs() if docs is None else docs
        charts = [d for d in docs if d.get("kind") == "HelmChart"]
        with self.lock:
            seen = self.state.setdefault("charts_seen", {})
            jobs, daemonsets, deployments, vgpus, present, objects = {}, [], {}, {}, set(), {}
            services = {}  # the Services of the monitoring charts (HAMi-WebUI's) and Open WebUI's, by namespace/name
            release = None
            for chart in charts:
                meta, spec = chart.get("metadata", {}), chart.get("spec", {})
                name, ns = meta.get("name", "chart"), meta.get("namespace", "kube-system")
                target = spec.get("targetNamespace") or ns
                present.add(f"{ns}/{name}")
                first = seen.setdefault(f"{ns}/{name}", time.time())
                if time.time() - first < 2:
                    continue  # the install job runs for a moment
                if spec.get("chart") == open_webui_chart.CHART:  # stage workloads' front end (Open WebUI)
                    jobs[f"{ns}/helm-install-{name}"] = {"complete": True}
                    # its StatefulSet's rollout (kubectl rollout status; the API lists Deployments only) and its
                    # Service, whose LoadBalancer port the servers answer on (server.serve_open_webui)
                    rollouts, _, made_services = open_webui_chart.install_chart(name, target, spec)
                    deployments.update(rollouts)
                    services.update(made_services)
                    continue
                if spec.get("chart") in monitoring_charts.CHARTS:
                    # Prometheus, Grafana and HAMi-WebUI (module monitoring_charts); every other chart is HAMi's
                    node_ports = self.state.setdefault("node_ports", {})
                    installed = monitoring_charts.install_chart(name, target, spec, node_ports)
                    if installed is None:
                        jobs[f"{ns}/helm-install-{name}"] = {"complete": False}
                        continue  # Helm's install fails: the job is retried and never completes
                    jobs[f"{ns}/helm-install-{name}"] = {"complete": True}
                    rollouts, made, made_services = installed
                    deployments.update(rollouts)
                    objects.update(made)
                    services.update(made_services)
                    continue
                jobs[f"{ns}/helm-install-{name}"] = {"complete": True}
                daemonset, scheduler, release, chart_vgpus = hami.install_chart(
                    self.state, name, ns, target, spec
                )
                daemonsets.append(daemonset)
                deployments[f"{target}/{name}-scheduler"] = {"ready": True}
                objects[f"{target}/{name}-scheduler"] = scheduler
                vgpus.update(chart_vgpus)
            for key in [k for k in seen if k not in present]:
                del seen[key]  # a chart taken out is uninstalled
            monitoring_charts.remove_pods(set(deployments))  # and its pod goes (the lab's kubelet stops it)
            ports = self.state.setdefault("node_ports", {})
            for key in [k for k in ports if k.rsplit("/", 1)[0] not in services]:
                del ports[key]  # a Service's NodePorts are freed with it
            for node_name, node in self.state["nodes"].items():
                node["vgpus"] = vgpus.get(node_name, 0)
            self.state["hami"] = release
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
            self.keep_secrets(docs)
            deployments.update(self.run_pods(docs))
            self.step_direct_pods()
            self.state.update(
                jobs=jobs,
                daemonsets=daemonsets,
                deployments=deployments,
                deployment_objects=objects,
                services=services,
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
            # the LoadBalancer ports that reach it (k3s' ServiceLB, kube-vip): where its node serves the engine
            lan = {f"{k[0]}/{k[1]}": v for k, v in services.items()}
            pod["lan_ports"] = engine.lan_ports(lan, pod["namespace"], pod.get("labels") or {})
            pods.extend(entry.get("failed", []))  # pods the kubelet rejected stay, Failed (module hami)
            if pod.get("phase") != "Failed":
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
            if pod.get("scheduler") == hami.HAMI_SCHEDULER and hami.gpu_request(spec)["count"]:
                if not self.hami_schedule(pod):
                    return pod  # Pending, with HAMi's reason
                target = pod["node"]
            elif hami.gpu_request(pod.get("spec") or {}) != hami.gpu_request({}):
                # a GPU pod that went around HAMi's webhook: default-scheduler's resource fit (module hami)
                target = hami.default_schedule(self.state, pod, self.gpu_pods(), self.alive)
                if target is None:
                    return pod  # Pending, with default-scheduler's reason
            else:
                target = self.placement(doc)
                if target is None:
                    return pod  # Pending
            pod.update(node=target, boot=self.state["nodes"][target].get("boot_id"))
        node = self.state["nodes"][pod["node"]]
        if not self.alive(pod["node"]):
            return pod  # the node is down: nothing runs, and the API keeps showing the last status
        if pod["started"] is None and self.reject(pod):
            # rejected at admission: the ReplicaSet makes a new pod on the next step, which goes the same way
            entry["failed"] = [*entry.get("failed", []), pod][-hami.FAILED_KEPT :]
            entry["pod"] = None
            return pod
        if node.get("boot_id") != pod["boot"]:
            # the node rebooted: the pod's sandbox is gone, its init containers and its container run again
            pod.update(boot=node.get("boot_id"), init_passed=0, started=None, ready=None)
            pod["restarts"] += 1
        while pod["init_passed"] < len(inits):
            init = inits[pod["init_passed"]]
            if not registry.ensure(self.state, pod["node"], pod, init.get("name"), init.get("image"), now):
                return pod  # Init:ErrImagePull / Init:ImagePullBackOff (module registry)
            urls = init_urls(init)
            if not all(self.answers(url, found, services) for url in urls):
                return pod  # Init:N/M, not Ready
            pod["init_passed"] += 1
        if pod["started"] is None and not self.pulled(pod, spec.get("containers") or [], now):
            return pod  # ErrImagePull / ImagePullBackOff
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

    def pulled(self, pod, containers, now):
        """Whether the images of a pod's containers are on its node (pulled now if not; module registry)."""
        return all(
            registry.ensure(self.state, pod["node"], pod, c.get("name"), c.get("image"), now)
            for c in containers
        )

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

    # --- HAMi's webhook and scheduler (module hami; called with the lock held) -------------------------

    def webhook_answers(self):
        return hami.webhook_answers(self.state)

    def admit(self, namespace, spec):
        return hami.admit(self.state, namespace, spec)

    def gpu_pods(self):
        """Every pod that holds an allocation now (the Deployments' and the ones created with kubectl)."""
        keys = getattr(self, "current_keys", set(self.state.get("deployment_history", {})))
        history = self.state.get("deployment_history", {})
        pods = [(history[k] or {}).get("pod") for k in keys if k in history]
        return [p for p in pods + list(self.state.get("direct_pods", {}).values()) if p]

    def hami_schedule(self, pod):
        return hami.schedule(self.state, pod, self.gpu_pods(), self.alive)

    def reject(self, pod):
        """The kubelet's admission of a bound pod (hami.kubelet_admit): True when it rejected it (Failed)."""
        refused = hami.kubelet_admit(self.state, pod)
        if refused:
            pod.update(phase="Failed", failed_reason=refused[0], failed_message=refused[1], reason=None)
        return bool(refused)

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
                req = hami.gpu_request(pod["spec"])
                if pod["scheduler"] == hami.HAMI_SCHEDULER and req["count"]:
                    if not self.hami_schedule(pod):
                        continue
                elif req != hami.gpu_request({}):
                    # went around HAMi's webhook: default-scheduler's resource fit (module hami)
                    name = hami.default_schedule(self.state, pod, self.gpu_pods(), self.alive)
                    if name is None:
                        continue
                    card = (self.state["nodes"][name].get("gpu_cards") or [{}])[0]
                    pod.update(
                        node=name, reason=None, visible_mib=[card.get("memory_mib", 0)] * max(req["count"], 1)
                    )
                else:
                    name = next((n for n, v in sorted(self.state["nodes"].items())
                                 if self.alive(n) and not v.get("unschedulable")), None)  # fmt: skip
                    if name is None:
                        continue
                    pod.update(node=name, reason=None)
                pod["boot"] = self.state["nodes"][pod["node"]].get("boot_id")
            if pod.get("phase") == "Failed":
                continue
            if (
                pod["started"] is None
                and self.alive(pod["node"])
                and not self.reject(pod)
                and self.pulled(pod, pod["spec"].get("containers") or [], time.time())
            ):
                pod["started"] = pod["ready"] = time.time()

    def keep_secrets(self, docs):
        """The Secrets of the manifests, as k3s' deploy controller applies them: a Secret is applied when its
        document is new or changed, then stays, also when its file is taken out (k3s deletes nothing then),
        until it is deleted. Kept: name, namespace, type and the names of its keys, never their values."""
        kept = self.state.setdefault("secrets", {})
        applied = self.state.setdefault("secrets_applied", {})
        for doc in docs:
            meta = doc.get("metadata") or {}
            if doc.get("kind") != "Secret" or not meta.get("name"):
                continue
            ns = meta.get("namespace", "default")
            key = f"{ns}/{meta['name']}"
            digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]
            if applied.get(key) == digest:
                continue  # applied already: a Secret deleted since comes back only with a changed document
            applied[key] = digest
            keys = sorted({*(doc.get("data") or {}), *(doc.get("stringData") or {})})
            kept[key] = {"apiVersion": "v1", "kind": "Secret", "type": doc.get("type", "Opaque"),
                         "metadata": {"name": meta["name"], "namespace": ns}, "data": dict.fromkeys(keys, "")}  # fmt: skip

    def delete_secrets(self, namespace, names):
        """kubectl delete secret NAME...: the names deleted."""
        kept = self.state.setdefault("secrets", {})
        gone = [n for n in names if kept.pop(f"{namespace}/{n}", None) is not None]
        self.save()
        return gone

    def delete_pods(self, namespace, names, selector):
        direct = self.state.get("direct_pods", {})
        gone = []
        for entry in self.state.get("deployment_history", {}).values():
            pod = entry.get("pod")
            if not pod or pod["namespace"] != namespace:
                continue
            if names and pod["name"] in names:
                # deleted by name (not by selector: the stand-in's kubectl reads no --field-selector, which the
                # workloads stage's cleanup of pods that went around HAMi adds): the ReplicaSet makes a new one
                entry["pod"] = None
                gone.append(pod["name"])
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
            # config.yaml's node-label on every start of the node's k3s (agent, or server with its agent), not
            # only when the node registers (pkg/agent/run.go @v1.33.5+k3s1, configureNode: updateMutableLabels):
            # merged over the node's labels, so a value changed or a label taken off with kubectl since is set
            # again, other labels stay, and an entry taken out of config.yaml leaves its label on the node
            start = info.get("start", "")
            if node.get("start") != start:
                node["labels"].update(info.get("labels", {}))
                node["start"] = start
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
                # registries.yaml as the node's k3s read it when it started (module registry)
                registries=info.get("registries") or {},
            )
            for k, v in info.get("role_labels", {}).items():
                node["labels"][k] = v
            self.save()

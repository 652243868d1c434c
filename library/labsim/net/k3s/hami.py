"""HAMi on the k3s stand-in: its device plugin's register annotation, its chart as k3s' helm controller installs
it, its mutating webhook and its scheduler's card accounting.

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
  HAMi's reason (``1/1 CardInsufficientMemory``); the memory a container then sees (``kubectl logs``) is its
  share with HAMi-core on, the card's with ``CUDA_DISABLE_CONTROL=true`` or under default-scheduler.

The functions take the cluster's state (``Cluster.state``) and are called with its lock held.
"""

import hashlib
import json
import re
import time

from .common import version


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


def install_chart(state, name, namespace, target, spec):
    """What k3s' helm controller leaves installed for HAMi's HelmChart `namespace/name` (its spec `spec`, its
    release in `target`): (the device plugin's DaemonSet, the scheduler Deployment, the release as the webhook
    sees it, nvidia.com/gpu per node).

    Only HAMi's shape is modelled: the device-plugin DaemonSet and the scheduler Deployment roll out, and every
    node that matches the device plugin's node selector, runs the chart's runtime class and has GPUs offers
    deviceSplitCount x its cards as nvidia.com/gpu and gets the register annotation.
    """
    import yaml

    values = yaml.safe_load(spec.get("valuesContent") or "") or {}
    plugin = values.get("devicePlugin") or {}
    split = int(plugin.get("deviceSplitCount", 10))
    selector = plugin.get("nvidiaNodeSelector") or {"gpu": "on"}
    runtime = plugin.get("runtimeClassName")
    image = "docker.io/projecthami/hami:v2.7.0"
    containers = [
        {"name": "device-plugin", "image": image},
        {"name": "vgpu-monitor", "image": image},
    ]
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": f"{name}-device-plugin", "namespace": target},
        "spec": {"template": {"spec": {"containers": containers}}},
    }
    # the chart renders the kube-scheduler tag from the server's version when it is installed
    # (again only when the HelmChart changes, as k3s' helm controller does)
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    installed = state.setdefault("charts_installed", {})
    if (installed.get(f"{namespace}/{name}") or {}).get("digest") != digest:
        installed[f"{namespace}/{name}"] = {"digest": digest, "kube_version": version()}
    kube_version = installed[f"{namespace}/{name}"]["kube_version"]
    scheduler = scheduler_deployment(
        f"{name}-scheduler",
        target,
        kube_scheduler_image(values, kube_version),
        spec.get("version"),
    )
    scaling = float(plugin.get("deviceMemoryScaling", 1) or 1)
    webhook = ((values.get("scheduler") or {}).get("admissionWebhook")) or {}
    release = {
        "release": name,
        "namespace": target,
        "runtime": runtime,
        "failure_policy": webhook.get("failurePolicy") or "Ignore",
        "enabled": webhook.get("enabled", True) is not False,
    }
    replicas = state.get("scaled", {}).get(f"{target}/{name}-scheduler", 1)
    scheduler["spec"]["replicas"] = replicas
    if replicas == 0:
        scheduler["status"] = {"replicas": 0}
    vgpus = {}
    for node_name, node in state["nodes"].items():
        labels = node.get("labels", {})
        matches = all(str(labels.get(k)) == str(v) for k, v in selector.items())
        if matches and node.get("gpus") and (runtime is None or runtime in node.get("runtimes", [])):
            vgpus[node_name] = node["gpus"] * split
            # the device plugin registers the cards it found when it started (the agent's)
            node["hami_register"] = register_annotation(node.get("gpu_cards", []), split, scaling)
    return daemonset, scheduler, release, vgpus


def webhook_answers(state):
    """Whether HAMi's mutating webhook answers: the chart is installed and its scheduler has a replica."""
    hami = state.get("hami")
    if not hami or not hami.get("enabled"):
        return False
    key = f"{hami['namespace']}/{hami['release']}-scheduler"
    return state.get("scaled", {}).get(key, 1) != 0


def admit(state, namespace, spec):
    """A pod created now, through HAMi's webhook: (its schedulerName, the refusal or None, its spec).

    The webhook sends a pod asking for NVIDIA resources to hami-scheduler (and sets the chart's
    runtimeClassName when the pod has none). When it does not answer, failurePolicy Ignore (the chart's
    default) creates the pod as it is, for default-scheduler: the fail-open HAMi users report; Fail refuses it.
    """
    spec = json.loads(json.dumps(spec))
    wanted = spec.get("schedulerName") or "default-scheduler"
    if not gpu_request(spec)["count"] or wanted != "default-scheduler":
        return wanted, None, spec
    hami = state.get("hami")
    if hami and hami.get("enabled") and not webhook_answers(state):
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


def schedule(state, pod, others, alive):
    """HAMi's filter for one pod: the first node with cards that fit (count, memory, cores, pinned UUIDs).
    Placed: node, annotations hami.io/vgpu-node and vgpu-devices-allocated, the memory its container sees.
    Not: the pod's reason, as HAMi's extender reports it. `others` are the pods that hold an allocation now,
    `alive(node_name)` whether a node runs its pods."""
    spec, ann = pod.get("spec") or {}, pod.get("annotations") or {}
    req = gpu_request(spec)
    pins = [u.strip() for u in str(ann.get("nvidia.com/use-gpuuuid", "")).split(",") if u.strip()]
    used = {}
    for other in others:
        if other is pod or other.get("node") is None:
            continue
        for a in decode_allocated((other.get("annotations") or {}).get("hami.io/vgpu-devices-allocated")):
            u = used.setdefault(a["uuid"], {"mem": 0, "cores": 0, "count": 0})
            u["mem"] += a["mem"]
            u["cores"] += a["cores"]
            u["count"] += 1
    reasons, candidates = {}, 0
    for name, node in sorted(state["nodes"].items()):
        if node.get("unschedulable") or not alive(name) or not node.get("hami_register"):
            continue
        candidates += 1
        picked, why = [], {}
        for card in json.loads(node["hami_register"]):
            u = used.get(card["id"], {"mem": 0, "cores": 0, "count": 0})
            mem = req["mem"] or (card["devmem"] * req["percent"] // 100 if req["percent"] else card["devmem"])
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
            pod.update(node=name, reason=None, visible_mib=[m if core else c["devmem"] for c, m in picked])
            return True
        cards = len(json.loads(node["hami_register"]))
        reasons[name] = (
            ", ".join(f"{n}/{cards} {r}" for r, n in sorted(why.items())) or "NodeInsufficientDevice"
        )
    detail = "; ".join(f"{n}: {r}" for n, r in reasons.items())
    pod["reason"] = (
        f"0/{len(state['nodes'])} nodes are available: no available node, {candidates} nodes do not meet"
        + (f" ({detail})" if detail else "")
    )
    return False

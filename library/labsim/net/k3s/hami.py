"""HAMi on the k3s stand-in: its device plugin's register annotation, its chart as k3s' helm controller installs
it, its mutating webhook, its scheduler's card accounting, and what the kubelet makes of a GPU pod HAMi did not
place. What each behaviour is taken from, and its test, is listed in library/labsim/UPSTREAM.md (## HAMi).

* HAMi's HelmChart: the objects are the chart's own rendering with role hami's values (module ``hami_chart``,
  made by scripts/render_hami_chart.py from charts/hami at v2.10.0 and v2.9.0; the HelmChart's ``version``
  picks one, else 2.10.0): the webhook configuration (failurePolicy from the HelmChart's values, else the
  chart's Ignore), its Service, the scheduler Deployment's containers (kube-scheduler's image from the values
  and the server's version without ``+k3s1`` at the chart's install) and the device plugin's DaemonSet. Where
  the device plugin runs (the node selector's labels, the runtime class, a card), the node gets
  ``hami.io/node-nvidia-register`` as the plugin writes it (JSON in DeviceInfo's member order, zero values
  left out; 2.9.0 also writes ``"devicepairscore":{}``) from the cards nvidia-smi listed when the agent
  started (a card changed since is not seen until it restarts, as with HAMi's plugin).
* HAMi's webhook: a pod asking for ``nvidia.com/gpu`` gets ``schedulerName: hami-scheduler`` (and the chart's
  runtime class), and a container asking for a whole card without ``nvidia.com/gpucores`` gets gpucores 100.
  Scaled to 0 (``kubectl scale``) the webhook does not answer: failurePolicy Ignore creates the pod unchanged,
  for default-scheduler, while Fail refuses it. ``get endpointslices -l kubernetes.io/service-name=...`` shows
  the webhook Service's endpoint, ready while the scheduler has a replica, none at 0.
* HAMi's scheduler places a pod on a card the node's register annotation lists (pinned UUIDs, ``count``,
  ``devmem``, ``devcore``) from what the other pods hold, with HAMi's Fit (memory, cores, a pod asking all 100
  cores only on a card nobody holds, a pod asking none not on a card whose cores are all taken), writes
  ``hami.io/vgpu-devices-allocated`` (``UUID,NVIDIA,MiB,cores:;``) on it, or leaves it Pending with the
  message kube-scheduler writes from HAMi's answer (``0/3 nodes are available: 1 1/1 CardInsufficientMemory,
  2 node unregistered. preemption: ...``); the memory a container then sees (``kubectl logs``) is its share
  with HAMi-core on, the card's with ``CUDA_DISABLE_CONTROL=true``.
* A GPU pod that went around the webhook: default-scheduler's resource fit leaves one asking HAMi's share
  resources Pending (no node offers them) and binds one asking ``nvidia.com/gpu`` alone; the kubelet then
  rejects it, since HAMi's device plugin serves only pods HAMi's scheduler bound: phase Failed, reason
  UnexpectedAdmissionError. A Deployment's ReplicaSet makes a new pod after each, which goes the same way.

The functions take the cluster's state (``Cluster.state``) and are called with its lock held.
"""

import hashlib
import json
import re
import time

from . import hami_chart
from .common import version

#: the chart version the project pins; its rendering stands in for a version the fixture does not hold
PINNED_CHART = "2.10.0"
#: kubelet's reason for a pod whose devices could not be allocated at admission (pkg/kubelet/cm/admission)
UNEXPECTED_ADMISSION = "UnexpectedAdmissionError"
#: HAMi's scheduler extender's reason for a node without HAMi's devices (pkg/scheduler/scheduler.go@v2.10.0)
NODE_UNREGISTERED = "node unregistered"
#: HAMi 2.10's per-card cordon: a node annotation listing GPU UUIDs that take no new pods
DEVICE_CORDON = "hami.io/device-cordon"
#: the Deployment pods rejected at admission that the stand-in keeps listed per Deployment (kube-controller-
#: manager's pod GC only removes terminated pods above 12500)
FAILED_KEPT = 50


def rendered_chart(chart_version):
    """HAMi's chart as rendered with role hami's values (module hami_chart, scripts/render_hami_chart.py): the
    rendering of `chart_version`, else of the pinned chart."""
    return (
        hami_chart.CHARTS.get(str(chart_version or "").removeprefix("v")) or hami_chart.CHARTS[PINNED_CHART]
    )


def rendered_object(chart, template):
    """The (first) manifest that the chart's template `template` renders, e.g. scheduler/webhook.yaml."""
    return chart["manifests"][f"{chart['chart']}/templates/{template}"][0]


def version_tuple(v):
    return tuple(int(x) for x in re.findall(r"\d+", str(v or ""))[:3]) or (0,)


def register_annotation(cards, split, memory_scaling=1, core_scaling=1, chart_version=PINNED_CHART):
    """`hami.io/node-nvidia-register` as HAMi's device plugin writes it (JSON since 2.8.0, MarshalNodeDevices in
    pkg/device/devices.go): per card id, index, count, devmem, devcore, type, numa, mode, health, in the order
    DeviceInfo declares them, Go's omitempty leaving out zero values (numa 0, index 0). Before 2.10.0 DeviceInfo
    also holds the struct devicepairscore, which omitempty cannot leave out: it is written as `{}`
    (pkg/device/devices.go@v2.9.0); at v2.10.0 it is `json:"-"`."""
    pair_score = version_tuple(chart_version) < (2, 10)
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
        entry = {k: v for k, v in entry.items() if v not in (0, "", False, None)}
        out.append({**entry, "devicepairscore": {}} if pair_score else entry)
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
    """HAMi's MutatingWebhookConfiguration as the chart renders it (template scheduler/webhook.yaml of the
    rendering, module hami_chart), for this release: its name, its Service and the failure policy of the
    HelmChart's values."""
    chart = rendered_chart(hami.get("chart_version"))
    doc = json.loads(json.dumps(rendered_object(chart, "scheduler/webhook.yaml")))
    doc["metadata"]["name"] = f"{hami['release']}-webhook"
    for hook in doc["webhooks"]:
        hook["failurePolicy"] = hami["failure_policy"]
        hook["clientConfig"]["service"].update(
            name=f"{hami['release']}-scheduler", namespace=hami["namespace"]
        )
    return doc


def webhook_service(hami):
    """The Service HAMi's webhook is called through (template scheduler/service.yaml of the rendering): name,
    namespace, selector (the scheduler pod that leads: `hami.io/scheduler-role: leader`) and ports."""
    chart = rendered_chart(hami.get("chart_version"))
    doc = json.loads(json.dumps(rendered_object(chart, "scheduler/service.yaml")))
    doc["metadata"].update(name=f"{hami['release']}-scheduler", namespace=hami["namespace"])
    return doc


def webhook_endpoints(state):
    """The EndpointSlice of the webhook's Service: one endpoint, ready, while the scheduler has a replica (its
    pod is the elected leader the Service selects), none at 0 replicas (the API server then finds no endpoint
    to call the webhook at)."""
    hami = state["hami"]
    service = webhook_service(hami)
    name = service["metadata"]["name"]
    endpoints = [{"addresses": ["10.42.0.9"], "conditions": {"ready": True, "serving": True, "terminating": False},
                  "targetRef": {"kind": "Pod", "name": f"{name}-0", "namespace": hami["namespace"]}}]  # fmt: skip
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": f"{name}-gpulab", "namespace": hami["namespace"],
                     "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4",
        "endpoints": endpoints if webhook_answers(state) else None,
        "ports": [{"name": p["name"], "port": p["targetPort"], "protocol": p["protocol"]}
                  for p in service["spec"]["ports"]],
    }  # fmt: skip


def scheduler_deployment(name, namespace, kube_scheduler, chart_version):
    """HAMi's scheduler Deployment (kubectl get deployment -o json): its two containers and their images, as the
    chart renders them (template scheduler/deployment.yaml), kube-scheduler's image from the HelmChart's values and
    the server's version."""
    chart = rendered_chart(chart_version)
    rendered = rendered_object(chart, "scheduler/deployment.yaml")["spec"]["template"]["spec"]["containers"]
    hami = next(c["image"] for c in rendered if c["name"] == "vgpu-scheduler-extender")
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
    chart = rendered_chart(spec.get("version"))
    rendered = rendered_object(chart, "device-plugin/daemonsetnvidia.yaml")["spec"]["template"]["spec"]
    containers = [{"name": c["name"], "image": c["image"]} for c in rendered["containers"]]
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
        # the chart's default failure policy is the rendering's (Ignore), the HelmChart's values may set another
        "failure_policy": webhook.get("failurePolicy")
        or rendered_object(chart, "scheduler/webhook.yaml")["webhooks"][0]["failurePolicy"],
        "enabled": webhook.get("enabled", True) is not False,
        "chart_version": chart["version"],
        # the scheduler and the vGPU monitor add the names before 2.9 (module hami_metrics)
        "legacy_metrics": values.get("legacyMetrics") is True,
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
            node["hami_register"] = register_annotation(
                node.get("gpu_cards", []), split, scaling, chart_version=chart["version"]
            )
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
    for container in spec.get("containers") or []:
        exclusive_cores(container)
    return HAMI_SCHEDULER, None, spec


def exclusive_cores(container):
    """HAMi's webhook gives a container that asks for nvidia.com/gpu but no nvidia.com/gpucores the whole card's
    cores (gpucores 100) when it asks for the whole memory: no gpumem and no gpumem-percentage, or a percentage of
    100 (defaultExclusiveCoreIfNeeded, pkg/device/nvidia/device.go@v2.10.0, the same at v2.9.0)."""
    res = container.setdefault("resources", {})
    asked = {**(res.get("requests") or {}), **(res.get("limits") or {})}
    if "nvidia.com/gpu" not in asked or "nvidia.com/gpucores" in asked:
        return
    percent = asked.get("nvidia.com/gpumem-percentage")
    if (percent is not None and str(percent) == "100") or (
        percent is None and "nvidia.com/gpumem" not in asked
    ):
        res.setdefault("limits", {})["nvidia.com/gpucores"] = 100


def card_usage(others, pod):
    """What the pods holding an allocation hold on each card: memory, cores, pods (`Used` in HAMi)."""
    used = {}
    for other in others:
        if other is pod or other.get("node") is None or other.get("phase") == "Failed":
            continue
        for a in decode_allocated((other.get("annotations") or {}).get("hami.io/vgpu-devices-allocated")):
            u = used.setdefault(a["uuid"], {"mem": 0, "cores": 0, "count": 0})
            u["mem"] += a["mem"]
            u["cores"] += a["cores"]
            u["count"] += 1
    return used


def cordoned_cards(annotations, version="2.10.0"):
    """The UUIDs of the node annotation `hami.io/device-cordon` (HAMi v2.10.0 pkg/device/nvidia/device.go,
    DeviceCordonAnnotation and cordonedDevices): a comma-separated list, each entry trimmed, empty ones
    skipped; no annotation or an empty value cordons nothing. HAMi 2.9.0 has no such annotation."""
    if version_tuple(version) < (2, 10):
        return set()
    raw = str((annotations or {}).get(DEVICE_CORDON, ""))
    return {u.strip() for u in raw.split(",") if u.strip()}


def card_refusal(card, used, req, mem, pins, cordoned=frozenset()):
    """Why HAMi's Fit (pkg/device/nvidia/device.go@v2.10.0, the same checks at v2.9.0) refuses this card for
    the request, in its order, or None: an unhealthy card, a card the node's `hami.io/device-cordon` names
    (CardCordoned, 2.10.0: new pods only, the pods on it keep running), a UUID the pod does not pin, every time slice taken
    (deviceSplitCount), too little memory or cores left, all 100 cores asked on a card another pod holds
    (exclusive), no cores asked on a card whose cores are all taken."""
    cores = min(req["cores"], 100)  # HAMi caps a request above 100 at 100
    total_cores = card.get("devcore", 0)
    if card.get("health") is not True:
        return "CardNotHealth"
    if card["id"] in cordoned:
        return "CardCordoned"
    if pins and card["id"] not in pins:
        return "CardUuidMismatch"
    if used["count"] >= card.get("count", 0):
        return "CardTimeSlicingExhausted"
    if card.get("devmem", 0) - used["mem"] < mem:
        return "CardInsufficientMemory"
    if total_cores - used["cores"] < cores:
        return "CardInsufficientCore"
    if total_cores == 100 and cores == 100 and used["count"] > 0:
        return "ExclusiveDeviceAllocateConflict"
    if total_cores != 0 and used["cores"] == total_cores and cores == 0:
        return "CardComputeUnitsExhausted"
    return None


def gen_reason(reasons, cards):
    """HAMi's reason for one node: `N/CARDS Reason` per reason, sorted, joined by `, ` (GenReason,
    pkg/device/common/common.go@v2.10.0; v2.9.0 joins them in Go's map order, unsorted)."""
    return ", ".join(sorted(f"{n}/{cards} {r}" for r, n in reasons.items()))


def fit_error(node_reasons, nodes):
    """The PodScheduled message kube-scheduler writes when no node fits (FitError, pkg/scheduler/framework):
    `0/N nodes are available: ` and each reason with the number of nodes giving it, sorted, then the preemption
    plugin's own such sentence (a node failed by a filter that preemption can help, as an extender's failure,
    has no lower-priority pod to evict: `No preemption victims found for incoming pod`; a cordoned or tainted
    one is `Preemption is not helpful for scheduling`), each ending in `.`, the last doubled as kube-scheduler
    writes it. `node_reasons`: node -> (its reasons, whether preemption could help)."""
    hist, pre = {}, {}
    for reasons, helps in node_reasons.values():
        for r in reasons:
            hist[r] = hist.get(r, 0) + 1
        why = (
            "No preemption victims found for incoming pod"
            if helps
            else "Preemption is not helpful for scheduling"
        )
        pre[why] = pre.get(why, 0) + 1

    def histogram(counts):
        return ", ".join(sorted(f"{n} {r}" for r, n in counts.items()))

    return (
        f"0/{nodes} nodes are available: {histogram(hist)}. "
        f"preemption: 0/{nodes} nodes are available: {histogram(pre)}.."
    )


def node_filters(name, node, alive):
    """kube-scheduler's own filters before any extender: a cordoned node, a node that stopped reporting (its
    unreachable taint), as (reasons, whether preemption could help) or None when the node passes them."""
    if node.get("unschedulable"):
        return ["node(s) were unschedulable"], False
    if not alive(name):
        return ["node(s) had untolerated taint {node.kubernetes.io/unreachable: }"], False
    return None


def filtered_nodes(state, alive, node_reasons):
    """The nodes, (name, node) by name, that pass kube-scheduler's own filters (node_filters); each node refused
    there gets its reasons in `node_reasons`."""
    for name, node in sorted(state["nodes"].items()):
        refused = node_filters(name, node, alive)
        if refused:
            node_reasons[name] = refused
        else:
            yield name, node


def schedule(state, pod, others, alive):
    """HAMi's scheduler for one pod: kube-scheduler's filters (the GPU resources are the extender's, ignored by
    kube-scheduler), then HAMi's extender on the nodes left (pkg/scheduler/scheduler.go@v2.10.0 Filter): a node
    without HAMi's register annotation is `node unregistered`, a node with fewer cards than asked
    `NodeInsufficientDevice`, else each card goes through HAMi's Fit (card_refusal). Placed on the first node
    whose cards fit: node, annotations hami.io/vgpu-node, vgpu-time, bind-phase and vgpu-devices-allocated, the
    memory its container sees. Not placed: the PodScheduled message kube-scheduler writes from the extender's
    failed nodes (fit_error), e.g. `0/3 nodes are available: 1 1/1 CardInsufficientMemory, 2 node
    unregistered. preemption: ...`. `others` are the pods that hold an allocation now, `alive(node_name)`
    whether a node runs its pods."""
    spec, ann = pod.get("spec") or {}, pod.get("annotations") or {}
    req = gpu_request(spec)
    pins = [u.strip() for u in str(ann.get("nvidia.com/use-gpuuuid", "")).split(",") if u.strip()]
    used = card_usage(others, pod)
    node_reasons = {}
    for name, node in filtered_nodes(state, alive, node_reasons):
        if not node.get("hami_register"):
            node_reasons[name] = [NODE_UNREGISTERED], True
            continue
        cards = json.loads(node["hami_register"])
        cordoned = cordoned_cards(
            node.get("annotations"), (state.get("hami") or {}).get("chart_version") or PINNED_CHART
        )
        if req["count"] > len(cards):
            node_reasons[name] = ["NodeInsufficientDevice"], True
            continue
        picked, why = [], {}
        for card in cards:
            u = used.get(card["id"], {"mem": 0, "cores": 0, "count": 0})
            mem = req["mem"] or (card["devmem"] * req["percent"] // 100 if req["percent"] else card["devmem"])
            refusal = card_refusal(card, u, req, mem, pins, cordoned)
            if refusal:
                why[refusal] = why.get(refusal, 0) + 1
            else:
                picked.append((card, mem))
            if len(picked) == req["count"]:
                break
        if len(picked) == req["count"]:
            cores = min(req["cores"], 100)
            allocated = "".join(f"{c['id']},NVIDIA,{m},{cores}:" for c, m in picked) + ";"
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
        if picked:
            why["AllocatedCardsInsufficientRequest"] = len(picked)
        node_reasons[name] = [gen_reason(why, len(cards))], True
    pod["reason"] = fit_error(node_reasons, len(state["nodes"]))
    return False


#: the resources HAMi's device plugin offers on a node (allocatable); the others are HAMi's scheduler's only
OFFERED = ("nvidia.com/gpu",)
#: HAMi's resources as a pod asks for them (gpu_request's keys)
ASKED = {"count": "nvidia.com/gpu", "mem": "nvidia.com/gpumem", "percent": "nvidia.com/gpumem-percentage",
         "cores": "nvidia.com/gpucores"}  # fmt: skip


def default_schedule(state, pod, others, alive):
    """default-scheduler for a pod asking for NVIDIA resources (one that went around HAMi's webhook): its
    NodeResourcesFit compares each extended resource asked with what the node offers, and only HAMi's device
    plugin offers one, nvidia.com/gpu (deviceSplitCount x cards); gpumem, gpumem-percentage and gpucores no node
    offers (only HAMi's scheduler ignores them, managedResources ignoredByScheduler in the chart's scheduler
    config), so such a pod stays Pending (`Insufficient nvidia.com/gpumem-percentage`). Returns the node it is
    bound to, or None with the pod's PodScheduled message set."""
    req = gpu_request(pod.get("spec") or {})
    held = {}
    for other in others:
        if other is not pod and other.get("node") and other.get("phase") != "Failed":
            held[other["node"]] = held.get(other["node"], 0) + gpu_request(other.get("spec") or {})["count"]
    node_reasons = {}
    for name, node in filtered_nodes(state, alive, node_reasons):
        offered = {"nvidia.com/gpu": node.get("vgpus", 0) - held.get(name, 0)}
        short = sorted(
            f"Insufficient {res}" for key, res in ASKED.items() if req[key] and req[key] > offered.get(res, 0)
        )
        if not short:
            return name
        node_reasons[name] = short, True
    pod["reason"] = fit_error(node_reasons, len(state["nodes"]))
    return None


def kubelet_admit(state, pod):
    """The kubelet's admission of a pod bound to its node, for the devices HAMi's device plugin offers there:
    None when admitted, else (reason, message) as the kubelet writes them into the Failed pod's status.

    The kubelet asks the plugin's Allocate for nvidia.com/gpu; it serves only the pod that HAMi's scheduler
    bound to this node (GetPendingPod, pkg/util/util.go@v2.10.0: a Pending pod with hami.io/vgpu-time, bind-phase
    allocating or success, and hami.io/vgpu-node naming the node), and answers `no binding pod found on node
    NODE` otherwise. The kubelet wraps the gRPC error as an unexpected admission error (pkg/kubelet/cm/admission:
    `Allocate failed due to ..., which is unexpected`) and rejects the pod: phase Failed, reason
    UnexpectedAdmissionError, message `Pod was rejected: ...` (kubelet's rejectPod)."""
    node = state["nodes"].get(pod.get("node") or "") or {}
    if not gpu_request(pod.get("spec") or {})["count"] or not node.get("vgpus"):
        return None
    ann = pod.get("annotations") or {}
    if (
        "hami.io/vgpu-time" in ann
        and ann.get("hami.io/bind-phase") in ("allocating", "success")
        and ann.get("hami.io/vgpu-node") == pod["node"]
    ):
        return None
    return UNEXPECTED_ADMISSION, (
        "Pod was rejected: Allocate failed due to rpc error: code = Unknown desc = no binding pod found on node "
        f"{pod['node']}, which is unexpected"
    )

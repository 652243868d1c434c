"""What stage hami proves on each GPU node, from one `kubectl get nodes -o json` and the scheduler Deployment.

HAMi's device plugin writes each card it found into the node annotation `hami.io/node-nvidia-register`
(a JSON array since HAMi 2.8.0: `id` = GPU UUID, `index`, `count` = deviceSplitCount, `devmem` = total MiB
x deviceMemoryScaling, `devcore`, `type`, `numa`, `mode`, `health`, zero values left out; before 2.8 the
colon-separated string `UUID,count,devmem,devcore,type,numa,health:...`). The checks compare it with the
cards the guest's nvidia-smi reports (the `gpulab_gpus` facts of module gpu_facts), and also check
the node selector's label, allocatable `nvidia.com/gpu` = deviceSplitCount x cards, and the tag of the
scheduler's kube-scheduler image against the server's Kubernetes version (without `+k3s1`).

Each problem says whether waiting can cure it (`wait`: the device plugin has not registered yet) or not
(a missing label, a card that is not the guest's): the stage waits only while every problem is of the first
kind, so a wrong lab fails at once instead of after the whole ready timeout.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

REGISTER_ANNOTATION = "hami.io/node-nvidia-register"
CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"
KUBE_VERSION_RE = re.compile(r"^(v\d+\.\d+\.\d+)")


_GO_BOOLS = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True,
             "0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False}  # fmt: skip


def parse_register(text: str | None) -> list[dict[str, Any]] | None:
    """The cards of a register annotation (JSON array or the pre-2.8 colon string); None when absent or
    unreadable.

    JSON entries come as HAMi wrote them; a member left out is Go's zero value (``health`` absent means an
    unhealthy card), so ``health`` is always set here. The colon string is read as HAMi's DecodeNodeDevices
    reads it (pkg/device/devices.go@v2.10.0): `UUID,count,devmem,devcore,type,numa,health` per card, or with
    `,index,mode` after it, `:` after each card; a card of another length, a field that is not a number or a
    Go boolean, or a negative index makes the whole annotation unreadable, as at v2.10.0.
    """
    if not text:
        return None
    text = text.strip()
    if text.startswith("["):
        try:
            cards = json.loads(text)
        except ValueError:
            return None
        if not isinstance(cards, list):
            return None
        return [
            {**c, "health": c.get("health") is True} for c in cards if isinstance(c, dict) and c.get("id")
        ]
    if ":" not in text:
        return None
    cards = []
    for item in (part for part in text.split(":") if part.strip()):
        fields = item.split(",")
        if len(fields) not in (7, 9) or fields[6] not in _GO_BOOLS:
            return None
        try:
            card = {
                "id": fields[0],
                "count": int(fields[1]),
                "devmem": int(fields[2]),
                "devcore": int(fields[3]),
                "type": fields[4],
                "numa": int(fields[5]),
                "health": _GO_BOOLS[fields[6]],
                "index": int(fields[7]) if len(fields) == 9 else 0,
                "mode": fields[8] if len(fields) == 9 else "hami-core",
            }
        except ValueError:
            return None
        if card["index"] < 0:
            return None
        cards.append(card)
    return cards


def stripped_version(version: str) -> str:
    """`v1.33.5+k3s1` -> `v1.33.5`, as HAMi's chart derives the kube-scheduler tag."""
    m = KUBE_VERSION_RE.match(version or "")
    return m[1] if m else version


def server_version(nodes: Sequence[Mapping[str, Any]]) -> str | None:
    """The server's Kubernetes version: the kubelet version of a control-plane node (k3s runs one binary)."""
    for node in nodes:
        if CONTROL_PLANE_LABEL in ((node.get("metadata") or {}).get("labels") or {}):
            return ((node.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion")
    return None


def _problem(host: str, field: str, value: Any, cause: str, fix: str, wait: bool = False) -> dict[str, Any]:
    return {"host": host, "field": field, "value": value, "cause": cause, "fix": fix, "wait": wait}


def node_problems(
    nodes_doc: Mapping[str, Any],
    gpus_by_host: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    split: int,
    memory_scaling: float = 1,
    node_selector: Mapping[str, str] | None = None,
    namespace: str = "kube-system",
    release: str = "hami",
) -> list[dict[str, Any]]:
    """Every problem of the GPU nodes `gpus_by_host` (inventory host = node name -> its guest's cards)."""
    nodes = {(n.get("metadata") or {}).get("name"): n for n in nodes_doc.get("items") or []}
    selector = dict(node_selector or {"gpu": "on"})
    out = []
    for host, gpus in gpus_by_host.items():
        node = nodes.get(host)
        if node is None:
            fix = "run stage k3s on it (its agent joins the cluster under its inventory name)"
            out.append(_problem(host, "node", None, f"no k3s node named {host}", fix, wait=True))
            continue
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        for key, want in selector.items():
            if labels.get(key) != want:
                have = f"{key}={labels[key]}" if key in labels else "no such label"
                out.append(
                    _problem(
                        host,
                        f"label {key}",
                        labels.get(key),
                        f"node {host} does not carry the label {key}={want} ({have}), so HAMi's device plugin "
                        "(nodeSelector devicePlugin.nvidiaNodeSelector) does not run there and offers no vGPU",
                        f"run stage k3s again (it labels the GPU nodes), or k3s kubectl label node {host} "
                        f"{key}={want} --overwrite",
                    )
                )
        if not gpus:
            out.append(
                _problem(
                    host,
                    "gpulab_gpus",
                    None,
                    f"no GPU facts for {host} (nvidia-smi in the guest listed no card)",
                    "run stage guests on it and check the passed-through card (nvidia-smi -L in the guest)",
                )
            )
            continue
        registered = parse_register((meta.get("annotations") or {}).get(REGISTER_ANNOTATION))
        plugin_logs = (
            f"k3s kubectl -n {namespace} logs daemonset/{release}-device-plugin -c device-plugin (on {host})"
        )
        if registered is None:
            out.append(
                _problem(
                    host,
                    REGISTER_ANNOTATION,
                    None,
                    f"HAMi's device plugin has not registered the cards of node {host} (no readable annotation "
                    f"{REGISTER_ANNOTATION})",
                    f"check the device plugin pod: {plugin_logs}",
                    wait=True,
                )
            )
        else:
            by_id = {c["id"]: c for c in registered}
            guest = {g["uuid"]: g for g in gpus}
            for uuid, g in guest.items():
                card = by_id.get(uuid)
                if card is None:
                    out.append(
                        _problem(
                            host,
                            REGISTER_ANNOTATION,
                            ", ".join(by_id) or "no card",
                            f"the guest's nvidia-smi reports card {uuid} ({g.get('name')}), which HAMi did not "
                            f"register on node {host} (it registered {', '.join(by_id) or 'no card'}); pods "
                            "pinned to this UUID would never be placed",
                            f"restart HAMi's device plugin on {host} so that it registers the cards it sees now "
                            f"(k3s kubectl -n {namespace} delete pod -l app.kubernetes.io/component="
                            f"{release}-device-plugin --field-selector spec.nodeName={host}); if the card was "
                            "swapped, run stage guests first",
                        )
                    )
                    continue
                total = g.get("memory_total_mib")
                want = int(total * memory_scaling) if isinstance(total, int) else None
                if want is not None and int(card.get("devmem") or 0) != want:
                    out.append(
                        _problem(
                            host,
                            f"{REGISTER_ANNOTATION} devmem",
                            card.get("devmem"),
                            f"HAMi registered card {uuid} on node {host} with {card.get('devmem')} MiB, but the "
                            f"guest's nvidia-smi reports {total} MiB (x deviceMemoryScaling {memory_scaling} = "
                            f"{want} MiB); memory shares would be computed from the wrong total",
                            f"restart HAMi's device plugin on {host} and check devicePlugin.deviceMemoryScaling "
                            "(hami_device_memory_scaling) and the per-node devicememoryscaling of "
                            "devicePlugin.nodeConfiguration",
                        )
                    )
            for uuid in by_id.keys() - guest.keys():
                out.append(
                    _problem(
                        host,
                        REGISTER_ANNOTATION,
                        uuid,
                        f"HAMi registered card {uuid} on node {host}, which the guest's nvidia-smi does not "
                        f"report ({', '.join(guest)}): a stale registration from a card that is gone",
                        f"restart HAMi's device plugin on {host} ({plugin_logs} shows what it found)",
                    )
                )
        allocatable = ((node.get("status") or {}).get("allocatable") or {}).get("nvidia.com/gpu", "0")
        want_vgpus = split * len(gpus)
        if int(allocatable or 0) != want_vgpus:
            out.append(
                _problem(
                    host,
                    "allocatable nvidia.com/gpu",
                    allocatable,
                    f"node {host} offers {allocatable} nvidia.com/gpu, expected {want_vgpus} ({len(gpus)} card(s) "
                    f"x deviceSplitCount {split})",
                    f"check the device plugin pod ({plugin_logs}) and that no other device plugin advertises "
                    "nvidia.com/gpu",
                    wait=True,
                )
            )
    return out


def scheduler_problems(
    nodes_doc: Mapping[str, Any],
    deployment: Mapping[str, Any] | None,
    *,
    namespace: str = "kube-system",
    release: str = "hami",
    host: str = "k3s server",
    asked_tag: str = "",
) -> list[dict[str, Any]]:
    """The scheduler Deployment's kube-scheduler image tag against the server's version. `asked_tag`: the tag the
    HelmChart now sets ("" : left to the chart). When it is the server's version and the scheduler still runs
    another, the chart's new rollout has not reached the Deployment yet: waiting can cure that (k3s' helm
    controller runs the install job again once it sees the changed HelmChart)."""
    name = f"{release}-scheduler"
    if not deployment:
        return [
            _problem(
                host,
                f"deployment {namespace}/{name}",
                None,
                f"HAMi's scheduler Deployment {namespace}/{name} is missing",
                f"check the chart's install job: k3s kubectl -n {namespace} logs job/helm-install-{release}",
                wait=True,
            )
        ]
    containers = (
        (((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers")
    ) or []
    scheduler = next((c for c in containers if c.get("name") == "kube-scheduler"), None)
    if scheduler is None:
        return []  # scheduler.kubeScheduler.enabled: false - HAMi's extender runs alone
    image = str(scheduler.get("image") or "")
    tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else "latest"
    version = server_version(nodes_doc.get("items") or [])
    if version is None:
        return []
    want = stripped_version(version)
    if tag != want:
        return [
            _problem(
                host,
                "hami_kube_scheduler_image.tag",
                tag,
                f"HAMi's scheduler runs kube-scheduler {image}, but the server is Kubernetes {version}: "
                f"the tag must be {want} (its version without the +k3s suffix), or the scheduler fails or "
                "schedules by another version's rules",
                f"set hami_kube_scheduler_image.tag to {want!r} (or leave it empty for the chart to take the "
                "server's version) and run stage hami again",
                wait=bool(asked_tag) and asked_tag == want,
            )
        ]
    return []


def problems_text(problems: Sequence[Mapping[str, Any]]) -> str:
    """One readable line per problem: host, field, value, cause, fix."""
    return " ".join(
        f"[{i}] {p['host']}: {p['field']} = {p['value'] if p['value'] is not None else '(none)'}: {p['cause']}. "
        f"Fix: {p['fix']}."
        for i, p in enumerate(problems, 1)
    )


def ready_endpoints(slices_doc: Mapping[str, Any] | None) -> int:
    """Ready endpoints of a Service's EndpointSlices (`get endpointslices -l kubernetes.io/service-name=NAME`);
    a missing `ready` condition counts as ready, as the EndpointSlice API says."""
    return sum(
        1
        for item in (slices_doc or {}).get("items") or []
        for ep in item.get("endpoints") or []
        if (ep.get("conditions") or {}).get("ready") is not False
    )


def webhook_state(
    webhooks_doc: Mapping[str, Any] | None,
    deployment: Mapping[str, Any] | None,
    endpoints_doc: Mapping[str, Any] | None = None,
) -> str:
    """HAMi's admission webhook as the cluster shows it: its configuration (failure policy, service), the
    replicas of the scheduler Deployment that serves it and, when given, the ready endpoints of its Service
    (the API server calls the webhook through the Service: without a ready endpoint it cannot), as one
    sentence."""
    hooks = [
        (item.get("metadata", {}).get("name"), hook)
        for item in (webhooks_doc or {}).get("items") or []
        for hook in item.get("webhooks") or []
        if "hami" in str(item.get("metadata", {}).get("name")) or "hami" in str(hook.get("name"))
    ]
    if not hooks:
        parts = [
            "no MutatingWebhookConfiguration of HAMi (scheduler.admissionWebhook.enabled false, or HAMi is not installed)"
        ]
    else:
        parts = []
        for config, hook in hooks:
            svc = (hook.get("clientConfig") or {}).get("service") or {}
            parts.append(
                f"webhook {hook.get('name')} of {config}: failurePolicy {hook.get('failurePolicy', 'Fail')}, service "
                f"{svc.get('namespace')}/{svc.get('name')}:{svc.get('port', 443)}{svc.get('path', '')}"
            )
    if deployment:
        status = deployment.get("status") or {}
        want = (deployment.get("spec") or {}).get("replicas", 1)
        parts.append(
            f"its scheduler Deployment {deployment.get('metadata', {}).get('name')} has "
            f"{status.get('readyReplicas', 0)} of {want} replica(s) ready"
        )
    else:
        parts.append("its scheduler Deployment is missing")
    if endpoints_doc is not None:
        svc = next(((h.get("clientConfig") or {}).get("service") or {} for _, h in hooks), {})
        name = f"{svc.get('namespace', '?')}/{svc.get('name', '?')}"
        ready = ready_endpoints(endpoints_doc)
        parts.append(
            f"its Service {name} has {ready} ready endpoint(s)"
            + (
                ""
                if ready
                else " (the API server cannot reach the webhook: no pod of the scheduler is ready and elected)"
            )
        )
    return "; ".join(parts)


def decode_allocated(text: str | None) -> list[dict[str, Any]]:
    """`hami.io/vgpu-devices-allocated` (written by HAMi's scheduler): `UUID,TYPE,usedmem,usedcores:` per
    card, `;` between containers."""
    out = []
    for container in (text or "").split(";"):
        for item in container.split(":"):
            fields = item.split(",")
            if len(fields) == 4 and fields[0]:
                try:
                    out.append(
                        {"uuid": fields[0], "type": fields[1], "mem": int(fields[2]), "cores": int(fields[3])}
                    )
                except ValueError:
                    continue
    return out


def card_usage(nodes_doc: Mapping[str, Any], pods_doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Who holds what on each card HAMi registered: per card (node, uuid, type, devmem) the pods that HAMi's
    scheduler allocated on it (from their hami.io/vgpu-devices-allocated), their memory, share and cores, the
    percent of the card's memory that is free, and its cores (devcore) and the cores held (used_cores). Pods that ended (Succeeded, Failed) hold nothing."""
    cards = []
    by_uuid = {}
    for node in nodes_doc.get("items") or []:
        meta = node.get("metadata") or {}
        for card in parse_register((meta.get("annotations") or {}).get(REGISTER_ANNOTATION)) or []:
            entry = {
                "node": meta.get("name"),
                "uuid": card["id"],
                "type": card.get("type", ""),
                "devmem": int(card.get("devmem") or 0),
                "devcore": int(card.get("devcore") or 0),
                "pods": [],
            }
            cards.append(entry)
            by_uuid[card["id"]] = entry
    for pod in pods_doc.get("items") or []:
        meta = pod.get("metadata") or {}
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for alloc in decode_allocated((meta.get("annotations") or {}).get("hami.io/vgpu-devices-allocated")):
            card = by_uuid.get(alloc["uuid"])
            if card is None:
                continue
            percent = round(100 * alloc["mem"] / card["devmem"]) if card["devmem"] else 0
            card["pods"].append(
                {
                    "pod": f"{meta.get('namespace')}/{meta.get('name')}",
                    "mem_mib": alloc["mem"],
                    "percent": percent,
                    "cores": alloc["cores"],
                }
            )
    for card in cards:
        used = sum(p["mem_mib"] for p in card["pods"])
        card["used_mib"] = used
        card["used_cores"] = sum(p["cores"] for p in card["pods"])
        card["free_percent"] = max(0, 100 - round(100 * used / card["devmem"])) if card["devmem"] else 0
    return cards


# --- pods as the scheduler and the kubelet leave them ----------------------------------------------------------

#: kube-scheduler's FitError (pkg/scheduler/framework/types.go): "0/N nodes are available: <count reason, ...>."
#: then " preemption: ..." once the preemption plugin has run
_FIT_RE = re.compile(r"^0/(\d+) nodes are available: (.*?)\.(?: preemption: (.*))?$", re.S)
_HAMI_CARD_RE = re.compile(r"^(\d+)/(\d+) (\w+)$")
#: what HAMi's device plugin answers the kubelet for a pod HAMi's scheduler did not bind
#: (GetPendingPod, pkg/util/util.go@v2.10.0, the same at v2.9.0)
NO_BINDING_POD = "no binding pod found on node"
#: the kubelet's reason for a pod whose device allocation failed at admission (pkg/kubelet/cm/admission)
UNEXPECTED_ADMISSION = "UnexpectedAdmissionError"


def scheduling_reasons(message: str | None) -> dict[str, Any] | None:
    """A PodScheduled condition's message, as kube-scheduler writes it: the node count, each reason with the
    number of nodes that gave it, and the preemption part; None for another text.

    HAMi's scheduler extender gives kube-scheduler one reason per node: `node unregistered` for a node without
    HAMi's devices, else the per-card counts of HAMi's Fit (`1/1 CardInsufficientMemory`, several joined by
    `, `, GenReason in pkg/device/common/common.go@v2.10.0), so `0/3 nodes are available: 1 1/1
    CardInsufficientMemory, 2 node unregistered.` reads as one node refused for its card's memory and two
    without HAMi's devices. Each reason is (nodes, text, HAMi's card reasons in it as [cards, of, reason]);
    `hami` names every card reason of HAMi's that the message holds.
    """
    m = _FIT_RE.match((message or "").strip())
    if not m:
        return None
    reasons: list[list[Any]] = []
    for token in m[2].split(", "):
        head = re.match(r"^(\d+) (.*)$", token)
        if head:
            reasons.append([int(head[1]), head[2]])
        elif reasons:
            reasons[-1][1] += ", " + token  # the next card reason of the same node (HAMi's GenReason)
        else:
            return None
    out = []
    for count, text in reasons:
        cards = [_HAMI_CARD_RE.match(part) for part in text.split(", ")]
        hami = [[int(c[1]), int(c[2]), c[3]] for c in cards if c] if all(cards) else []
        out.append({"nodes": count, "reason": text, "hami": hami})
    names = sorted({r[2] for entry in out for r in entry["hami"]})
    return {"nodes": int(m[1]), "reasons": out, "hami": names, "preemption": m[3]}


def pod_scheduled_message(pod: Mapping[str, Any]) -> str | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return cond.get("message")
    return None


def pod_state(pod: Mapping[str, Any]) -> str:
    """One pod as a cluster shows it, in words: its scheduler, phase, and why it does not run."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    name = f"{meta.get('namespace')}/{meta.get('name')}"
    scheduler = spec.get("schedulerName") or "default-scheduler"
    phase = status.get("phase") or "Pending"
    if phase == "Failed" and status.get("reason") == UNEXPECTED_ADMISSION:
        return (
            f"{name} (schedulerName {scheduler}) was bound to {spec.get('nodeName') or '?'} and then rejected by "
            f"the kubelet: Failed, {UNEXPECTED_ADMISSION} ({status.get('message') or 'no message'})"
        )
    if phase == "Failed":
        return f"{name} (schedulerName {scheduler}) Failed: {status.get('reason') or ''} {status.get('message') or ''}"
    if phase == "Pending" and not spec.get("nodeName"):
        return (
            f"{name} (schedulerName {scheduler}) Pending: {pod_scheduled_message(pod) or 'not scheduled yet'}"
        )
    return f"{name} (schedulerName {scheduler}) {phase} on {spec.get('nodeName') or '?'}"


def around_hami(pods: Sequence[Mapping[str, Any]], scheduler_name: str = "hami-scheduler") -> dict[str, Any]:
    """The pods that went around HAMi (another schedulerName) and what became of them, with a sentence.

    When HAMi's webhook does not answer and its failurePolicy is Ignore (the chart's default), a GPU pod is
    created unchanged, for default-scheduler. Asking HAMi's share resources (nvidia.com/gpumem-percentage,
    gpumem, gpucores, which no node offers: only HAMi's scheduler ignores them), it stays Pending with
    `Insufficient nvidia.com/...`. Asking nvidia.com/gpu alone, default-scheduler binds it to a node offering
    HAMi's vGPUs, and at admission the kubelet asks HAMi's device plugin for them: its Allocate finds no pod
    that HAMi's scheduler bound to the node (GetPendingPod: `no binding pod found on node NODE`), so the kubelet
    rejects the pod (phase Failed, reason UnexpectedAdmissionError), and a Deployment's ReplicaSet makes a new
    pod, which goes the same way, again and again.
    """
    around = [
        p
        for p in pods
        if ((p.get("spec") or {}).get("schedulerName") or "default-scheduler") != scheduler_name
    ]
    rejected = [
        p for p in around
        if (p.get("status") or {}).get("phase") == "Failed" and (p.get("status") or {}).get("reason") == UNEXPECTED_ADMISSION
    ]  # fmt: skip
    pending = [p for p in around if (p.get("status") or {}).get("phase", "Pending") == "Pending"]
    parts = []
    if rejected:
        parts.append(
            f"{len(rejected)} pod(s) were bound by default-scheduler and rejected by the kubelet "
            f"({UNEXPECTED_ADMISSION}: HAMi's device plugin hands out cards only to pods HAMi's scheduler bound, "
            f"'{NO_BINDING_POD} ...'); a Deployment's ReplicaSet makes a new pod after each, again and again"
        )
    if pending:
        parts.append(
            f"{len(pending)} pod(s) are Pending under default-scheduler (HAMi's share resources are known only to "
            "HAMi's scheduler, or the kubelet has not admitted them yet)"
        )
    return {
        "pods": [p.get("metadata", {}).get("name") for p in around],
        "rejected": len(rejected),
        "pending": len(pending),
        "text": "; ".join(parts + [pod_state(p) for p in around[:3]])
        + (f"; and {len(around) - 3} more" if len(around) > 3 else ""),
    }

"""What stage hami proves on each GPU node, from one `kubectl get nodes -o json` and the scheduler Deployment.

HAMi's device plugin writes each card it found into the node annotation `hami.io/node-nvidia-register`
(a JSON array since HAMi 2.8.0: `id` = GPU UUID, `index`, `count` = deviceSplitCount, `devmem` = total MiB
x deviceMemoryScaling, `devcore`, `type`, `numa`, `mode`, `health`, zero values left out; before 2.8 the
colon-separated string `UUID,count,devmem,devcore,type,numa,health:...`). The checks compare it with the
cards the guest's nvidia-smi reports (the `gpulab_gpus` facts of module gpulab_gpu_facts), and also check
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
            out.append(
                _problem(
                    host,
                    "node",
                    None,
                    f"no k3s node named {host}",
                    "run stage k3s on it (its agent joins the cluster under its inventory name)",
                    wait=True,
                )
            )
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
) -> list[dict[str, Any]]:
    """The scheduler Deployment's kube-scheduler image tag against the server's version."""
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


def webhook_state(webhooks_doc: Mapping[str, Any] | None, deployment: Mapping[str, Any] | None) -> str:
    """HAMi's admission webhook as the cluster shows it: its configuration (failure policy, service) and the
    replicas of the scheduler Deployment that serves it, as one sentence."""
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

"""The upgrade of one GPU node at a time (playbooks/upgrade.yml, issue 28 bullet 5): the plan, HAMi's device
cordon and the proof after the upgrade. Pure decisions; the playbook reads and acts.

For each GPU node in turn (inventory order) the plan is: cordon the node and put its cards under HAMi's device
cordon (node annotation ``hami.io/device-cordon``: GPU UUIDs joined by commas, read by HAMi 2.10's Fit, which
then refuses new pods on those cards: Project-HAMi/HAMi pkg/device/nvidia/device.go@v2.10.0), drain its GPU
pods, upgrade what differs from the inventory (the NVIDIA driver branch, the container toolkit, k3s), reboot
when the driver changed (the new kernel module loads only at boot; until then nvidia-smi says NVML's
driver/library version mismatch), prove nvidia-smi and HAMi's registered cards again, then lift the device
cordon and uncordon, and see the node's engines come back in their start order. A node that fails its proof
stays cordoned and the run stops with the reason (`proof_problems`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpulab.k8s.hami_checks import REGISTER_ANNOTATION, parse_register

DEVICE_CORDON_ANNOTATION = "hami.io/device-cordon"


def cordoned_cards(value: str | None) -> list[str]:
    """The UUIDs of a device-cordon annotation as HAMi reads it: split at commas, each trimmed, empty ones
    skipped."""
    return [u.strip() for u in (value or "").split(",") if u.strip()]


def device_cordon(value: str | None, add: Sequence[str] = (), remove: Sequence[str] = ()) -> str:
    """The annotation's new value: `add` joined to what is there (kept in order, no repeats), `remove` taken
    out; "" when no card is left (the playbook then takes the annotation off)."""
    cards = [u for u in cordoned_cards(value) if u not in set(remove)]
    cards += [u for u in add if u not in cards and u not in set(remove)]
    return ",".join(cards)


def driver_branch(version: str | None) -> str:
    """The branch of a driver version as nvidia-smi reports it (`580.173.02` -> `580`); "" when unknown."""
    head = (version or "").split(".", 1)[0]
    return head if head.isdigit() else ""


def engines_in_order(engines: Sequence[Mapping[str, Any]], node: str) -> list[str]:
    """The names of the engines on `node`, in their start order (the inventory's workloads_engines order, the
    order the workloads stage starts engines that share a card in)."""
    return [str(e.get("name")) for e in engines if e.get("node") == node]


def node_plan(
    node: str,
    *,
    running: Mapping[str, str],
    wanted: Mapping[str, str],
    cards: Sequence[str],
    gpu_pods: Sequence[str],
    engines: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """One GPU node's plan: {node, upgrade ({what: [from, to]} for each of driver_branch, toolkit, k3s that
    differs), reboot (the driver changes), steps (in order, each a sentence), engines (start order)}.

    `running`/`wanted`: driver_branch, toolkit, k3s as the node runs them and as the inventory wants them (a
    value that is not known yet, "", counts as different); `cards`: the node's GPU UUIDs; `gpu_pods`: the
    namespace/name of the pods on the node that ask for nvidia.com/gpu."""
    upgrade = {
        what: [running.get(what, ""), wanted[what]]
        for what in ("driver_branch", "toolkit", "k3s")
        if wanted.get(what) and running.get(what, "") != wanted[what]
    }
    order = engines_in_order(engines, node)
    if not upgrade:
        return {"node": node, "upgrade": {}, "reboot": False, "engines": order,
                "steps": [f"{node}: nothing to upgrade (driver {running.get('driver_branch')}, toolkit "
                          f"{running.get('toolkit')}, k3s {running.get('k3s')})"]}  # fmt: skip
    reboot = "driver_branch" in upgrade
    what = ", ".join(f"{k} {v[0] or 'unknown'} -> {v[1]}" for k, v in upgrade.items())
    steps = [
        f"cordon {node}",
        f"put {DEVICE_CORDON_ANNOTATION} on {node} for its cards {', '.join(cards) or '(none registered)'}",
        f"drain {node}'s GPU pods: {', '.join(gpu_pods) or 'none'}",
        f"upgrade {node}: {what}",
        *([f"reboot {node} to load driver branch {upgrade['driver_branch'][1]}"] if reboot else []),
        f"prove {node}: nvidia-smi sees its cards on the wanted driver, HAMi registers them again",
        f"take {DEVICE_CORDON_ANNOTATION} off {node} and uncordon it",
        *([f"see {node}'s engines Ready again in their start order: {', '.join(order)}"] if order else []),
    ]
    return {"node": node, "upgrade": upgrade, "reboot": reboot, "engines": order, "steps": steps}


def plan_text(plans: Sequence[Mapping[str, Any]]) -> str:
    """The plan as --check shows it: one numbered line a step, node after node."""
    lines = []
    for p in plans:
        lines += [f"{i}. {s}" for i, s in enumerate(p["steps"], 1)]
    return "\n".join(lines)


def proof_problems(
    node: str,
    *,
    wanted_branch: str,
    smi_driver: str | None,
    smi_cards: Sequence[str],
    cards: Sequence[str],
    node_object: Mapping[str, Any] | None,
    smi_error: str | None = None,
) -> list[str]:
    """What keeps `node` cordoned after its upgrade, one sentence each (field, value, why, fix); [] when it
    passes. `smi_driver`/`smi_cards`: the driver version and GPU UUIDs nvidia-smi reports now (None: it
    failed); `cards`: the UUIDs the node had before; `node_object`: the node from `kubectl get node -o json`;
    `smi_error`: why nvidia-smi failed (gpu_facts' error, e.g. version_mismatch)."""
    problems = []
    if smi_driver is None and smi_error == "version_mismatch":
        problems.append(
            f"{node}: nvidia-smi fails after the upgrade with NVML's driver/library version mismatch: the new "
            f"driver is installed but the old kernel module still runs, and the new one loads only at boot; "
            f"reboot {node} (playbooks/upgrade.yml does when nvidia_driver_reboot is true)"
        )
    elif smi_driver is None:
        problems.append(
            f"{node}: nvidia-smi fails after the upgrade ({smi_error or 'no answer'}): the driver did not load; "
            f"read `nvidia-smi` and `journalctl -b -k | grep -i nvidia` on {node}"
        )
    elif driver_branch(smi_driver) != str(wanted_branch):
        problems.append(
            f"{node}: nvidia-smi reports driver {smi_driver}, not branch {wanted_branch} (nvidia_driver_branch): "
            f"the new module did not load; reboot {node} or check the installed nvidia-*-{wanted_branch}-server packages"
        )
    missing = [u for u in cards if u not in set(smi_cards)]
    if smi_driver is not None and missing:
        problems.append(
            f"{node}: nvidia-smi does not see card(s) {', '.join(missing)} it had before the upgrade"
        )
    annotations = ((node_object or {}).get("metadata") or {}).get("annotations") or {}
    registered = parse_register(annotations.get(REGISTER_ANNOTATION)) or []
    healthy = {c["id"] for c in registered if c.get("health")}
    unregistered = [u for u in cards if u not in healthy]
    if unregistered:
        problems.append(
            f"{node}: HAMi has not registered card(s) {', '.join(unregistered)} as healthy ({REGISTER_ANNOTATION}): "
            f"its device plugin on {node} did not find them; read the hami-device-plugin pod's log there"
        )
    return problems


def gpu_pods(pods: Mapping[str, Any] | None, node: str) -> list[str]:
    """`namespace/name` of the pods on `node` that ask for nvidia.com/gpu (a container's limit or request), from
    `kubectl get pods -A -o json`: the pods the drain takes off the cards."""
    out = []
    for pod in (pods or {}).get("items") or []:
        spec = pod.get("spec") or {}
        if spec.get("nodeName") != node:
            continue
        asks = any(
            "nvidia.com/gpu" in ((c.get("resources") or {}).get(kind) or {})
            for c in spec.get("containers") or []
            for kind in ("limits", "requests")
        )
        if asks:
            meta = pod.get("metadata") or {}
            out.append(f"{meta.get('namespace')}/{meta.get('name')}")
    return out


def registered_cards(node_object: Mapping[str, Any] | None) -> list[str]:
    """The GPU UUIDs HAMi's device plugin registered on the node (its register annotation), in its order."""
    annotations = ((node_object or {}).get("metadata") or {}).get("annotations") or {}
    return [str(c["id"]) for c in parse_register(annotations.get(REGISTER_ANNOTATION)) or [] if c.get("id")]


def toolkit_running(ctk_version: str | None) -> str:
    """The toolkit version of `nvidia-ctk --version`'s first line (`NVIDIA Container Toolkit CLI version 1.18.1`
    -> `1.18.1`); "" when nvidia-ctk is not there."""
    words = (ctk_version or "").split()
    return words[-1] if words and words[-1][:1].isdigit() else ""


def toolkit_wanted(debian_version: str | None) -> str:
    """nvidia_container_toolkit_version as nvidia-ctk reports it: the upstream part of the Debian version
    (`1.18.1-1` -> `1.18.1`); "" (the newest, nothing pinned) stays "", which the plan does not compare."""
    return (
        (debian_version or "").rsplit("-", 1)[0] if "-" in (debian_version or "") else (debian_version or "")
    )

"""The end-of-run lab table: one row per VM with what PVE, nvidia-smi and k3s report about it.

`rows()` is pure: it joins the VM configs PVE returns, the GPU facts of each VM and the k3s node
list. `read_vm_configs()` does the PVE reads (one list, and one config per VM whose config the caller
does not already hold). `markdown()` and `text()` render the table; `write()` stores it as lab-table.md,
lab-table.json and lab-table.html (a picture of the lab, gpulab.labpage).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpulab import labpage
from gpulab.k8s.hami_checks import card_usage
from gpulab.pve.client import PveClient

COLUMNS = (
    ("vm", "VM"),
    ("vmid", "id"),
    ("node", "PVE node"),
    ("address", "address"),
    ("shape", "vCPU / RAM / disk"),
    ("platform", "machine / firmware"),
    ("gpu", "passed-through GPU"),
    ("onboot", "start at boot"),
    ("driver", "driver / card (nvidia-smi)"),
    ("k3s", "k3s node"),
    ("hami", "HAMi vGPUs"),
    ("shares", "card shares (HAMi)"),
)
_DISK_KEYS = re.compile(r"^(scsi|virtio|sata|ide)\d+$")


def read_vm_configs(client: PveClient, vms: list[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Config, power state and PVE node of each VM ({name, node, vmid}, and its `config` when the caller read
    it already in this run: then it is not read again); absent VMs map to {}. The node is where PVE's cluster
    list says the VM is, which is the inventory's vm_node unless the VM was moved by hand."""
    listed = {int(r["vmid"]): r for r in client.get("cluster/resources", type="vm") or [] if "vmid" in r}
    out: dict[str, dict[str, Any]] = {}
    for vm in vms:
        entry = listed.get(int(vm["vmid"]))
        if entry is None:
            out[vm["name"]] = {}
            continue
        node = entry.get("node", vm["node"])
        config = vm.get("config") or (client.get(f"nodes/{node}/qemu/{vm['vmid']}/config") or {})
        out[vm["name"]] = {"status": entry.get("status"), "node": node, "config": config}
    return out


def _disk_size(config: Mapping[str, Any]) -> str:
    for key in sorted(config):
        if _DISK_KEYS.match(key) and "media=cdrom" not in str(config[key]):
            m = re.search(r"size=(\d+[KMGT]?)", str(config[key]))
            if m:
                return m.group(1)
    return "?"


def _node_status(node: Mapping[str, Any]) -> str:
    conditions = {c.get("type"): c.get("status") for c in node.get("status", {}).get("conditions", [])}
    ready = "Ready" if conditions.get("Ready") == "True" else "NotReady"
    labels = node.get("metadata", {}).get("labels", {})
    roles = sorted(k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/"))
    role = ",".join(r for r in roles if r) or "agent"
    version = node.get("status", {}).get("nodeInfo", {}).get("kubeletVersion", "")
    return " ".join(x for x in (ready, role, version) if x)


def down_text(vm: Mapping[str, Any], found: Mapping[str, Any]) -> str:
    """Why the VM is down, or "": PVE lists it but not running, or the run found it unreachable (the k3s
    stages' probe, `down` in its entry: a server that does not answer the controller)."""
    status = found.get("status")
    if found and status and status != "running":
        return f"down (VM {status})"
    if vm.get("down"):
        return "down (not answering)"
    return ""


def rows(
    vms: list[Mapping[str, Any]],
    pve: Mapping[str, Mapping[str, Any]],
    gpus: Mapping[str, list[Mapping[str, Any]]],
    k8s_nodes: list[Mapping[str, Any]],
    k8s_pods: list[Mapping[str, Any]] | None = None,
    kube_context: str = "",
    endpoints: list[Mapping[str, Any]] | None = None,
    links: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """One row per VM. `vms`: {name, vmid, address, gpu (a card id, a list of them, or None), down (the run
    found it unreachable)}; `pve`: read_vm_configs(); `gpus`: GPU facts
    per VM name; `k8s_nodes`: items of `kubectl get nodes -o json` (node name = inventory name); `k8s_pods`:
    items of `kubectl get pods -A -o json`, whose HAMi annotations say who holds what on each card;
    `kube_context`: the context of the cluster in the controller's kubeconfig (stage k3s writes it), named in the
    row of each VM that is a node of the cluster; `endpoints`: the LAN engines stage workloads called ({name, url,
    model, node, cards, gpu_memory_percent}), listed in the row of their node (`endpoints`: name, url, model,
    share); `links`: where the lab's UIs are reached (name -> URL), whose stage monitoring UIs are endpoints of
    kind monitoring too (monitoring_endpoints)."""
    nodes = {n.get("metadata", {}).get("name"): n for n in k8s_nodes}
    usage = card_usage({"items": list(k8s_nodes)}, {"items": list(k8s_pods or [])})
    endpoints = [*(endpoints or []), *monitoring_endpoints(links or {}, vms, k8s_nodes)]
    table = []
    for vm in vms:
        name = vm["name"]
        found = pve.get(name) or {}
        config = found.get("config") or {}
        memory = config.get("memory", "?")
        balloon = " fixed" if str(config.get("balloon", "")) == "0" else ""
        cards = gpus.get(name) or []
        node = nodes.get(name)
        alloc = (node or {}).get("status", {}).get("allocatable", {}).get("nvidia.com/gpu")
        down = down_text(vm, found)
        k3s = _node_status(node) if node else "-"
        table.append(
            {
                "vm": name,
                "vmid": str(vm.get("vmid", "")),
                "node": str(found.get("node") or "-"),
                "address": str(vm.get("address") or "?"),
                "shape": f"{config.get('cores', '?')} / {memory} MiB{balloon} / {_disk_size(config)}"
                if config
                else "absent",
                "platform": f"{config.get('machine', 'i440fx')} / {config.get('bios', 'seabios')}"
                if config
                else "",
                "gpu": gpu_text(vm.get("gpu"), config),
                "onboot": ("yes" if str(config.get("onboot", "0")) == "1" else "no") if config else "",
                "driver": driver_text(cards),
                # a VM that is down says so first: its node's status is the last the cluster heard
                "k3s": f"{down}, {k3s}" if down and node else down or k3s,
                "hami": str(alloc) if alloc is not None else "-",
                "shares": shares_text([c for c in usage if c["node"] == name]),
                **({"context": kube_context} if kube_context and node else {}),
            }
        )
        served = [endpoint_entry(e) for e in endpoints if e.get("node") == name]
        if served:
            table[-1]["endpoints"] = served
    return table


#: stage monitoring's UIs as roles/monitoring notes them (monitoring_urls: key -> URL): key, endpoint name, what
MONITORING_UIS = (("prometheus", "prometheus", "Prometheus"), ("grafana", "grafana", "Grafana"),
                  ("webui", "hami-webui", "HAMi-WebUI"))  # fmt: skip


def monitoring_endpoints(
    links: Mapping[str, str], vms: list[Mapping[str, Any]], k8s_nodes: list[Mapping[str, Any]]
) -> list[dict[str, str]]:
    """Stage monitoring's UIs among `links` (Prometheus, Grafana, HAMi-WebUI when on) as endpoints of kind
    monitoring, each on the VM whose address its URL names (the server stage monitoring serves them on), else on
    the first VM that is a control-plane node (an address no VM holds: kube-vip's)."""
    servers = {
        n.get("metadata", {}).get("name")
        for n in k8s_nodes
        if "node-role.kubernetes.io/control-plane" in (n.get("metadata", {}).get("labels") or {})
    }
    by_address = {str(vm.get("address")): vm["name"] for vm in vms if vm.get("address")}
    first_server = next((vm["name"] for vm in vms if vm["name"] in servers), None)
    out = []
    for key, name, what in MONITORING_UIS:
        url = str(links.get(key) or "")
        if not url:
            continue
        host = url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]
        node = by_address.get(host) or first_server
        if node:
            out.append({"name": name, "kind": "monitoring", "url": url, "model": what, "node": node,
                        "share": "no GPU"})  # fmt: skip
    return out


def endpoint_entry(engine: Mapping[str, Any]) -> dict[str, str]:
    """A LAN engine as the table lists it: name, URL, model and its card share (`45 % of GPU-6f2a1c3e-0d4`).
    Another endpoint (Open WebUI, stage workloads' front end) gives its `kind` and its own `share` text."""
    cards = ", ".join(str(c)[:12] for c in engine.get("cards") or []) or "?"
    share = engine.get("share") or f"{engine.get('gpu_memory_percent', 100)} % of {cards}"
    kind = {"kind": str(engine["kind"])} if engine.get("kind") else {}
    return {
        "name": str(engine.get("name", "?")),
        **kind,
        "url": str(engine.get("url", "")),
        "model": str(engine.get("model", "?")),
        "share": str(share),
    }


def endpoint_links(table: list[Mapping[str, Any]]) -> dict[str, str]:
    """`engine NAME (MODEL, on VM, SHARE)` -> URL for every endpoint of the table's rows."""
    return {
        f"{e.get('kind', 'engine')} {e['name']} ({e['model']}, on {r['vm']}, {e['share']})": e["url"]
        for r in table
        for e in r.get("endpoints") or []
    }


def gpu_text(gpu: Any, config: Mapping[str, Any]) -> str:
    """The VM's cards as the inventory names them (vm_gpu: an id or a list of ids), each with the hostpci
    entry PVE holds for it (hostpci0 for the first, hostpci1 for the second, ...): `rtx3090 (mapping=...)`."""
    ids = [] if gpu in (None, "") else [str(g) for g in gpu] if isinstance(gpu, list | tuple) else [str(gpu)]
    return "; ".join(f"{gid} ({config.get(f'hostpci{i}', '')})" for i, gid in enumerate(ids)) or "-"


def driver_text(cards: list[Mapping[str, Any]]) -> str:
    """What nvidia-smi reports of each card: name, memory and driver; with several cards each one's UUID first
    (the UUID that pods pin and the shares column names)."""
    several = len(cards) > 1
    return (
        "; ".join(
            (f"{str(c.get('uuid', '?'))[:12]}: " if several else "")
            + f"{c.get('name')}, {c.get('memory_total_mib')} MiB, {c.get('driver_version')}"
            for c in cards
        )
        or "-"
    )


def shares_text(cards: list[Mapping[str, Any]]) -> str:
    """Who holds what on each card HAMi registered on a node: `GPU-e1924eea: ns/pod 45 %, ...; 10 % free`."""
    return (
        "; ".join(
            f"{c['uuid'][:12]}: "
            + "".join(f"{p['pod']} {p['percent']} %, " for p in c["pods"])
            + f"{c['free_percent']} % free"
            for c in cards
        )
        or "-"
    )


def markdown(table: list[Mapping[str, str]]) -> str:
    head = "| " + " | ".join(title for _, title in COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in COLUMNS) + "|"
    body = ["| " + " | ".join(r[key].replace("|", "\\|") for key, _ in COLUMNS) + " |" for r in table]
    return "\n".join([head, rule, *body]) + "\n"


def text(table: list[Mapping[str, str]]) -> list[str]:
    """The table as aligned plain-text lines, for the end of a run."""
    grid = [[title for _, title in COLUMNS]] + [[r[key] for key, _ in COLUMNS] for r in table]
    widths = [max(len(row[i]) for row in grid) for i in range(len(COLUMNS))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in grid]


def files(table: list[Mapping[str, str]], links: Mapping[str, str] | None = None) -> dict[str, str]:
    """The stored forms of the table: file name -> content. `links`: where the lab's UIs are reached (name ->
    URL, e.g. stage monitoring's Prometheus and Grafana), listed under the table and on the page."""
    # the endpoints of the rows (the LAN engines and Open WebUI of stage workloads, stage monitoring's UIs) with the
    # UIs' links; a link whose URL an endpoint lists is shown once, as that endpoint
    listed = endpoint_links(table)
    links = {**{k: v for k, v in (links or {}).items() if v not in listed.values()}, **listed}
    extra = "".join(f"- {name}: {url}\n" for name, url in links.items())
    context = next((r["context"] for r in table if r.get("context")), "")
    if context:  # the cluster in the controller's kubeconfig (stage k3s)
        extra += f"- kubectl: context {context} (kubectl --context {context} get nodes)\n"
    return {
        "lab-table.md": "# gpulab lab\n\n"
        + markdown(table)
        + (f"\n## Reached at\n\n{extra}" if extra else ""),
        "lab-table.json": json.dumps(table, indent=2) + "\n",
        "lab-table.html": labpage.page(table, links, COLUMNS),
    }


def write(
    state_dir: str | os.PathLike,
    table: list[Mapping[str, str]],
    dry_run: bool = False,
    links: Mapping[str, str] | None = None,
) -> tuple[bool, list[Path]]:
    """Write lab-table.md, lab-table.json and lab-table.html into the state directory; (changed, paths)."""
    d = Path(state_dir)
    wanted = {d / name: text for name, text in files(table, links).items()}
    changed = any(not f.exists() or f.read_text() != text for f, text in wanted.items())
    if changed and not dry_run:
        d.mkdir(parents=True, exist_ok=True)
        for f, text in wanted.items():
            f.write_text(text)
    return changed, list(wanted)

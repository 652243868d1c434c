"""The checks of a lab of several Proxmox nodes: what ties one node's settings to the other nodes.

- A GPU id is the id of its PCI resource mapping, and PVE keeps one mapping for the whole cluster with one
  entry per node (stage vms writes an entry for every node whose pve_gpus has that id). A VM given the id
  gets that node's card: the same id on two nodes must name the same kind of card (vendor_device), else a
  node is used through a mapping for a card it lacks.
- Stage host reboots the nodes one at a time, each only where ``pve_host_reboot_allowed`` is true. With
  several nodes, a node it may reboot must not hold every k3s server: the reboot would take the k3s API
  away from the whole cluster (one node alone goes down with its VMs whatever runs where).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpulab.labdef.definition import LabDefinition
    from gpulab.labdef.problems import Problems


def _true(value: Any) -> bool:
    """A boolean as an inventory or ``-e name=value`` gives it."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "on", "1")
    return bool(value)


def check_mapping_ids(d: LabDefinition, out: Problems) -> None:
    """The same GPU id on several nodes names one kind of card (its mapping's entries)."""
    first: dict[str, tuple[str, str]] = {}  # gpu id -> (node name, vendor_device)
    for host, node in d.nodes.items():
        for i, gpu in enumerate(node.get("pve_gpus") or []):
            if not isinstance(gpu, dict) or not gpu.get("id") or not gpu.get("vendor_device"):
                continue
            gid, vd = str(gpu["id"]), str(gpu["vendor_device"]).lower()
            if gid not in first:
                first[gid] = (str(node.get("pve_node")), vd)
                continue
            other, other_vd = first[gid]
            if other_vd != vd and other != node.get("pve_node"):
                why = (
                    f"GPU id {gid} is the PCI resource mapping of node {other}'s card {other_vd}; this card "
                    f"is {vd}: a VM given vm_gpu {gid} here would get a card the mapping does not name"
                )
                fix = "give this card an id of its own (e.g. after its model), and use that id in vm_gpu"
                out.add(host, f"pve_gpus[{i}].id", gid, why, fix)


def check_reboots(d: LabDefinition, out: Problems) -> None:
    """With several nodes, a node stage host may reboot does not hold every k3s server."""
    servers = [h for h in d.k3s_servers if h in d.vms]
    if len(d.nodes) < 2 or not servers:
        return
    for host, node in d.nodes.items():
        if not _true(d.node_reboot_allowed.get(host)):
            continue
        name = node.get("pve_node")
        mine = [h for h in servers if d.vms[h].get("vm_node") == name]
        if len(mine) < len(servers):
            continue
        held = "the only k3s server" if len(mine) == 1 else f"all {len(mine)} k3s servers"
        why = (
            f"stage host may reboot node {name}, and its VMs hold {held} ({', '.join(mine)}): the reboot "
            "would take the k3s API away from every node"
        )
        fix = (
            f"set pve_host_reboot_allowed: false for {host} and reboot it yourself when the cluster may stop, "
            "or run a k3s server on another node (vm_node)"
        )
        out.add(host, "pve_host_reboot_allowed", True, why, fix)


def check_cluster(d: LabDefinition, out: Problems) -> None:
    check_mapping_ids(d, out)
    check_reboots(d, out)

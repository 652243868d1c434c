"""The checks of a lab of several Proxmox nodes: what ties one node's settings to the other nodes.

- A GPU id is the id of its PCI resource mapping, and PVE keeps one mapping for the whole cluster with one
  entry per node (stage vms writes an entry for every node whose pve_gpus has that id). A VM given the id
  gets that node's card: the same id on two nodes must name the same kind of card (vendor_device), else a
  node is used through a mapping for a card it lacks.
- Stage host reboots the nodes one at a time, each only where ``pve_host_reboot_allowed`` is true. With
  several nodes, the k3s servers left while a node it may reboot is down must still be a majority of all
  servers (etcd's quorum, n // 2 + 1: :func:`quorum_losses`), else the k3s API stops answering for the whole
  reboot; one server (SQLite) must not be on such a node (one node alone goes down with its VMs whatever
  runs where).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpulab.doctor import nomodeset_setting

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


def etcd_quorum(servers: int) -> int:
    """The members etcd needs to elect a leader and write: a majority of all of them."""
    return servers // 2 + 1


def quorum_losses(
    servers_on: dict[str, list[str]], rebootable: list[str]
) -> list[tuple[str, list[str], int]]:
    """The rebootable nodes whose reboot leaves the k3s API without its datastore, as (node, the servers it
    holds, the servers left while it is down), in ``rebootable``'s order. ``servers_on``: node -> the k3s
    servers its VMs are. One server (SQLite) is lost with the node that holds it; two or more (embedded
    etcd) need a majority left (etcd_quorum)."""
    total = sum(len(s) for s in servers_on.values())
    if total == 0:
        return []
    need = 1 if total == 1 else etcd_quorum(total)
    out = []
    for node in rebootable:
        mine = servers_on.get(node) or []
        if mine and total - len(mine) < need:
            out.append((node, list(mine), total - len(mine)))
    return out


def check_reboots(d: LabDefinition, out: Problems) -> None:
    """With several nodes, the k3s servers left while a node stage host may reboot is down keep the quorum."""
    servers = [h for h in d.k3s_servers if h in d.vms]
    if len(d.nodes) < 2 or not servers:
        return
    host_of = {str(node.get("pve_node")): host for host, node in d.nodes.items()}
    servers_on: dict[str, list[str]] = {}
    for h in servers:
        servers_on.setdefault(str(d.vms[h].get("vm_node")), []).append(h)
    rebootable = [str(n.get("pve_node")) for h, n in d.nodes.items() if _true(d.node_reboot_allowed.get(h))]
    total = len(servers)
    for name, mine, left in quorum_losses(servers_on, rebootable):
        host = host_of[name]
        if total == 1:
            why = (
                f"stage host may reboot node {name}, and its VMs hold the only k3s server ({mine[0]}): the "
                "reboot would take the k3s API away from every node"
            )
            fix = (
                f"set pve_host_reboot_allowed: false for {host} and reboot it yourself when the cluster may "
                "stop, or run a k3s server on another node (vm_node)"
            )
        else:
            why = (
                f"stage host may reboot node {name}, and its VMs hold {len(mine)} of the {total} k3s servers "
                f"({', '.join(mine)}): while it is down {left} of {total} are left, fewer than etcd's quorum "
                f"of {etcd_quorum(total)}, so the k3s API stops answering (etcdserver: request timed out) until "
                "it is back"
            )
            fix = (
                f"set pve_host_reboot_allowed: false for {host} and reboot it yourself when the cluster may "
                f"stop, or move a k3s server to another node (vm_node), so that no node stage host may reboot "
                f"holds more than {total - etcd_quorum(total)} of them"
            )
        out.add(host, "pve_host_reboot_allowed", True, why, fix)


def check_nomodeset(d: LabDefinition, out: Problems) -> None:
    """pve_host_nomodeset is auto, true or false."""
    for host, value in d.node_nomodeset.items():
        if isinstance(nomodeset_setting(value), str):
            why = "stage host reads auto (decide from the node's display adapters), true or false"
            fix = (
                "leave pve_host_nomodeset unset (auto: on only where the passed-through card is the boot display "
                "and no other display adapter could drive a screen), or set true or false"
            )
            out.add(host, "pve_host_nomodeset", value, why, fix)


def check_cluster(d: LabDefinition, out: Problems) -> None:
    check_mapping_ids(d, out)
    check_reboots(d, out)
    check_nomodeset(d, out)

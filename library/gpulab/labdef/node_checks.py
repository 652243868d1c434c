"""The checks of a lab of several Proxmox nodes: what ties one node's settings to the other nodes.

- A GPU id is the id of its PCI resource mapping, and PVE keeps one mapping for the whole cluster with one
  entry per node (stage vms writes an entry for every node whose pve_gpus has that id). A VM given the id
  gets that node's card: the same id on two nodes must name the same kind of card (vendor_device), else a
  node is used through a mapping for a card it lacks.
- Stage host reboots the nodes one at a time, each only where ``pve_host_reboot_allowed`` is true. With
  several nodes, the k3s servers left while a node is down should still be a majority of all servers
  (etcd's quorum, n // 2 + 1: :func:`quorum_losses`), else the k3s API stops answering for the whole reboot;
  one server (SQLite) is lost with its node. Whether that matters is known only when the reboot comes: a
  lab with no cluster yet (its first run) or whose servers there are stopped loses nothing. So preflight
  only names such a node in the plan (:func:`reboot_plan_lines`), and stage host decides at the reboot from
  the node's VMs and whether k3s answers on them (:func:`reboot_gate`, roles/pve_host/tasks/quorum_gate.yml),
  refusing it with :func:`quorum_refusal`'s message while a cluster would lose its quorum.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
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


def reboot_allowed(d: LabDefinition, host: str) -> bool:
    """Whether stage host may reboot node host `host` (pve_host_reboot_allowed as the run sees it)."""
    return _true(d.node_reboot_allowed.get(host))


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


def quorum_refusal(name: str, host: str, mine: list[str], total: int) -> tuple[str, str]:
    """Why node `name` (inventory host `host`) may not reboot while its k3s servers `mine` (of `total`) run a
    cluster, and what to do instead: (why, fix)."""
    if total == 1:
        why = (
            f"stage host may reboot node {name}, and its VMs hold the only k3s server ({mine[0]}): the "
            "reboot would take the k3s API away from every node"
        )
        fix = (
            f"set pve_host_reboot_allowed: false for {host} and reboot it yourself when the cluster may "
            "stop, or run a k3s server on another node (vm_node)"
        )
        return why, fix
    left = total - len(mine)
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
    return why, fix


def servers_by_node(d: LabDefinition) -> dict[str, list[str]]:
    """Each Proxmox node's k3s servers (vm_node), in the inventory's order."""
    servers_on: dict[str, list[str]] = {}
    for h in d.k3s_servers:
        if h in d.vms:
            servers_on.setdefault(str(d.vms[h].get("vm_node")), []).append(h)
    return servers_on


def reboot_plan_lines(d: LabDefinition) -> list[str]:
    """The plan's word on each node stage host may reboot whose reboot would take etcd's quorum (or the only
    server): no longer a preflight refusal, as a lab with no cluster yet loses nothing; stage host decides
    when it would reboot the node, from the cluster as it is then (:func:`reboot_gate`)."""
    servers_on = servers_by_node(d)
    if len(d.nodes) < 2 or not servers_on:
        return []
    rebootable = [str(n.get("pve_node")) for h, n in d.nodes.items() if reboot_allowed(d, h)]
    total = sum(len(s) for s in servers_on.values())
    return [
        f"Reboot of node {name}: it holds {len(mine)} of the {total} k3s servers ({', '.join(mine)}), {left} "
        f"would be left; decided at reboot time: it reboots while no cluster runs there yet or those servers "
        f"are stopped, and is refused while they run k3s"
        for name, mine, left in quorum_losses(servers_on, rebootable)
    ]


def qm_list_status(qm_list: str) -> dict[str, str]:
    """Each VM's status by name in `qm list`'s text (a header, then VMID NAME STATUS MEM(MB) ... per VM)."""
    out = {}
    for line in qm_list.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 3:
            out[fields[1]] = fields[2]
    return out


def reboot_gate(
    name: str,
    host: str,
    servers_on: Mapping[str, Sequence[str]],
    status: Mapping[str, str],
    k3s_up: Iterable[str],
) -> dict[str, Any]:
    """Whether stage host may reboot node `name` (inventory host `host`) now, decided from the cluster as it is
    at the reboot: {reboot (bool), why, fix ('' when it reboots)}.

    `servers_on`: node -> its k3s servers (vm_node); `status`: the node's server VMs' status (``running``,
    ``stopped``, ...; a server missing from it has no VM yet); `k3s_up`: the servers whose k3s API answered.
    A reboot that keeps etcd's quorum (:func:`quorum_losses`) always may; one that would not may when there
    is nothing to lose: no cluster yet (none of the node's servers exists, or none that runs answers as k3s),
    or the node's servers are stopped already. Otherwise it is refused with preflight's message of old
    (:func:`quorum_refusal`). A lab of one node is not asked (it goes down with all its VMs whatever runs where:
    its reboot is the user's call), as preflight never asked it."""
    lost = quorum_losses({k: list(v) for k, v in servers_on.items()}, [name])
    if not lost:
        mine = list(servers_on.get(name) or [])
        if not mine:
            return {"reboot": True, "why": f"node {name} holds no k3s server", "fix": ""}
        return {"reboot": True, "why": "the k3s servers on other nodes keep etcd's quorum", "fix": ""}
    _, mine, _ = lost[0]
    total = sum(len(s) for s in servers_on.values())
    exist = [s for s in mine if s in status]
    running = [s for s in exist if status[s] == "running"]
    members = [s for s in running if s in set(k3s_up)]
    if not exist:
        why = f"no cluster yet: none of its k3s servers ({', '.join(mine)}) has a VM"
    elif not running:
        why = f"its k3s servers ({', '.join(exist)}) are stopped already: the reboot takes nothing from a cluster"
    elif not members:
        why = f"no cluster yet: its k3s servers that run ({', '.join(running)}) do not answer as k3s (port 6443)"
    else:
        why, fix = quorum_refusal(name, host, mine, total)
        return {"reboot": False, "why": f"{why}; k3s runs on {', '.join(members)} now", "fix": fix}
    return {"reboot": True, "why": why, "fix": ""}


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
    check_nomodeset(d, out)

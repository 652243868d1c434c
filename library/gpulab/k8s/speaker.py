"""Which k3s server speaks for the cluster in this run: any server that is up and Ready, not the first one.

k3s' servers are equals once the cluster runs (every server answers the API, embedded etcd or not), so the
stages that talk to the cluster (k3s' cluster check and token, hami, workloads, verify) use one server that
is reachable now and whose node is Ready, and say which. `choose()` is the pure decision: from the servers
the run may use (inventory order, ``--limit`` applied), which of them answered the controller, and one look
at the nodes (`kubectl get nodes -o json` through the first server that answered, or None), it returns the
speaker, the servers that are down and the reason for the pick. The playbooks act on its answer
(playbooks/k3s_speaker.yml); a server that is down is skipped by the plays that log in to it and shown
`down` in the lab table.

A cluster that is not installed yet (no node list: k3s absent, or a dry run on a new lab) has no Ready
server: the first reachable server speaks (the first server starts the cluster). When no server the run may
use answers, nothing speaks and the playbook stops with the servers it tried.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def ready_nodes(nodes: Mapping[str, Any] | None) -> set[str]:
    """The names of the nodes whose Ready condition is True in a `kubectl get nodes -o json` answer."""
    out = set()
    for item in (nodes or {}).get("items") or []:
        conditions = (item.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            out.add((item.get("metadata") or {}).get("name"))
    return out


def ready_versions(nodes: Mapping[str, Any] | None) -> dict[str, str]:
    """Node name -> kubelet version of the nodes whose Ready condition is True in a `kubectl get nodes -o json`
    answer (what an upgrade waits for: the node back and Ready on the new release)."""
    ready = ready_nodes(nodes)
    return {
        name: ((item.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion", "")
        for item in (nodes or {}).get("items") or []
        if (name := (item.get("metadata") or {}).get("name")) in ready
    }


def choose(
    servers: Sequence[str], reachable: Sequence[str], nodes: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The server that speaks for the cluster: {speaker (a name or None), down (the servers that did not
    answer, in `servers` order), ready (the reachable servers whose node is Ready), why (one sentence)}.

    `servers`: the k3s servers the run may use, in inventory order; `reachable`: those that answered the
    controller; `nodes`: the node list read through a reachable server (None: not read, k3s not there)."""
    up = [s for s in servers if s in set(reachable)]
    down = [s for s in servers if s not in set(reachable)]
    ready = sorted(ready_nodes(nodes) & set(up), key=up.index)
    if not up:
        tried = ", ".join(servers) or "none (the run's --limit leaves out every k3s server)"
        return {"speaker": None, "down": down, "ready": [], "why": f"no k3s server answers: tried {tried}"}
    if ready:
        speaker, why = ready[0], "the first k3s server that is up and Ready"
    elif nodes is None:
        speaker, why = up[0], "no cluster to ask yet: the first k3s server that is up"
    else:
        speaker, why = up[0], "no k3s server is Ready: the first that is up"
    if down:
        why += f" ({', '.join(down)} down)"
    return {"speaker": speaker, "down": down, "ready": ready, "why": why}


# k3s' etcd member controller (pkg/etcd/etcd.go, manageLearners and setEtcdStatusCondition, k3s-io/k3s@2614da01)
# runs on the etcd leader and gives every node with the etcd role a condition EtcdIsVoter: True for a voting
# member that answers, False for a learner, an unhealthy member or a node that is not a member.
ETCD_CONDITION = "EtcdIsVoter"


def etcd_voters(nodes: Mapping[str, Any] | None) -> set[str]:
    """The nodes whose EtcdIsVoter condition is True (a voting etcd member the leader reached)."""
    out = set()
    for item in (nodes or {}).get("items") or []:
        conditions = (item.get("status") or {}).get("conditions") or []
        if any(c.get("type") == ETCD_CONDITION and c.get("status") == "True" for c in conditions):
            out.add((item.get("metadata") or {}).get("name"))
    return out


def reboot_wait(
    node: str, rebooted: bool, servers: Sequence[str], vm_nodes: Mapping[str, str], down: Sequence[str] = ()
) -> dict[str, Any]:
    """Whether stage host waits for etcd after rebooting Proxmox node `node`, before the next node reboots:
    {wait (bool), witnesses (the servers on other nodes, not down, to ask through, in `servers` order), why}.

    `servers`: every k3s server of the inventory; `vm_nodes`: each server's Proxmox node (vm_node); `down`:
    the servers this run found down. Only embedded etcd has a membership to wait for: one server keeps
    SQLite, and gpulab runs etcd from three servers on (playbooks/vars/k3s.yml, gpulab_k3s_etcd). Whether a
    cluster exists yet is read at run time through a witness (its k3s binary); this decides only from the
    inventory, so it cannot fail on a lab without k3s servers."""
    servers = list(servers)
    if not rebooted:
        return {"wait": False, "witnesses": [], "why": f"{node} did not reboot in this run"}
    if len(servers) < 3:
        return {
            "wait": False,
            "witnesses": [],
            "why": f"{len(servers)} k3s server(s): no embedded etcd (one server keeps SQLite), nothing to wait for",
        }
    witnesses = [s for s in servers if vm_nodes.get(s) != node and s not in set(down)]
    if not witnesses:
        return {
            "wait": False,
            "witnesses": [],
            "why": f"no k3s server outside {node} that is not down: none to ask for etcd's state",
        }
    return {"wait": True, "witnesses": witnesses, "why": f"{len(servers)} k3s servers on embedded etcd"}


def etcd_settled(servers: Sequence[str], nodes: Mapping[str, Any] | None) -> dict[str, Any]:
    """Whether etcd has its full membership and a leader again: {done (bool), waiting (the servers not yet
    back), why}. `nodes` is `kubectl get nodes -o json` read through a witness, None when the API did not
    answer: a read of the API goes through etcd, which answers only with a leader (no leader: "etcdserver:
    request timed out"). Each server must be Ready and a voting member (EtcdIsVoter True)."""
    if nodes is None:
        return {
            "done": False,
            "waiting": list(servers),
            "why": "the API does not answer: etcd has no leader yet",
        }
    ready, voters = ready_nodes(nodes), etcd_voters(nodes)
    waiting, reasons = [], []
    for s in servers:
        missing = [
            w for w, ok in (("not Ready", s in ready), ("not a voting etcd member", s in voters)) if not ok
        ]
        if missing:
            waiting.append(s)
            reasons.append(f"{s} {' and '.join(missing)}")
    if waiting:
        return {"done": False, "waiting": waiting, "why": "; ".join(reasons)}
    return {
        "done": True,
        "waiting": [],
        "why": f"etcd has a leader and all {len(servers)} servers as voting members",
    }


def servers_not_running(
    node: str, servers: Sequence[str], vm_nodes: Mapping[str, str], qm_list: str
) -> list[str]:
    """The k3s servers of Proxmox node `node` (vm_node) whose VM is not running in `qm list`'s text (a header,
    then VMID NAME STATUS ... per VM): after the node's reboot such a server cannot rejoin etcd until its VM is
    started, so waiting for it would only time out."""
    running = set()
    for line in qm_list.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "running":
            running.add(fields[1])
    return [s for s in servers if vm_nodes.get(s) == node and s not in running]

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

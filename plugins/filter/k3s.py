"""Filters of the k3s stages.

`servers | gpulab_k3s_speaker(reachable, nodes_json)` is gpulab.k8s.speaker.choose: the k3s server that
speaks for the cluster in this run (up and Ready, not the first server), the servers that are down and why.
`nodes_json` is the text of `kubectl get nodes -o json` read through a server that answered, or empty when
it was not read (k3s absent, nothing answered). `nodes_json | gpulab_k3s_ready_nodes` is the sorted list of
the nodes whose Ready condition is True ([] for an empty or non-JSON text).
`nodes_json | gpulab_k3s_ready_versions` is gpulab.k8s.speaker.ready_versions: node name -> kubelet version of
those nodes ({} for an empty or non-JSON text).
`node | gpulab_k3s_reboot_wait(rebooted, servers, vm_nodes, down)` is gpulab.k8s.speaker.reboot_wait (whether
stage host waits for etcd after a node's reboot, and through which servers), and
`nodes_json | gpulab_k3s_etcd_settled(servers)` is gpulab.k8s.speaker.etcd_settled (an empty or non-JSON text:
the API did not answer). `qm_list_text | gpulab_k3s_servers_not_running(node, servers, vm_nodes)` is
gpulab.k8s.speaker.servers_not_running (the node's servers whose VM is not running).
`nodes_json | gpulab_k3s_upgrade_skew(k3s_version)` is gpulab.k8s.skew.cluster_problems: for each node whose kubelet
cannot go to k3s_version in one upgrade (a skipped minor, a downgrade), why and the releases to go through ([] when
every node may, or for an empty or non-JSON text: no cluster yet).
`folder | gpulab_k3s_airgap_problem`, `cluster_init | gpulab_k3s_server_join_problem(join_url, token, dry_run)` and
`server_url | gpulab_k3s_agent_join_problem(token, dry_run)` are gpulab.k8s.install_inputs' rules, the ones preflight
applies first: "" when the inputs are right, else why and the fix.
`look | gpulab_k3s_pull_problems` is gpulab.k8s.image_pulls.from_look: the containers of a wait's look (its line
`{"pulls": <kubectl get pods -o json>}`) that cannot pull their image, as problems (host, field, value, cause, fix);
`problems | gpulab_k3s_pull_problems_text` makes them one message, and `look | gpulab_k3s_look_rest` is the look
without that line (the stage's own document). `rollout | gpulab_k3s_not_ready_text(what, timeout)` says why a wait
for a rollout (`what`, e.g. "Engine default/vllm") ended unready: the images its pods cannot pull, else the
timeout and kubectl's last line.
Stage host's quorum gate (roles/pve_host/tasks/quorum_gate.yml, gpulab.labdef.node_checks):
`node | gpulab_k3s_quorum_at_stake(servers_at)` is the node's k3s servers when its reboot would leave fewer
than etcd's quorum ([] otherwise; `servers_at`: each server's vm_node), `qm_list_text |
gpulab_k3s_servers_running(servers, vm_names)` the servers whose VM `qm list` shows running, and
`node | gpulab_k3s_reboot_gate(host, servers_at, qm_list_text, vm_names, k3s_up)` is reboot_gate: whether the
node may reboot now, from its server VMs' status and the servers whose k3s API answered.
"""

from __future__ import annotations

import json

from ansible_collections.gpulab.homelab.plugins.plugin_utils.engine import MissingEngine

try:
    from gpulab.k8s import image_pulls, install_inputs
    from gpulab.k8s.skew import cluster_problems
    from gpulab.k8s.speaker import (
        choose,
        etcd_settled,
        ready_nodes,
        ready_versions,
        reboot_wait,
        servers_not_running,
    )
    from gpulab.labdef.node_checks import qm_list_status, quorum_losses, reboot_gate
except ImportError as err:  # the engine runs here, on the controller: requirements.txt
    cluster_problems = choose = etcd_settled = ready_nodes = ready_versions = reboot_wait = (
        servers_not_running
    ) = MissingEngine(err)
    install_inputs = image_pulls = MissingEngine(err)
    qm_list_status = quorum_losses = reboot_gate = MissingEngine(err)


def gpulab_k3s_speaker(servers, reachable, nodes_json=""):
    try:
        nodes = json.loads(nodes_json) if nodes_json else None
    except ValueError:  # a server that answered with an error, not a node list: no cluster to ask
        nodes = None
    return choose(list(servers or []), list(reachable or []), nodes)


def gpulab_k3s_upgrade_skew(nodes_json, k3s_version):
    try:
        nodes = json.loads(nodes_json) if nodes_json else None
    except ValueError:
        nodes = None
    return cluster_problems(nodes, str(k3s_version or ""))


def gpulab_k3s_ready_nodes(nodes_json):
    try:
        nodes = json.loads(nodes_json) if nodes_json else None
    except ValueError:
        nodes = None
    return sorted(ready_nodes(nodes))


def gpulab_k3s_ready_versions(nodes_json):
    return ready_versions(_nodes(nodes_json))


def _nodes(nodes_json):
    try:
        return json.loads(nodes_json) if nodes_json else None
    except ValueError:
        return None


def gpulab_k3s_reboot_wait(node, rebooted, servers, vm_nodes, down=()):
    return reboot_wait(str(node), bool(rebooted), list(servers or []), dict(vm_nodes or {}), list(down or []))


def gpulab_k3s_etcd_settled(nodes_json, servers):
    return etcd_settled(list(servers or []), _nodes(nodes_json))


def gpulab_k3s_servers_not_running(qm_list, node, servers, vm_nodes):
    return servers_not_running(str(node), list(servers or []), dict(vm_nodes or {}), str(qm_list or ""))


def gpulab_k3s_airgap_problem(folder):
    return install_inputs.message(install_inputs.airgap_folder_problem(str(folder or "")))


def gpulab_k3s_server_join_problem(cluster_init, join_url, token, dry_run=False):
    problem = install_inputs.server_join_problem(bool(cluster_init), join_url, token, bool(dry_run))
    return install_inputs.message(problem)


def gpulab_k3s_agent_join_problem(server_url, token, dry_run=False):
    return install_inputs.message(install_inputs.agent_join_problem(server_url, token, bool(dry_run)))


def gpulab_k3s_pull_problems(look, namespaces=None):
    return image_pulls.from_look(str(look or ""), None if namespaces is None else list(namespaces))


def gpulab_k3s_pull_problems_text(problems):
    return image_pulls.problems_text(list(problems or []))


def gpulab_k3s_not_ready_text(rollout, what, timeout):
    pulls = image_pulls.from_look(str((rollout or {}).get("stdout") or ""), None)
    if pulls:
        return f"{what} cannot start: {image_pulls.problems_text(pulls)}"
    last = (str((rollout or {}).get("stderr") or "").strip().splitlines() or [""])[-1]
    return f"{what} is not Ready after {timeout} s (kubectl: {last})."


def gpulab_k3s_look_rest(look):
    return image_pulls.rest_of_look(str(look or ""))


def _servers_on(servers_at):
    out = {}
    for server, node in dict(servers_at or {}).items():
        out.setdefault(str(node), []).append(str(server))
    return out


def _status(qm_list, servers, vm_names):
    """Each server's VM status in `qm list`'s text, by its VM name (vm_names; the server's own name when
    unset); a server whose VM is not listed has none."""
    by_name = qm_list_status(str(qm_list or ""))
    names = dict(vm_names or {})
    return {s: by_name[names.get(s) or s] for s in servers if (names.get(s) or s) in by_name}


def gpulab_k3s_quorum_at_stake(node, servers_at):
    lost = quorum_losses(_servers_on(servers_at), [str(node)])
    return list(lost[0][1]) if lost else []


def gpulab_k3s_servers_running(qm_list, servers, vm_names=None):
    status = _status(qm_list, list(servers or []), vm_names)
    return [s for s in servers or [] if status.get(s) == "running"]


def gpulab_k3s_reboot_gate(node, host, servers_at, qm_list, vm_names=None, k3s_up=()):
    servers_on = _servers_on(servers_at)
    status = _status(qm_list, servers_on.get(str(node)) or [], vm_names)
    return reboot_gate(str(node), str(host), servers_on, status, list(k3s_up or []))


class FilterModule:
    def filters(self):
        return {
            "k3s_speaker": gpulab_k3s_speaker,
            "k3s_ready_nodes": gpulab_k3s_ready_nodes,
            "k3s_ready_versions": gpulab_k3s_ready_versions,
            "k3s_reboot_wait": gpulab_k3s_reboot_wait,
            "k3s_etcd_settled": gpulab_k3s_etcd_settled,
            "k3s_servers_not_running": gpulab_k3s_servers_not_running,
            "k3s_upgrade_skew": gpulab_k3s_upgrade_skew,
            "k3s_airgap_problem": gpulab_k3s_airgap_problem,
            "k3s_server_join_problem": gpulab_k3s_server_join_problem,
            "k3s_agent_join_problem": gpulab_k3s_agent_join_problem,
            "k3s_pull_problems": gpulab_k3s_pull_problems,
            "k3s_pull_problems_text": gpulab_k3s_pull_problems_text,
            "k3s_look_rest": gpulab_k3s_look_rest,
            "k3s_not_ready_text": gpulab_k3s_not_ready_text,
            "k3s_quorum_at_stake": gpulab_k3s_quorum_at_stake,
            "k3s_servers_running": gpulab_k3s_servers_running,
            "k3s_reboot_gate": gpulab_k3s_reboot_gate,
        }

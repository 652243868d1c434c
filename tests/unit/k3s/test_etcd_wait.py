"""Stage host's wait for etcd after a Proxmox node's reboot (gpulab.k8s.speaker.reboot_wait, etcd_settled):
whether to wait at all, decided from the inventory alone (the demo and any lab without a cluster never
wait), and when the wait is over (every server Ready and a voting etcd member, read through the API)."""

import json

import plugin_files
import pytest

from gpulab.k8s.speaker import etcd_settled, reboot_wait

SERVERS = ["server-1", "server-2", "server-3"]
# demo-cluster's layout: server-1 and server-2 on pve, server-3 on pve2
VM_NODES = {"server-1": "pve", "server-2": "pve", "server-3": "pve2"}


def node(name, ready="True", voter="True"):
    conditions = [{"type": "Ready", "status": ready}]
    if voter is not None:
        conditions.append({"type": "EtcdIsVoter", "status": voter})
    return {"metadata": {"name": name}, "status": {"conditions": conditions}}


@pytest.mark.parametrize(
    ("node_name", "rebooted", "servers", "down", "wait", "witnesses"),
    [
        # the demo: one node, no k3s server (or one, on SQLite): nothing to wait for, rebooted or not
        ("pve", True, [], [], False, []),
        ("pve", True, ["server-1"], [], False, []),
        # two servers: gpulab runs etcd only from three on
        ("pve", True, ["server-1", "server-2"], [], False, []),
        # the node did not reboot in this run
        ("pve2", False, SERVERS, [], False, []),
        # pve2 rebooted: ask through the servers on pve
        ("pve2", True, SERVERS, [], True, ["server-1", "server-2"]),
        # pve rebooted: server-3 on pve2 is the one to ask
        ("pve", True, SERVERS, [], True, ["server-3"]),
        # the only server elsewhere is down: none to ask
        ("pve", True, SERVERS, ["server-3"], False, []),
    ],
)
def test_reboot_wait_decides_from_the_inventory(node_name, rebooted, servers, down, wait, witnesses):
    got = reboot_wait(node_name, rebooted, servers, VM_NODES, down)
    assert (got["wait"], got["witnesses"]) == (wait, witnesses)
    assert got["why"]


def test_reboot_wait_on_an_inventory_without_vm_node():
    # servers whose vm_node is not known are not on the rebooted node: they may be asked
    got = reboot_wait("pve", True, SERVERS, {})
    assert got["wait"] and got["witnesses"] == SERVERS


def test_settled_needs_every_server_ready_and_a_voter():
    assert etcd_settled(SERVERS, {"items": [node(s) for s in SERVERS]})["done"]
    got = etcd_settled(SERVERS, {"items": [node("server-1"), node("server-2", ready="Unknown", voter="False"),
                                           node("server-3", voter="False")]})  # fmt: skip
    assert not got["done"] and got["waiting"] == ["server-2", "server-3"]
    assert got["why"] == "server-2 not Ready and not a voting etcd member; server-3 not a voting etcd member"
    # a server missing from the node list, or a node without the condition (no leader has marked it yet)
    got = etcd_settled(SERVERS, {"items": [node("server-1"), node("server-2", voter=None)]})
    assert got["waiting"] == ["server-2", "server-3"]


def test_settled_without_an_answer_is_no_leader():
    got = etcd_settled(SERVERS, None)
    assert not got["done"] and got["waiting"] == SERVERS and "no leader" in got["why"]


def test_the_filters_read_kubectls_text():
    filters = plugin_files.filters("k3s")
    text = json.dumps({"items": [node(s) for s in SERVERS]})
    assert filters["k3s_etcd_settled"](text, SERVERS)["done"]
    # kubectl's error text (etcdserver: request timed out) is no node list: no leader
    assert not filters["k3s_etcd_settled"]("Error from server: etcdserver: request timed out", SERVERS)[
        "done"
    ]
    assert filters["k3s_reboot_wait"]("pve", True, SERVERS, VM_NODES, [])["witnesses"] == ["server-3"]


def test_servers_not_running_reads_qm_list():
    from gpulab.k8s.speaker import servers_not_running

    qm = (
        "      VMID NAME                 STATUS     MEM(MB)    BOOTDISK(GB) PID\n"
        "       101 server-1             running    4096              32.00 1234\n"
        "       102 server-2             stopped    4096              32.00 0\n"
        "       103 agent-1              stopped    4096              32.00 0\n"
    )
    assert servers_not_running("pve", SERVERS, VM_NODES, qm) == ["server-2"]
    # server-3 is on pve2: not this node's
    assert servers_not_running("pve2", SERVERS, VM_NODES, qm) == ["server-3"]
    assert servers_not_running("pve2", SERVERS, VM_NODES, qm.replace("server-1 ", "server-3 ")) == []


def test_the_quorum_gate_filters_read_qm_list_by_vm_name():
    """Stage host's quorum gate (role pve_host, tasks/quorum_gate.yml): the servers at stake, those whose VM
    runs (by its VM name, `qm list`'s NAME), and the decision."""
    filters = plugin_files.filters("k3s")
    assert filters["k3s_quorum_at_stake"]("pve", VM_NODES) == ["server-1", "server-2"]
    assert filters["k3s_quorum_at_stake"]("pve2", VM_NODES) == []
    qm = (
        "      VMID NAME                 STATUS     MEM(MB)    BOOTDISK(GB) PID\n"
        "       100 k3s-a                running    4096              40.00 1234\n"
        "       101 server-2             stopped    4096              40.00 0\n"
    )
    names = {"server-1": "k3s-a", "server-2": ""}  # server-2's VM name is unset: its own name
    mine = ["server-1", "server-2"]
    assert filters["k3s_servers_running"](qm, mine, names) == ["server-1"]
    gate = filters["k3s_reboot_gate"]("pve", "pve", VM_NODES, qm, names, ["server-1"])
    assert not gate["reboot"] and "k3s runs on server-1 now" in gate["why"]
    gate = filters["k3s_reboot_gate"]("pve", "pve", VM_NODES, qm, names, [])
    assert gate["reboot"] and gate["why"].startswith("no cluster yet: its k3s servers that run (server-1)")
    gate = filters["k3s_reboot_gate"]("pve", "pve", VM_NODES, "", names, [])
    assert gate["reboot"] and gate["why"].startswith("no cluster yet: none of its k3s servers")

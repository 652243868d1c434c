"""A lab of two Proxmox nodes: each node's own memory budget, storages and GPUs, one PCI resource mapping
id per kind of card, and the reboot of a node whose k3s servers are more than etcd's quorum can lose decided
when it comes (no cluster yet, or its servers stopped: it reboots; a running cluster: refused)."""

from __future__ import annotations

import copy

import pytest
from builders import card, gpu_vm, second_node

# pve2 of labsim fixture cluster with its RTX 4090, and a GPU VM of its own that may start at boot (pve2's
# screen is the CPU's graphics)
PVE2 = second_node(card("rtx4090", "0000:01:00", "10de:2684", 9))
VM_GPU2 = gpu_vm(
    103, "rtx4090", node="pve2", storage="local-lvm", memory_mib=24576, onboot=True, address="192.168.100.56"
)


@pytest.fixture
def two(inv):
    """The reference lab plus node pve2 (RTX 4090, the CPU's graphics as its screen) and vm-gpu2 on it."""
    inv.add_node("pve2", copy.deepcopy(PVE2))
    inv.add_vm("vm-gpu2", VM_GPU2)
    return inv


def problems(inv) -> list[tuple[str, str, object]]:
    return [(p.host, p.field, p.value) for p in inv.check()[1]]


def test_two_nodes_with_their_own_cards_are_a_valid_lab(two):
    definition, found = two.check()
    assert found == []
    from gpulab import labdef, vmspec

    plan = labdef.plan_text(definition)
    assert "Node pve (pve): 31744 MiB RAM" in plan and "Node pve2 (pve2): 63488 MiB RAM" in plan
    vms = vmspec.resolve(definition)
    assert (vms["vm-gpu2"]["node"], vms["vm-gpu2"]["node_host"]) == ("pve2", "pve2")
    assert vms["vm-gpu2"]["spec"]["hostpci"] == [{"mapping": "rtx4090", "host": "0000:01:00", "pcie": True}]
    assert vms["vm-gpu"]["spec"]["hostpci"][0]["mapping"] == "rtx3090"


def test_pinned_memory_is_budgeted_per_node(two):
    # 24 GiB pinned on pve (vm-1, vm-2, vm-gpu) of 31 GiB; vm-gpu2's count on pve2 only
    assert problems(two) == []
    two.hosts["vm-gpu2"]["vm_memory_mib"] = 57344  # with the 4 GiB host reserve: fits pve2, not pve
    assert problems(two) == []
    two.hosts["vm-gpu2"]["vm_memory_mib"] = 61440
    found = two.check()[1]
    assert [(p.host, p.field, p.value) for p in found] == [("pve2", "pve_memory_mib", 63488)]
    assert "pinned memory 65536 MiB (vm-gpu2 61440, host reserve 4096)" in found[0].why
    # and pve's own VMs against pve's memory only
    two.hosts["vm-gpu2"]["vm_memory_mib"] = 24576
    two.hosts["vm-gpu"]["vm_memory_mib"] = 24576
    assert problems(two) == [("pve", "pve_memory_mib", 31744)]


def test_a_vm_gets_only_a_gpu_and_a_storage_of_its_own_node(two):
    two.hosts["vm-gpu2"]["vm_gpu"] = "rtx3090"
    two.hosts["vm-gpu2"]["vm_onboot"] = False
    found = two.check()[1]
    assert [(p.host, p.field, p.value) for p in found] == [("vm-gpu2", "vm_gpu", "rtx3090")]
    assert found[0].why == "node pve2 has no GPU with that id"
    assert found[0].fix == "use an id from its pve_gpus (rtx4090)"
    two.hosts["vm-gpu2"]["vm_gpu"] = "rtx4090"
    two.hosts["vm-gpu2"]["vm_storage"] = "local-zfs"  # pve's
    found = two.check()[1]
    assert [(p.host, p.field, p.value, p.why) for p in found] == [
        ("vm-gpu2", "vm_storage", "local-zfs", "node pve2 has no such storage")
    ]


def test_one_gpu_id_on_two_nodes_names_one_kind_of_card(two):
    # two RTX 3090s, one on each node: one mapping with an entry per node, and each card to its own VM
    two.hosts["pve2"]["pve_gpus"] = [
        {**PVE2["pve_gpus"][0], "id": "rtx3090", "vendor_device": "10de:2204", "pci": "0000:01:00"}
    ]
    two.hosts["vm-gpu2"]["vm_gpu"] = "rtx3090"
    assert problems(two) == []
    # the 4090 under the 3090's id: the mapping rtx3090 would be used on pve2, which has no RTX 3090
    two.hosts["pve2"]["pve_gpus"][0]["vendor_device"] = "10de:2684"
    found = two.check()[1]
    assert [(p.host, p.field, p.value) for p in found] == [("pve2", "pve_gpus[0].id", "rtx3090")]
    assert "node pve's card 10de:2204; this card is 10de:2684" in found[0].why
    assert found[0].fix.startswith("give this card an id of its own")


def test_a_node_whose_reboot_takes_the_quorum_is_planned_not_refused(two):
    """Preflight no longer refuses it (a lab with no cluster yet loses nothing): the plan says stage host
    decides at the reboot (node_checks.reboot_gate)."""
    from gpulab import labdef

    # vm-1, the only server, is on pve
    two.hosts["pve2"]["pve_host_reboot_allowed"] = True
    two.hosts["pve"]["pve_host_reboot_allowed"] = True
    definition, found = two.check()
    assert found == []
    [line] = [x for x in labdef.plan_text(definition).splitlines() if x.startswith("Reboot of node")]
    assert line.startswith("Reboot of node pve: it holds 1 of the 1 k3s servers (vm-1), 0 would be left;")
    assert "decided at reboot time" in line
    # three servers, two of them on pve, as `-e pve_host_reboot_allowed=true` gives it
    two.hosts["pve"]["pve_host_reboot_allowed"] = "true"
    two.groups["k3s_agent"].remove("vm-gpu2")
    two.groups["k3s_server"] += ["vm-gpu2", "vm-2"]
    two.groups["k3s_agent"].remove("vm-2")
    definition, found = two.check()
    assert found == []
    plan = labdef.plan_text(definition)
    assert "Reboot of node pve: it holds 2 of the 3 k3s servers (vm-1, vm-2), 1 would be left" in plan
    assert "Reboot of node pve2" not in plan  # pve2's reboot leaves two of three
    # pve not rebooted by stage host: nothing to decide
    two.hosts["pve"]["pve_host_reboot_allowed"] = False
    assert "Reboot of node" not in labdef.plan_text(two.check()[0])


SERVERS_ON = {"pve": ["server-1", "server-2"], "pve2": ["server-3"]}


@pytest.mark.parametrize(
    ("node", "servers_on", "status", "k3s_up", "reboot", "why"),
    [
        # a fresh lab: stage host runs before stage vms, so no server has a VM yet
        ("pve", SERVERS_ON, {}, [], True, "no cluster yet: none of its k3s servers (server-1, server-2) has a VM"),
        # VMs made, stopped (a run that failed before k3s, or the user shut them down)
        ("pve", SERVERS_ON, {"server-1": "stopped", "server-2": "stopped"}, [], True,
         "its k3s servers (server-1, server-2) are stopped already: the reboot takes nothing from a cluster"),
        ("pve", SERVERS_ON, {"server-1": "stopped"}, [], True, "are stopped already"),
        # running, but k3s not installed yet (nothing answers on 6443)
        ("pve", SERVERS_ON, {"server-1": "running", "server-2": "running"}, [], True,
         "no cluster yet: its k3s servers that run (server-1, server-2) do not answer as k3s (port 6443)"),
        # a running cluster: refused, even with one of the two servers stopped (the other is a member)
        ("pve", SERVERS_ON, {"server-1": "running", "server-2": "running"}, ["server-1", "server-2", "server-3"],
         False, "fewer than etcd's quorum of 2"),
        ("pve", SERVERS_ON, {"server-1": "stopped", "server-2": "running"}, ["server-2", "server-3"], False,
         "k3s runs on server-2 now"),
        # pve2's reboot keeps two of three: whatever runs
        ("pve2", SERVERS_ON, {"server-3": "running"}, ["server-3"], True, "keep etcd's quorum"),
        ("pve3", SERVERS_ON, {}, [], True, "node pve3 holds no k3s server"),
        # one server (SQLite) runs: refused with the message of the only server
        ("pve", {"pve": ["s1"]}, {"s1": "running"}, ["s1"], False, "its VMs hold the only k3s server (s1)"),
    ],
)  # fmt: skip
def test_reboot_gate_decides_from_the_cluster_as_it_is(node, servers_on, status, k3s_up, reboot, why):
    from gpulab.labdef.node_checks import reboot_gate

    got = reboot_gate(node, node, servers_on, status, k3s_up)
    assert got["reboot"] is reboot and why in got["why"]
    assert bool(got["fix"]) is not reboot


def test_a_refused_reboot_says_what_preflight_said_before():
    """The refusal keeps preflight's message of old: the node, its servers, the quorum and the fix."""
    from gpulab.labdef.node_checks import reboot_gate

    got = reboot_gate("pve", "pve", SERVERS_ON, {"server-1": "running", "server-2": "running"}, ["server-1"])
    assert got["why"].startswith(
        "stage host may reboot node pve, and its VMs hold 2 of the 3 k3s servers (server-1, server-2): while "
        "it is down 1 of 3 are left, fewer than etcd's quorum of 2, so the k3s API stops answering "
        "(etcdserver: request timed out) until it is back"
    )
    assert got["fix"] == (
        "set pve_host_reboot_allowed: false for pve and reboot it yourself when the cluster may stop, or move "
        "a k3s server to another node (vm_node), so that no node stage host may reboot holds more than 1 of them"
    )


def test_qm_list_gives_each_vms_status_by_name():
    from gpulab.labdef.node_checks import qm_list_status

    text = (
        "      VMID NAME                 STATUS     MEM(MB)    BOOTDISK(GB) PID\n"
        "       100 server-1             running    4096              40.00 1234\n"
        "       101 server-2             stopped    4096              40.00 0\n"
    )
    assert qm_list_status(text) == {"server-1": "running", "server-2": "stopped"}
    assert qm_list_status("") == {}


@pytest.mark.parametrize(
    ("servers_on", "rebootable", "lost"),
    [
        # one server (SQLite): lost with its node, kept when another node reboots
        ({"pve": ["s1"]}, ["pve", "pve2"], [("pve", ["s1"], 0)]),
        ({"pve": ["s1"]}, ["pve2"], []),
        # three servers: a node may hold one of them (two left of three), not two
        ({"pve": ["s1", "s2"], "pve2": ["s3"]}, ["pve", "pve2"], [("pve", ["s1", "s2"], 1)]),
        ({"pve": ["s1"], "pve2": ["s2"], "pve3": ["s3"]}, ["pve", "pve2", "pve3"], []),
        # two servers on etcd: a majority of two is both, so neither node may reboot
        ({"pve": ["s1"], "pve2": ["s2"]}, ["pve2"], [("pve2", ["s2"], 1)]),
        # five servers: quorum three, a node may hold two
        ({"a": ["1", "2"], "b": ["3", "4"], "c": ["5"]}, ["a", "b", "c"], []),
        ({"a": ["1", "2", "3"], "b": ["4", "5"]}, ["a", "b"], [("a", ["1", "2", "3"], 2)]),
        ({}, ["pve"], []),
    ],
)
def test_quorum_losses_leave_fewer_servers_than_etcds_majority(servers_on, rebootable, lost):
    from gpulab.labdef.node_checks import etcd_quorum, quorum_losses

    assert [etcd_quorum(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]
    assert quorum_losses(servers_on, rebootable) == lost


def test_one_node_may_reboot_with_its_only_server(inv):
    """One node goes down with every VM whatever runs where: its reboot is the user's call, as before."""
    inv.hosts["pve"]["pve_host_reboot_allowed"] = True
    assert problems(inv) == []
    from gpulab import labdef

    assert "Reboot of node" not in labdef.plan_text(inv.check()[0])


def test_demo_cluster_lets_stage_host_reboot_both_nodes():
    """inventory/demo-cluster: pve holds two of its three servers and may reboot (a new user's lab has no
    cluster yet); the plan says stage host decides at the reboot, and preflight finds nothing wrong."""
    from pathlib import Path

    from gpulab import inventory, labdef

    root = Path(__file__).resolve().parents[3]
    groups, hostvar, names = inventory.load(root / "inventory" / "demo-cluster")
    assert hostvar("pve", "pve_host_reboot_allowed") is True
    assert hostvar("pve2", "pve_host_reboot_allowed") is True
    definition, found = labdef.check(groups, hostvar, names)
    assert [p for p in found if p.field == "pve_host_reboot_allowed"] == []
    reboots = [x for x in labdef.plan_text(definition).splitlines() if x.startswith("Reboot of node")]
    assert reboots == [
        "Reboot of node pve: it holds 2 of the 3 k3s servers (server-1, server-2), 1 would be left; decided at "
        "reboot time: it reboots while no cluster runs there yet or those servers are stopped, and is refused "
        "while they run k3s"
    ]

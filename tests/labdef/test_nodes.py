"""A lab of two Proxmox nodes: each node's own memory budget, storages and GPUs, one PCI resource mapping
id per kind of card, and no reboot of a node whose k3s servers are more than etcd's quorum can lose."""

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


def test_a_node_stage_host_may_reboot_leaves_a_quorum_of_k3s_servers(two):
    # vm-1, the only server, is on pve
    two.hosts["pve2"]["pve_host_reboot_allowed"] = True
    assert problems(two) == []
    two.hosts["pve"]["pve_host_reboot_allowed"] = True
    found = two.check()[1]
    assert [(p.host, p.field, p.value) for p in found] == [("pve", "pve_host_reboot_allowed", True)]
    assert "its VMs hold the only k3s server (vm-1)" in found[0].why
    assert "set pve_host_reboot_allowed: false for pve" in found[0].fix
    # as `-e pve_host_reboot_allowed=true` gives it
    two.hosts["pve"]["pve_host_reboot_allowed"] = "true"
    assert problems(two) == [("pve", "pve_host_reboot_allowed", True)]
    # three servers, two of them on pve: rebooting pve leaves one of three, short of etcd's quorum of two
    two.groups["k3s_agent"].remove("vm-gpu2")
    two.groups["k3s_server"] += ["vm-gpu2", "vm-2"]
    two.groups["k3s_agent"].remove("vm-2")
    found = two.check()[1]
    assert [(p.host, p.field, p.value) for p in found] == [("pve", "pve_host_reboot_allowed", True)]
    assert (
        "its VMs hold 2 of the 3 k3s servers (vm-1, vm-2): while it is down 1 of 3 are left" in found[0].why
    )
    assert "fewer than etcd's quorum of 2" in found[0].why
    assert found[0].fix.startswith("set pve_host_reboot_allowed: false for pve")
    assert "or move a k3s server to another node (vm_node)" in found[0].fix
    # pve no longer rebooted by stage host: pve2's reboot leaves two of three
    two.hosts["pve"]["pve_host_reboot_allowed"] = False
    assert problems(two) == []


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


def test_demo_cluster_keeps_the_quorum_and_is_refused_with_pve_rebootable():
    """inventory/demo-cluster: pve holds two of its three servers, so stage host may reboot pve2 only."""
    from pathlib import Path

    from gpulab import inventory, labdef

    root = Path(__file__).resolve().parents[2]
    groups, hostvar, names = inventory.load(root / "inventory" / "demo-cluster")

    def reboots(found):
        return [(p.host, p.why, p.fix) for p in found if p.field == "pve_host_reboot_allowed"]

    assert hostvar("pve", "pve_host_reboot_allowed") is False
    assert hostvar("pve2", "pve_host_reboot_allowed") is True
    assert reboots(labdef.check(groups, hostvar, names)[1]) == []
    # as `-e pve_host_reboot_allowed=true` would make it
    forced = labdef.check(
        groups, lambda h, n: True if n == "pve_host_reboot_allowed" else hostvar(h, n), names
    )
    [(host, why, fix)] = reboots(forced[1])
    assert host == "pve" and "its VMs hold 2 of the 3 k3s servers (server-1, server-2)" in why
    assert "set pve_host_reboot_allowed: false for pve" in fix and "move a k3s server" in fix

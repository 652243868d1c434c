"""The network lab on fixture two-gpus: a VM host started with both cards sees both (the GPU file the lab's
nvidia-smi stand-in reads), each with its own UUID; a VM with one card sees only that one.

Needs root (network namespaces, veth links, mounts); run under the lab lock like the other network-lab tests.
"""

import json
import os

import pytest
from test_netlab_hosts import ens18, ssh, vm_config

from labsim import network_lab
from labsim.fixture import load_fixture

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: network namespaces, veth links and mounts"),
]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    state = tmp_path_factory.mktemp("network_lab_two_gpus")
    fixture = load_fixture("two-gpus")
    fixture["network"] = {**fixture.get("network", {}), "vm_init": "simple"}
    facts = network_lab.up(state, fixture)
    yield state, fixture, facts
    network_lab.down(state)


def guest_gpus(lab, vmid, name, mac, hostpci):
    state, fixture, facts = lab
    hooks = network_lab.make_hooks(state, fixture)
    cfg = {**vm_config(facts, name, mac), **hostpci}
    hooks.vm_started("pve", vmid, cfg)
    try:
        (addr,) = ens18(hooks, vmid, cfg)
        return json.loads(ssh(facts, "ubuntu", addr, "cat /etc/gpulab-sim/gpus.json").stdout)
    finally:
        hooks.vm_destroyed("pve", vmid)


def test_a_vm_with_both_cards_sees_both_and_one_with_a_card_sees_that_one(lab):
    # as PVE's start hands them to the hooks: each mapping with the address it maps on the node
    both = guest_gpus(
        lab,
        197,
        "two-cards",
        "bc:24:11:00:10:17",
        {
            "hostpci0": "host=0000:02:00,mapping=rtx3090,pcie=1",
            "hostpci1": "host=0000:05:00,mapping=rtx3060,pcie=1",
        },
    )
    assert [(g["name"], g["memory_mib"], g["pci_bus_id"]) for g in both] == [
        ("NVIDIA GeForce RTX 3090", 24576, "00000000:01:00.0"),
        ("NVIDIA GeForce RTX 3060 Lite Hash Rate", 12288, "00000000:02:00.0"),
    ]
    assert len({g["uuid"] for g in both}) == 2
    (one,) = guest_gpus(lab, 198, "one-card", "bc:24:11:00:10:18", {"hostpci0": "0000:05:00,pcie=1"})
    assert one["uuid"] == both[1]["uuid"] and one["host_address"] == "0000:05:00.0"

"""pve_vm with several cards on one node (labsim fixture two-gpus: RTX 3090 at 0000:02:00 and
RTX 3060 at 0000:05:00): two cards to one VM are hostpci0 and hostpci1 and a second run changes nothing;
two VMs of the node each start with a card of their own."""

from __future__ import annotations

import pytest
from unit.pve.conftest import gpu_map, gpu_vm_args, image_args, run_module, start_lab, stop_lab, wipe_vms

from labsim.fixture import fixtures_dir

RTX3060_MAP = gpu_map(path="0000:05:00", id="10de:2504", iommugroup=16, subsystem_id="1462:397d")
# what gpulab.vmspec gives a VM with vm_gpu: [rtx3090, rtx3060] (the mapping and the address it maps)
BOTH = [
    {"mapping": "rtx3090", "host": "0000:02:00", "pcie": True},
    {"mapping": "rtx3060", "host": "0000:05:00", "pcie": True},
]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    lab = start_lab(tmp_path_factory.mktemp("pve"), fixture={"extends": str(fixtures_dir() / "two-gpus.yml")})
    for args in (
        image_args(lab),
        lab.conn(id="rtx3090", entries=gpu_map()),
        lab.conn(id="rtx3060", entries=RTX3060_MAP),
    ):
        module = "pve_download" if "url" in args else "pve_pci_mapping"
        res = run_module(module, args)
        assert not res.get("failed"), res
    yield lab
    stop_lab(lab)


@pytest.fixture
def clean(lab):
    mark = lab.mark()
    yield lab
    rejected = lab.rejected(mark)
    wipe_vms(lab)
    assert rejected == [], f"the simulator refused requests as malformed: {rejected}"


def test_two_cards_to_one_vm_then_a_second_run_changes_nothing(clean):
    lab = clean
    res = run_module("pve_vm", gpu_vm_args(lab, hostpci=BOTH, state="started"), diff=True)
    assert not res.get("failed"), res
    assert res["changed"] and res["created"] and res["status"] == "running"
    assert res["config"]["hostpci0"] == "mapping=rtx3090,pcie=1"
    assert res["config"]["hostpci1"] == "mapping=rtx3060,pcie=1"
    mark = lab.mark()
    again = run_module("pve_vm", gpu_vm_args(lab, hostpci=BOTH, state="started"), diff=True)
    assert not again.get("failed"), again
    assert again["changed"] is False and again["actions"] == []
    assert lab.writes(mark) == []
    assert again["diff"]["before"] == again["diff"]["after"]


def test_dropping_the_second_card_deletes_hostpci1_only(clean):
    lab = clean
    assert not run_module("pve_vm", gpu_vm_args(lab, hostpci=BOTH)).get("failed")
    res = run_module("pve_vm", gpu_vm_args(lab, hostpci=BOTH[:1]))
    assert res["changed"] and res["delete"] == ["hostpci1"] and res["set"] == {}
    cfg = lab.client().get("nodes/pve/qemu/102/config")
    assert cfg["hostpci0"] == "mapping=rtx3090,pcie=1" and "hostpci1" not in cfg


def test_two_vms_on_the_node_each_start_with_its_own_card(clean):
    lab = clean
    first = run_module("pve_vm", gpu_vm_args(lab, hostpci=BOTH[:1], state="started"))
    second = run_module(
        "pve_vm",
        gpu_vm_args(lab, vmid=103, name="vm-gpu-b", memory=8192, hostpci=BOTH[1:], state="started"),
    )
    assert not first.get("failed") and not second.get("failed"), (first, second)
    assert (first["status"], second["status"]) == ("running", "running")
    assert second["config"]["hostpci0"] == "mapping=rtx3060,pcie=1"
    for vmid, args in (
        (102, {"hostpci": BOTH[:1]}),
        (103, {"name": "vm-gpu-b", "memory": 8192, "hostpci": BOTH[1:]}),
    ):
        again = run_module("pve_vm", gpu_vm_args(lab, vmid=vmid, state="started", **args))
        assert again["changed"] is False, (vmid, again)

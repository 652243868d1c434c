"""Role pve_vms through playbooks/vms.yml with two cards on one node (labsim fixture two-gpus): inventory/demo
with the node's RTX 3060 added to pve_gpus and vm-gpu given both cards (vm_gpu: [rtx3090, rtx3060])."""

from __future__ import annotations

import pathlib
import shutil

import pytest
import yaml
from builders import TWO_GPUS_RTX3060
from unit.pve.conftest import ROOT, playbook_lab

from labsim.fixture import fixtures_dir

from .test_role import converge, converge_again, results


def two_card_inventory(tmp_path: pathlib.Path) -> str:
    inv = tmp_path / "inventory"
    shutil.copytree(ROOT / "inventory" / "demo", inv)
    pve = yaml.safe_load((inv / "host_vars" / "pve.yml").read_text())
    pve["pve_gpus"].append(TWO_GPUS_RTX3060)
    (inv / "host_vars" / "pve.yml").write_text(yaml.safe_dump(pve))
    vm = yaml.safe_load((inv / "host_vars" / "vm-gpu.yml").read_text())
    vm["vm_gpu"] = ["rtx3090", "rtx3060"]
    (inv / "host_vars" / "vm-gpu.yml").write_text(yaml.safe_dump(vm))
    return str(inv)


@pytest.fixture
def two_gpu_lab(tmp_path):
    with playbook_lab(tmp_path, fixture={"extends": str(fixtures_dir() / "two-gpus.yml")}) as lab:
        yield lab


@pytest.mark.slow
def test_two_cards_to_one_vm_are_two_mappings_and_two_hostpci_then_nothing_to_do(two_gpu_lab, tmp_path):
    lab = two_gpu_lab
    inventory = two_card_inventory(tmp_path)
    converge(lab, inventory=inventory)
    client = lab.client()
    assert [(m["id"], m["map"]) for m in client.get("cluster/mapping/pci")] == [
        ("rtx3060", ["node=pve,path=0000:05:00,id=10de:2504,iommugroup=16,subsystem-id=1462:397d"]),
        ("rtx3090", ["node=pve,path=0000:02:00,id=10de:2204,iommugroup=13,subsystem-id=1462:3881"]),
    ]
    cfg = client.get("nodes/pve/qemu/102/config")
    assert cfg["hostpci0"] == "mapping=rtx3090,pcie=1" and cfg["hostpci1"] == "mapping=rtx3060,pcie=1"
    status = {vm["name"]: vm["status"] for vm in client.get("cluster/resources", type="vm")}
    assert status == {"vm-1": "running", "vm-2": "running", "vm-gpu": "running"}

    # a second run: nothing to do
    out, _ = converge_again(lab, inventory=inventory)
    assert results(out, "pve_vm")["vm-gpu"]["changed"] is False

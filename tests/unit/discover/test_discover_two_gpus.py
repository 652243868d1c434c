"""gpulab discover on a VM with two of the node's cards: vm_gpu becomes the list of their ids in hostpci order
(hostpci10 after hostpci2), one through its PCI mapping and one attached raw; a VM with one card keeps the id."""

from __future__ import annotations

from types import SimpleNamespace

from gpulab import discover

G90 = discover.Gpu("rtx3090", "0000:02:00", "10de:2204", ["0000:02:00.0", "0000:02:00.1"], 13, True, "GA102")
G60 = discover.Gpu("rtx3060", "0000:05:00", "10de:2504", ["0000:05:00.0", "0000:05:00.1"], 16, False, "GA106")
CFG = {
    "name": "vm-gpu",
    "cores": 8,
    "memory": "16384",
    "balloon": 0,
    "machine": "q35",
    "bios": "ovmf",
    "scsi0": "local-zfs:vm-102-disk-1,size=200G",
    "net0": "virtio=BC:24:11:00:00:02,bridge=vmbr0",
}


def adopt(cfg):
    found, raw = SimpleNamespace(subnet=None), SimpleNamespace(api={})
    by_slot, mapping_ids = {"0000:02:00": G90, "0000:05:00": G60}, {"rtx3090": G90}
    return discover._vm(found, raw, "/nodes/pve", 102, "vm-gpu", "vm-gpu", cfg, {}, by_slot, mapping_ids)


def test_two_cards_are_a_list_in_hostpci_order():
    vm = adopt({**CFG, "hostpci10": "0000:02:00,pcie=1", "hostpci2": "0000:05:00,pcie=1"})
    assert vm.get("vm_gpu") == ["rtx3060", "rtx3090"]
    vm = adopt({**CFG, "hostpci1": "0000:05:00,pcie=1", "hostpci0": "mapping=rtx3090,pcie=1"})
    assert vm.get("vm_gpu") == ["rtx3090", "rtx3060"]
    # one of them is the host's boot display: not started at boot unless PVE says so
    assert vm.get("vm_onboot") is False and vm.notes == []


def test_one_card_stays_an_id():
    vm = adopt({**CFG, "hostpci0": "0000:05:00,pcie=1"})
    assert vm.get("vm_gpu") == "rtx3060" and vm.get("vm_onboot") is None

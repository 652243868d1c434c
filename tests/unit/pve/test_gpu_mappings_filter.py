"""plugins/filter/pve.py: the PCI resource mappings stage vms asks PVE for, from what each node reports."""

from __future__ import annotations

import re

import plugin_files

pve_gpu_mappings = plugin_files.filters("pve")["pve_gpu_mappings"]

GPU = {"id": "gpu0", "pci": "0000:01:00", "vendor_device": "10de:2204", "iommu_group": 12}


def pci(path, **fields):
    return {
        "id": f"{path}.0",
        "vendor_device": "10de:2484",
        "iommugroup": 14,
        "subsystem_id": "1458:4001",
        **fields,
    }


def test_each_gpu_id_gets_an_entry_per_node_with_what_the_node_reports():
    hostvars = {
        "pve1": {"pve_node": "pve", "pve_gpus": [GPU, {**GPU, "id": "gpu1", "pci": "0000:02:00"}]},
        "pve2": {"pve_gpus": [{**GPU, "pci": "0000:0A:00"}]},
    }
    results = [
        {"item": "pve1", "pci": [pci("0000:01:00"), {"id": "0000:01:00.1", "vendor_device": "10de:1aef"}]},
        {"item": "pve2", "pci": [pci("0000:0a:00", iommugroup=3, subsystem_id=None)]},
    ]
    assert pve_gpu_mappings(results, hostvars) == {
        "gpu0": [
            {
                "node": "pve",
                "path": "0000:01:00",
                "id": "10de:2484",
                "iommugroup": 14,
                "subsystem_id": "1458:4001",
            },
            # no pve_node: the inventory name; the path in lower case, as PVE lists it
            {"node": "pve2", "path": "0000:0a:00", "id": "10de:2484", "iommugroup": 3, "subsystem_id": None},
        ],
        # not reported by its node: the inventory's vendor_device and IOMMU group, no subsystem
        "gpu1": [
            {"node": "pve", "path": "0000:02:00", "id": "10de:2204", "iommugroup": 12, "subsystem_id": None}
        ],
    }


def test_a_card_without_inventory_iommu_group_keeps_none_and_mappings_follow_node_order():
    gpu = {"id": "a", "pci": "0000:03:00", "vendor_device": "10de:1"}
    hostvars = {"n2": {"pve_gpus": [gpu]}, "n1": {"pve_gpus": [gpu]}}
    got = pve_gpu_mappings([{"item": "n2", "pci": []}, {"item": "n1"}], hostvars)
    assert [e["node"] for e in got["a"]] == ["n2", "n1"]
    assert got["a"][0] == {
        "node": "n2",
        "path": "0000:03:00",
        "id": "10de:1",
        "iommugroup": None,
        "subsystem_id": None,
    }


def test_no_node_with_gpus_maps_nothing():
    assert pve_gpu_mappings([], {}) == {}


F = plugin_files.filters("pve")


def test_blacklist_lines_match_the_module_however_it_is_spelled():
    lines = F["kernel_module_lines"](["nouveau", "nvidia_drm"], "blacklist")
    assert lines == [
        {"line": "blacklist nouveau", "regexp": r"^\s*blacklist\s+nouveau\s*$"},
        {"line": "blacklist nvidia_drm", "regexp": r"^\s*blacklist\s+nvidia[-_]drm\s*$"},
    ]
    assert re.match(lines[1]["regexp"], "  blacklist   nvidia-drm ")


def test_module_load_lines_are_the_bare_names():
    assert F["kernel_module_lines"](["vfio", "vfio_pci"]) == [
        {"line": "vfio", "regexp": r"^\s*vfio\s*$"},
        {"line": "vfio_pci", "regexp": r"^\s*vfio_pci\s*$"},
    ]
    assert F["kernel_module_lines"]([], "blacklist") == []


def test_iommu_group_neighbours_are_named_with_their_driver():
    devices = [
        {"address": "0000:00:01.0", "vendor_device": "8086:1901", "class": "0x060400", "driver": "pcieport"},
        {"address": "0000:01:00.2", "vendor_device": "10de:1ad8", "class": "0x0c0330", "driver": ""},
    ]
    assert F["pci_devices_text"](devices) == (
        "0000:00:01.0 (8086:1901, class 0x060400, driver pcieport), "
        "0000:01:00.2 (10de:1ad8, class 0x0c0330, driver none)"
    )

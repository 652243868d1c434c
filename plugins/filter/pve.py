"""Filters of stages host and vms: kernel module lines, IOMMU group neighbours and the GPUs' PCI mappings.

`modules | kernel_module_lines(keyword)` is the lines module files takes for a modprobe file, one per module:
`{line: "<keyword> <module>", regexp}`, the regexp matching the module's line however it is spaced and with - and _
alike, as kmod reads them (`blacklist nvidia_drm` is `blacklist nvidia-drm`); without a keyword, the bare module
name (modules-load files), matched as written. `devices | pci_devices_text` names the devices a GPU shares its
IOMMU group with (pve_host's check), each as `address (vendor:device, class C, driver D)`.

`pve_vms_pci.results | pve_gpu_mappings(hostvars)` takes the results of module pve_info (gather: [pci]) looped
over the Proxmox nodes that list pve_gpus (each result's `item` is the node's inventory host, its `pci` the
node's PCI devices) and returns the mappings module pve_pci_mapping takes: GPU id -> one entry per node that
lists that id, in inventory order, `{node, path, id, iommugroup, subsystem_id}`. PVE keeps one mapping per id
for the whole cluster, so a VM with the card's mapping starts on any node that has it. Each entry carries
what the node reports for the card's first function (`<pci>.0`): its vendor:device, IOMMU group and subsystem;
a card the node does not report keeps the inventory's vendor_device and iommu_group.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError


def kernel_module_lines(modules: list[str], keyword: str = "") -> list[dict[str, str]]:
    out = []
    for module in modules or []:
        module = str(module)
        if keyword:
            line = f"{keyword} {module}"
            regexp = rf"^\s*{keyword}\s+" + re.sub("[-_]", "[-_]", module) + r"\s*$"
        else:
            line, regexp = module, rf"^\s*{module}\s*$"
        out.append({"line": line, "regexp": regexp})
    return out


def pci_devices_text(devices: list[Mapping[str, Any]]) -> str:
    return ", ".join(
        f"{d.get('address')} ({d.get('vendor_device')}, class {d.get('class')}, driver {d.get('driver') or 'none'})"
        for d in devices or []
    )


def _entry(node: str, gpu: Mapping[str, Any], reported: list[Mapping[str, Any]]) -> dict[str, Any]:
    path = str(gpu["pci"]).lower()
    fn0 = next((dev for dev in reported if dev.get("id") == f"{path}.0"), {})
    return {
        "node": node,
        "path": path,
        "id": fn0["vendor_device"] if "vendor_device" in fn0 else gpu.get("vendor_device"),
        "iommugroup": fn0["iommugroup"] if "iommugroup" in fn0 else gpu.get("iommu_group"),
        "subsystem_id": fn0.get("subsystem_id"),
    }


def pve_gpu_mappings(results: list[Mapping[str, Any]], hostvars: Mapping[str, Any]) -> dict[str, list]:
    mappings: dict[str, list] = {}
    for read in results or []:
        host = read.get("item")
        if host is None:
            raise AnsibleFilterError(f"pve_gpu_mappings: a pve_info result has no loop item: {read!r}")
        hv = hostvars[host]
        node = hv.get("pve_node", host)
        for gpu in hv.get("pve_gpus") or []:
            mappings.setdefault(gpu["id"], []).append(_entry(node, gpu, read.get("pci") or []))
    return mappings


class FilterModule:
    def filters(self):
        return {
            "pve_gpu_mappings": pve_gpu_mappings,
            "kernel_module_lines": kernel_module_lines,
            "pci_devices_text": pci_devices_text,
        }

"""Read-only facts about a PVE node: memory, PCI devices and IOMMU groups, VMs, storages, mappings."""

from __future__ import annotations

from typing import Any

from gpulab.pve.client import PveClient, PveError

SECTIONS = ("version", "memory", "pci", "vms", "storages", "mappings", "nics")
# What is read unless asked otherwise (nics costs a read per VM).
DEFAULT_SECTIONS = SECTIONS[:-1]


def _hex(value: Any) -> str:
    return str(value or "").lower().removeprefix("0x")


def gather(
    client: PveClient, node: str, sections: tuple[str, ...] | list[str] = DEFAULT_SECTIONS
) -> dict[str, Any]:
    out: dict[str, Any] = {"node": node}
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        raise ValueError(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    if "version" in sections:
        out["version"] = client.get("version")
    if "memory" in sections:
        status = client.get(f"nodes/{node}/status") or {}
        mem = status.get("memory") or {}
        mib = 1 << 20
        out["memory"] = {
            "total_mib": int(mem.get("total", 0)) // mib,
            "used_mib": int(mem.get("used", 0)) // mib,
            "free_mib": int(mem.get("free", 0)) // mib,
            "available_mib": int(mem.get("available", mem.get("free", 0))) // mib,
        }
    if "pci" in sections:
        devices = client.get(f"nodes/{node}/hardware/pci", **{"pci-class-blacklist": ""}) or []
        pci = []
        groups: dict[str, list[str]] = {}
        for dev in devices:
            item = {
                "id": dev.get("id"),
                "class": _hex(dev.get("class")),
                "vendor_device": f"{_hex(dev.get('vendor'))}:{_hex(dev.get('device'))}",
                "iommugroup": dev.get("iommugroup"),
                "vendor_name": dev.get("vendor_name", ""),
                "device_name": dev.get("device_name", ""),
            }
            if dev.get("subsystem_vendor"):
                item["subsystem_id"] = (
                    f"{_hex(dev.get('subsystem_vendor'))}:{_hex(dev.get('subsystem_device'))}"
                )
            pci.append(item)
            groups.setdefault(str(dev.get("iommugroup")), []).append(str(dev.get("id")))
        out["pci"] = pci
        out["iommu_groups"] = {k: sorted(v) for k, v in groups.items()}
        out["iommu_enabled"] = bool(devices) and all(int(d.get("iommugroup", -1)) >= 0 for d in devices)
    if "vms" in sections:
        vms = client.get(f"nodes/{node}/qemu") or []
        out["vms"] = sorted(
            (
                {
                    "vmid": int(vm.get("vmid")),
                    "name": vm.get("name", ""),
                    "status": vm.get("status", ""),
                    "maxmem_mib": int(vm.get("maxmem", 0)) // (1 << 20),
                    "cpus": vm.get("cpus"),
                    "lock": vm.get("lock"),
                }
                for vm in vms
            ),
            key=lambda v: v["vmid"],
        )
    if "storages" in sections:
        out["storages"] = [
            {
                "storage": s.get("storage"),
                "type": s.get("type"),
                "content": sorted(str(s.get("content", "")).split(",")) if s.get("content") else [],
                "active": bool(s.get("active", 1)),
                "total": s.get("total"),
                "avail": s.get("avail"),
            }
            for s in client.get(f"nodes/{node}/storage") or []
        ]
    if "mappings" in sections:
        out["mappings"] = client.get("cluster/mapping/pci") or []
    if "nics" in sections:
        out["nics"] = _nics(client, node)
    return out


def _nics(client: PveClient, node: str) -> list[dict[str, Any]]:
    """net0 MAC of every VM on the node and, for a running VM whose agent answers, its IPv4 address
    on that NIC: one config read per VM, one agent read per running VM."""
    from gpulab.pve.vm import guest_addresses, net0_mac  # the VM engine knows net0 and the agent's answer

    out = []
    for vm in sorted(client.get(f"nodes/{node}/qemu") or [], key=lambda v: int(v.get("vmid", 0))):
        vmid = int(vm["vmid"])
        mac = net0_mac(client.get(f"nodes/{node}/qemu/{vmid}/config") or {})
        address = None
        if vm.get("status") == "running" and mac:
            try:
                address = next(
                    (a["address"] for a in guest_addresses(client, node, vmid) if a["mac"] == mac), None
                )
            except PveError:
                address = None  # no agent (yet): the address stays unknown
        out.append({"vmid": vmid, "name": vm.get("name", ""), "mac": mac, "address": address})
    return out

"""Builders of lab-definition data for tests: a card of pve_gpus, a Proxmox node's host_vars, a VM's host_vars.

Each builder writes out what every such entry has and gives the reference lab's value (DESIGN.md,
inventory/homelab) for whatever a call does not name, so that a call says only what is particular to its
case: `gpu_vm(103, "rtx4090", node="pve2", onboot=True)` is vm-gpu's shape with another id, card, node and
start at boot. Every call returns fresh dicts, so a test may change what it gets.

Imported by name from every tests folder (pyproject's pytest pythonpath holds tests/).
"""

from __future__ import annotations

import copy
from typing import Any

SSH_KEY = "ssh-ed25519 AAAAC3Nza test"


def card(card_id: str, pci: str, vendor_device: str, iommu_group: int, **more: Any) -> dict:
    """One entry of pve_gpus: the card in slot `pci` (DDDD:BB:SS) with its two functions, the GPU (.0) and
    its HDMI audio (.1); `more` adds keys such as boot_display."""
    return {
        "id": card_id,
        "pci": pci,
        "vendor_device": vendor_device,
        "functions": [f"{pci}.0", f"{pci}.1"],
        "iommu_group": iommu_group,
        **more,
    }


# The reference PC's RTX 3090 24 GB: IOMMU group 13 holds only its two functions; it drives the host's screen.
RTX3090 = card("rtx3090", "0000:02:00", "10de:2204", 13, boot_display=True)
# labsim fixture two-gpus's second card, an RTX 3060 12 GB (library/labsim/fixtures/two-gpus.yml).
TWO_GPUS_RTX3060 = card("rtx3060", "0000:05:00", "10de:2504", 16)
# labsim's card fixtures of issue 31 (library/labsim/fixtures/<name>.yml): each adds this card at 0000:05:00
# beside the reference RTX 3090 (the RTX 2080 with its four functions; the shared-group 3060 in group 14).
FIXTURE_CARDS = {
    "gtx1080": card("gtx1080", "0000:05:00", "10de:1b80", 16),
    "rtx2080": {
        **card("rtx2080", "0000:05:00", "10de:1e82", 16),
        "functions": [f"0000:05:00.{i}" for i in range(4)],
    },
    "rtx5090": card("rtx5090", "0000:05:00", "10de:2b85", 16),
    "rtx-a4000": card("rtxa4000", "0000:05:00", "10de:24b0", 16),
    "shared-group": card("rtx3060", "0000:05:00", "10de:2504", 14),
}


def storage(kind: str, size_gb: int, *content: str) -> dict:
    """One entry of pve_storages: its PVE type, size and content types."""
    return {"type": kind, "content": list(content), "size_gb": size_gb}


def pve_node(
    name: str, address: str, *, memory_mib: int, threads: int, storages: dict, gpus: list[dict]
) -> dict:
    """A Proxmox node's host_vars (group proxmox)."""
    return {
        "ansible_host": address,
        "pve_node": name,
        "pve_memory_mib": memory_mib,
        "pve_threads": threads,
        "pve_storages": copy.deepcopy(storages),
        "pve_gpus": copy.deepcopy(gpus),
    }


def reference_node() -> dict:
    """Node pve, the reference PC: 31 GiB usable, 20 threads, ISOs and images on `local`, VM disks on ZFS
    (`local-zfs`), the RTX 3090."""
    return pve_node(
        "pve",
        "192.168.100.5",
        memory_mib=31744,
        threads=20,
        storages={
            "local": storage("dir", 1700, "iso", "import"),
            "local-zfs": storage("zfspool", 1700, "images", "rootdir"),
        },
        gpus=[RTX3090],
    )


def second_node(*gpus: dict) -> dict:
    """Node pve2 of labsim fixture cluster with `gpus`: a second PC (62 GiB usable, 24 threads) with its own
    `local` and its VM disks on LVM-thin (`local-lvm`), as the lab's pve2 shows them; its screen is the
    CPU's graphics, so no card of it is the boot display."""
    return pve_node(
        "pve2",
        "192.168.100.6",
        memory_mib=63488,
        threads=24,
        storages={
            "local": storage("dir", 90, "iso", "vztmpl", "import", "snippets"),
            "local-lvm": storage("lvmthin", 790, "images", "rootdir"),
        },
        gpus=list(gpus),
    )


def vm(vm_id: int, **fields: Any) -> dict:
    """A VM's host_vars: vm_id and each field under its inventory name (cores=2 is vm_cores: 2). A plain VM
    is the reference lab's vm-1 (4 vCPU, 4096 MiB, 60 GB) unless a field says otherwise."""
    fields = {"cores": 4, "memory_mib": 4096, "disk_gb": 60, **copy.deepcopy(fields)}
    return {"vm_id": vm_id, **{f"vm_{name}": value for name, value in fields.items()}}


def gpu_vm(vm_id: int, gpu: str | list[str], **fields: Any) -> dict:
    """A VM that `gpu` (a card id or a list of them) is passed through to, as the reference lab's vm-gpu unless
    a field says otherwise: 8 vCPU, 16384 MiB without ballooning, 200 GB, q35, OVMF, CPU type host, and no
    start at boot (the reference card is its node's screen)."""
    shape = {
        "cores": 8,
        "memory_mib": 16384,
        "balloon": False,
        "disk_gb": 200,
        "machine": "q35",
        "firmware": "ovmf",
        "cpu": "host",
        "gpu": gpu,
        "onboot": False,
    }
    return vm(vm_id, **{**shape, **fields})

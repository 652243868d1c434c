"""The lab table with several cards: a VM given two cards lists both (their hostpci entries, each card's
UUID as nvidia-smi reports it, and HAMi's shares per UUID), next to a GPU VM of another node."""

import json

from gpulab import labtable

U3090 = "GPU-e1924eea-b9bb-d537-39f2-b345087fa145"
U3060 = "GPU-7c3a91d2-5f04-5e6b-8d1c-0a9e2b4f6d31"
U4090 = "GPU-1b2c3d4e-0000-5111-8222-933344455566"

VMS = [
    {
        "name": "vm-gpu",
        "node": "pve",
        "vmid": 102,
        "address": "192.168.100.55",
        "gpu": ["rtx3090", "rtx3060"],
    },
    {"name": "vm-gpu2", "node": "pve2", "vmid": 103, "address": "192.168.100.56", "gpu": "rtx4090"},
]
PVE = {
    "vm-gpu": {
        "status": "running",
        "config": {
            "cores": 8,
            "memory": "16384",
            "machine": "q35",
            "bios": "ovmf",
            "hostpci0": "mapping=rtx3090,pcie=1",
            "hostpci1": "mapping=rtx3060,pcie=1",
        },
    },
    "vm-gpu2": {"status": "running", "config": {"cores": 8, "hostpci0": "mapping=rtx4090,pcie=1"}},
}
GPUS = {
    "vm-gpu": [
        {
            "uuid": U3090,
            "name": "NVIDIA GeForce RTX 3090",
            "memory_total_mib": 24576,
            "driver_version": "580.95.05",
        },
        {
            "uuid": U3060,
            "name": "NVIDIA GeForce RTX 3060 Lite Hash Rate",
            "memory_total_mib": 12288,
            "driver_version": "580.95.05",
        },
    ],
    "vm-gpu2": [
        {
            "uuid": U4090,
            "name": "NVIDIA GeForce RTX 4090",
            "memory_total_mib": 24564,
            "driver_version": "580.95.05",
        }
    ],
}


def k8s_node(name, cards):
    register = [{"id": u, "count": 10, "devmem": mem, "devcore": 100, "type": t} for u, mem, t in cards]
    return {
        "metadata": {
            "name": name,
            "labels": {},
            "annotations": {"hami.io/node-nvidia-register": json.dumps(register)},
        },
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "allocatable": {"nvidia.com/gpu": str(10 * len(cards))},
        },
    }


def test_a_vm_with_two_cards_lists_both_and_each_card_by_uuid():
    nodes = [
        k8s_node(
            "vm-gpu", [(U3090, 24576, "NVIDIA GeForce RTX 3090"), (U3060, 12288, "NVIDIA GeForce RTX 3060")]
        ),
        k8s_node("vm-gpu2", [(U4090, 24564, "NVIDIA GeForce RTX 4090")]),
    ]
    pod = {
        "metadata": {
            "name": "vllm",
            "namespace": "ai",
            "annotations": {"hami.io/vgpu-devices-allocated": f"{U3060},NVIDIA,5530,0:;"},
        },
        "status": {"phase": "Running"},
    }
    two, one = labtable.rows(VMS, PVE, GPUS, nodes, [pod])
    assert two["gpu"] == "rtx3090 (mapping=rtx3090,pcie=1); rtx3060 (mapping=rtx3060,pcie=1)"
    assert two["driver"] == (
        "GPU-e1924eea: NVIDIA GeForce RTX 3090, 24576 MiB, 580.95.05; "
        "GPU-7c3a91d2: NVIDIA GeForce RTX 3060 Lite Hash Rate, 12288 MiB, 580.95.05"
    )
    assert two["hami"] == "20"
    assert two["shares"] == "GPU-e1924eea: 100 % free; GPU-7c3a91d2: ai/vllm 45 %, 55 % free"
    # a VM with one card reads as before: no UUID in front of its driver line
    assert one["gpu"] == "rtx4090 (mapping=rtx4090,pcie=1)"
    assert one["driver"] == "NVIDIA GeForce RTX 4090, 24564 MiB, 580.95.05"
    assert one["shares"] == "GPU-1b2c3d4e: 100 % free"


def test_a_listed_card_pve_does_not_hold_shows_an_empty_entry():
    vms = [{**VMS[0]}]
    pve = {"vm-gpu": {"status": "running", "config": {"hostpci0": "mapping=rtx3090,pcie=1"}}}
    (row,) = labtable.rows(vms, pve, {}, [])
    assert row["gpu"] == "rtx3090 (mapping=rtx3090,pcie=1); rtx3060 ()"
    assert row["driver"] == "-"

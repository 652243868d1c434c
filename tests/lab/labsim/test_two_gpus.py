"""Two NVIDIA cards on one node (fixtures/two-gpus.yml): the hardware PVE lists, each card passed through by
address or by its resource mapping, and what each VM's nvidia-smi stand-in lists (every card it got, each
with its own UUID)."""

from __future__ import annotations

import pytest
import yaml
from unit.labsim.conftest import InProcessPveSim, start_lab, stop_lab
from unit.labsim.pve_sim_client import EXTRA_TOKENS, FAST_TIMINGS, create_vm

from labsim import network_lab
from labsim.fixture import fixtures_dir, load_fixture
from labsim.vm_hooks import VmHooks

MAP_3090 = "node=pve,path=0000:02:00,id=10de:2204,iommugroup=13,subsystem-id=1462:3881"
MAP_3060 = "node=pve,path=0000:05:00,id=10de:2504,iommugroup=16,subsystem-id=1462:397d"


class RecordingHooks(VmHooks):
    """API-only hooks that keep the config each start hands them."""

    def __init__(self, fixture):
        super().__init__(fixture)
        self.started: dict[int, dict] = {}

    def vm_started(self, node, vmid, config):
        self.started[vmid] = config


@pytest.fixture(scope="module")
def two_gpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("two-gpus")
    fixture = root / "fixture.yml"
    data = {
        "extends": str(fixtures_dir() / "two-gpus.yml"),
        "timings": FAST_TIMINGS,
        "access": {"tokens": EXTRA_TOKENS},
    }
    fixture.write_text(yaml.safe_dump(data))
    server, desc, thread = start_lab(root / "state", fixture)
    server.lab.hooks = RecordingHooks(server.lab.fixture)
    yield InProcessPveSim(server, desc, root / "state")
    stop_lab(server, thread)


def test_the_fixture_adds_an_rtx_3060_in_an_iommu_group_of_its_own():
    (node,) = load_fixture("two-gpus")["nodes"]
    ids = [d["id"] for d in node["pci"]]
    assert ids == sorted(ids) and len(ids) == len(load_fixture("reference")["nodes"][0]["pci"]) + 2
    nvidia = {d["id"]: (d["device"], d["iommugroup"]) for d in node["pci"] if d["vendor"] == "0x10de"}
    assert nvidia == {
        "0000:02:00.0": ("0x2204", 13),
        "0000:02:00.1": ("0x1aef", 13),
        "0000:05:00.0": ("0x2504", 16),
        "0000:05:00.1": ("0x228e", 16),
    }
    assert [d["id"] for d in node["pci"] if d["iommugroup"] == 16] == ["0000:05:00.0", "0000:05:00.1"]


def test_pve_lists_both_cards(two_gpus):
    api = two_gpus.token_api()
    pci = {d["id"]: d for d in api.data("GET", "/nodes/pve/hardware/pci", **{"pci-class-blacklist": ""})}
    assert pci["0000:05:00.0"]["device_name"] == "GA106 [GeForce RTX 3060 Lite Hash Rate]"
    assert pci["0000:05:00.0"]["iommugroup"] == 16 and pci["0000:02:00.0"]["iommugroup"] == 13


def test_a_vm_with_both_cards_sees_both_in_hostpci_order_each_with_its_own_uuid():
    fixture = load_fixture("two-gpus")
    config = {"hostpci0": "0000:02:00,pcie=1", "hostpci1": "host=0000:05:00,mapping=rtx3060,pcie=1"}
    a, b = network_lab.vm_gpus(config, fixture, "pve")
    assert (a["name"], a["memory_mib"], a["host_address"]) == (
        "NVIDIA GeForce RTX 3090",
        24576,
        "0000:02:00.0",
    )
    assert (b["name"], b["memory_mib"], b["host_address"]) == (
        "NVIDIA GeForce RTX 3060 Lite Hash Rate",
        12288,
        "0000:05:00.0",
    )
    assert (a["pci_bus_id"], b["pci_bus_id"]) == ("00000000:01:00.0", "00000000:02:00.0")
    assert a["uuid"] != b["uuid"] and all(g["uuid"].startswith("GPU-") for g in (a, b))
    # the order follows hostpciN, the UUID follows the card
    swapped = network_lab.vm_gpus(
        {"hostpci0": config["hostpci1"], "hostpci1": config["hostpci0"]}, fixture, "pve"
    )
    assert [g["uuid"] for g in swapped] == [b["uuid"], a["uuid"]]


def test_two_vms_each_see_only_their_own_card():
    fixture = load_fixture("two-gpus")
    (a,) = network_lab.vm_gpus({"hostpci0": "host=0000:02:00,mapping=rtx3090,pcie=1"}, fixture, "pve")
    (b,) = network_lab.vm_gpus({"hostpci0": "0000:05:00.0;0000:05:00.1,pcie=1"}, fixture, "pve")
    assert a["host_address"] == "0000:02:00.0" and b["host_address"] == "0000:05:00.0"
    assert a["uuid"] != b["uuid"]
    assert network_lab.vm_gpus({"hostpci0": "0000:04:00"}, fixture, "pve") == []  # the NVMe drive


def test_a_start_hands_the_hooks_each_mapping_resolved_to_its_card(two_gpus):
    api = two_gpus.token_api()
    api.data("POST", "/cluster/mapping/pci", id="rtx3090", map=MAP_3090)
    api.data("POST", "/cluster/mapping/pci", id="rtx3060", map=MAP_3060)
    create_vm(
        api,
        300,
        machine="q35",
        hostpci0="mapping=rtx3090,pcie=1",
        hostpci1="mapping=rtx3060,pcie=1",
    )
    assert api.run("POST", "/nodes/pve/qemu/300/status/start")["exitstatus"] == "OK"
    seen = two_gpus.server.lab.hooks.started[300]
    assert seen["hostpci0"] == "host=0000:02:00,mapping=rtx3090,pcie=1"
    assert seen["hostpci1"] == "host=0000:05:00,mapping=rtx3060,pcie=1"
    # the config PVE keeps is unchanged
    assert api.data("GET", "/nodes/pve/qemu/300/config")["hostpci1"] == "mapping=rtx3060,pcie=1"
    gpus = network_lab.vm_gpus(seen, two_gpus.server.lab.fixture, "pve")
    assert [g["host_address"] for g in gpus] == ["0000:02:00.0", "0000:05:00.0"]
    # a second VM cannot start with a card the first one holds
    create_vm(api, 301, machine="q35", hostpci0="mapping=rtx3060,pcie=1")
    st = api.run("POST", "/nodes/pve/qemu/301/status/start")
    assert st["exitstatus"] != "OK" and "already in use by VMID '300'" in st["exitstatus"]
    api.run("POST", "/nodes/pve/qemu/300/status/stop")

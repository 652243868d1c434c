"""The nodes room (labsim.pve_nodes): /version, /nodes and a node's status, the cluster's resources and next
id, hardware/pci against the reference samples."""

from __future__ import annotations

import json
from pathlib import Path

from unit.labsim.pve_sim_client import create_vm

SAMPLES = Path(__file__).resolve().parents[4] / "shared" / "reference" / "samples"


def test_version_is_the_fixtures(api):
    assert api.data("GET", "/version") == {
        "version": "9.2.11",
        "release": "9.2",
        "repoid": "14a22df3e1c0b2a7",
    }


def test_nextid_is_a_string_and_vmid_check(api):
    nxt = api.data("GET", "/cluster/nextid")
    assert isinstance(nxt, str)
    create_vm(api, int(nxt))
    assert int(api.data("GET", "/cluster/nextid")) > int(nxt)
    r = api.get("/cluster/nextid", vmid=nxt)
    assert r.status_code == 400
    assert r.json()["errors"] == {"vmid": f"VM {nxt} already exists"}


def test_cluster_resources_and_nodes(api):
    create_vm(api, 270)
    res = api.data("GET", "/cluster/resources", type="vm")
    assert {"id": "qemu/270", "type": "qemu"}.items() <= next(r for r in res if r["vmid"] == 270).items()
    assert all(r["type"] == "qemu" for r in res)
    storages = {r["storage"]: r for r in api.data("GET", "/cluster/resources", type="storage")}
    assert storages["local-zfs"]["maxdisk"] == 1_800_000_000_000
    node = api.data("GET", "/nodes")[0]
    assert node["node"] == "pve" and node["status"] == "online" and node["maxcpu"] == 20
    st = api.data("GET", "/nodes/pve/status")
    assert st["boot-info"]["mode"] == "efi" and st["cpuinfo"]["cores"] == 10
    r = api.get("/nodes/nope/status")
    assert r.status_code == 595


def test_hardware_pci_matches_the_reference_samples(api):
    default = api.data("GET", "/nodes/pve/hardware/pci")
    everything = api.data("GET", "/nodes/pve/hardware/pci", **{"pci-class-blacklist": ""})
    if (SAMPLES / "pve-api-hardware-pci-default.json").exists():
        assert default == json.loads((SAMPLES / "pve-api-hardware-pci-default.json").read_text())
        assert everything == json.loads((SAMPLES / "pve-api-hardware-pci-all.json").read_text())
    assert len(everything) == 23 and len({d["iommugroup"] for d in everything}) == 16
    gpu = [d for d in everything if d["iommugroup"] == 13]
    assert [d["id"] for d in gpu] == ["0000:02:00.0", "0000:02:00.1"]
    terse = api.data("GET", "/nodes/pve/hardware/pci", verbose=0)
    assert all(set(d) <= {"id", "class", "vendor", "device", "iommugroup", "mdev"} for d in terse)

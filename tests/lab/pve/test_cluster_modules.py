"""The PVE modules against a two-node cluster (fixtures/cluster.yml: pve with the RTX 3090, pve2 with an
RTX 4090 at 0000:01:00): a mapping with an entry per node, each node's own download and VMs."""

from __future__ import annotations

import pytest
from unit.pve.conftest import (
    cluster_fixture,
    gpu_map,
    gpu_vm_args,
    image_args,
    run_module,
    start_lab,
    stop_lab,
)

PVE2_ENTRY = {
    "node": "pve2",
    "path": "0000:01:00",
    "id": "10de:2684",
    "iommugroup": 9,
    "subsystem_id": "1043:88e2",
}


@pytest.fixture(scope="module")
def cl(tmp_path_factory):
    lab = start_lab(tmp_path_factory.mktemp("cluster"), fixture=cluster_fixture())
    yield lab
    assert lab.rejected() == [], lab.rejected()
    stop_lab(lab)


def test_info_reads_each_nodes_own_card(cl):
    res = run_module("pve_info", cl.conn(node="pve2", gather=["pci", "memory"]))
    assert not res.get("failed"), res
    gpus = [d for d in res["pci"] if d["vendor_device"].startswith("10de:")]
    assert [(d["id"], d["vendor_device"], d["iommugroup"], d.get("subsystem_id")) for d in gpus] == [
        ("0000:01:00.0", "10de:2684", 9, "1043:88e2"),
        ("0000:01:00.1", "10de:22ba", 9, "1043:88e2"),
    ]
    assert res["memory"]["total_mib"] == 63488


def test_a_mapping_with_an_entry_per_node(cl):
    entries = [*gpu_map(), PVE2_ENTRY]
    mark = cl.mark()
    res = run_module("pve_pci_mapping", cl.conn(id="gpu", entries=entries), check=True, diff=True)
    assert res["changed"] and cl.writes(mark) == []
    assert res["diff"]["after"]["map"] == [
        "node=pve,path=0000:02:00,id=10de:2204,iommugroup=13,subsystem-id=1462:3881",
        "node=pve2,path=0000:01:00,id=10de:2684,iommugroup=9,subsystem-id=1043:88e2",
    ]
    assert run_module("pve_pci_mapping", cl.conn(id="gpu", entries=entries))["changed"]
    client = cl.client()
    for node in ("pve", "pve2"):
        listed = client.get("cluster/mapping/pci", **{"check-node": node})
        assert next(m for m in listed if m["id"] == "gpu")["checks"] == [], node
    # the entries in another order are the same mapping
    mark = cl.mark()
    again = run_module("pve_pci_mapping", cl.conn(id="gpu", entries=entries[::-1]))
    assert again["changed"] is False and cl.writes(mark) == []
    # a node that no longer has the card loses its entry, the other keeps its own
    res = run_module("pve_pci_mapping", cl.conn(id="gpu", entries=[PVE2_ENTRY]))
    assert res["changed"]
    assert client.get("cluster/mapping/pci/gpu")["map"] == [
        "node=pve2,path=0000:01:00,id=10de:2684,iommugroup=9,subsystem-id=1043:88e2"
    ]


def test_each_node_downloads_the_image_and_runs_its_own_vm(cl):
    for node in ("pve", "pve2"):
        res = run_module("pve_download", image_args(cl, node=node))
        assert res["changed"] and res["transferred"], (node, res)
    assert run_module("pve_download", image_args(cl, node="pve2"))["changed"] is False
    run_module("pve_pci_mapping", cl.conn(id="gpu", entries=[*gpu_map(), PVE2_ENTRY]))
    disks = {"storage": "local-lvm", "pre_enrolled_keys": False}
    scsi0 = {**gpu_vm_args(cl)["disks"][0], "storage": "local-lvm"}
    on_pve2 = {"node": "pve2", "vmid": 103, "name": "vm-gpu2", "efidisk": disks, "disks": [scsi0]}
    args = gpu_vm_args(cl, state="started", hostpci=[{"mapping": "gpu", "pcie": True}], **on_pve2)
    res = run_module("pve_vm", args)
    assert not res.get("failed"), res
    assert res["status"] == "running"
    client = cl.client()
    config = client.get("nodes/pve2/qemu/103/config")
    assert config["hostpci0"] == "mapping=gpu,pcie=1" and config["scsi0"].startswith("local-lvm:vm-103-disk-")
    # the same id on the other node is the VM on pve2: refused, nothing made twice
    other = run_module("pve_vm", gpu_vm_args(cl, vmid=103, name="vm-gpu2", state="started"))
    assert other.get("failed") and "VM 103 exists on node 'pve2', not 'pve'" in other["msg"], other
    mark = cl.mark()
    again = run_module("pve_vm", args)
    assert again["changed"] is False and cl.writes(mark) == []
    assert [r["path"].split("/api2/json")[1] for r in cl.requests(mark) if "/qemu/103/" in r["path"]] == [
        "/nodes/pve2/qemu/103/pending"
    ]

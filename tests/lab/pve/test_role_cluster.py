"""Role pve_vms through playbooks/vms.yml on two nodes: inventory/demo plus node pve2 (a second RTX 3090 at
another slot and IOMMU group) with two VMs of its own, against the simulated two-node cluster."""

from __future__ import annotations

import pathlib
import shutil

import pytest
import yaml
from builders import card, gpu_vm, second_node, vm
from unit.pve.conftest import ROOT, cluster_fixture, playbook_lab

from .test_role import converge, converge_again, results

# pve2 with the same kind of card as pve's, so the same mapping id: one mapping, an entry for each node
PVE2 = {
    **second_node(card("rtx3090", "0000:01:00", "10de:2204", 9)),
    "ansible_host": "{{ labsim_prefix }}.6",
    "ansible_user": "root",
}
ON_PVE2 = {"node": "pve2", "storage": "local-lvm"}
VM_3 = vm(103, cores=2, memory_mib=2048, disk_gb=20, **ON_PVE2)
# pve2's screen is the CPU's graphics: its GPU VM may start at boot
VM_GPU2 = gpu_vm(
    104, "rtx3090", memory_mib=8192, disk_gb=100, efi_pre_enrolled_keys=False, onboot=True, **ON_PVE2
)


def two_node_inventory(tmp_path: pathlib.Path) -> str:
    inv = tmp_path / "inventory"
    shutil.copytree(ROOT / "inventory" / "demo", inv)
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    children = hosts["all"]["children"]
    children["proxmox"]["hosts"]["pve2"] = None
    children["vms"]["hosts"].update({"vm-3": None, "vm-gpu2": None})
    children["k3s_cluster"]["children"]["k3s_agent"]["hosts"].update({"vm-3": None, "vm-gpu2": None})
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    pve = yaml.safe_load((inv / "host_vars" / "pve.yml").read_text())
    # vm-1, the only k3s server, is on pve: once k3s runs there, stage host would refuse to reboot it
    pve.pop("pve_host_reboot_allowed")
    (inv / "host_vars" / "pve.yml").write_text(yaml.safe_dump(pve))
    prefix = "{{ labsim_prefix }}"
    for host, data in (("pve2", PVE2), ("vm-3", {**VM_3, "vm_address": f"{prefix}.56"})):
        (inv / "host_vars" / f"{host}.yml").write_text(yaml.safe_dump(data))
    (inv / "host_vars" / "vm-gpu2.yml").write_text(yaml.safe_dump({**VM_GPU2, "vm_address": f"{prefix}.57"}))
    return str(inv)


def second_3090() -> dict:
    """The cluster fixture with an RTX 3090 (and its audio function) in pve2's slot 0000:01:00."""
    fixture = cluster_fixture()
    for dev in fixture["nodes"][1]["pci"]:
        if dev["id"] == "0000:01:00.0":
            dev.update(device="0x2204", device_name="GA102 [GeForce RTX 3090]")
        elif dev["id"] == "0000:01:00.1":
            dev.update(device="0x1aef", device_name="GA102 High Definition Audio Controller")
    return fixture


@pytest.fixture
def cluster_lab(tmp_path):
    with playbook_lab(tmp_path, fixture=second_3090()) as lab:
        yield lab


@pytest.mark.slow
def test_two_nodes_each_vm_on_its_node_one_download_per_node_one_mapping_entry_per_node(
    cluster_lab, tmp_path
):
    lab = cluster_lab
    inventory = two_node_inventory(tmp_path)
    converge(lab, inventory=inventory)
    client = lab.client()
    on = {vm["name"]: (vm["node"], vm["status"]) for vm in client.get("cluster/resources", type="vm")}
    assert on == {
        "vm-1": ("pve", "running"),
        "vm-2": ("pve", "running"),
        "vm-gpu": ("pve", "running"),
        "vm-3": ("pve2", "running"),
        "vm-gpu2": ("pve2", "running"),
    }
    # the image once per node (pve2's two VMs share its download), not once per VM nor on pve only
    downloads = [
        r["path"].split("/api2/json")[1] for r in lab.writes() if r["path"].endswith("/download-url")
    ]
    assert sorted(downloads) == [
        "/nodes/pve/storage/local/download-url",
        "/nodes/pve2/storage/local/download-url",
    ]
    for node in ("pve", "pve2"):
        images = [v["volid"] for v in client.get(f"nodes/{node}/storage/local/content")]
        assert images == ["local:import/noble-server-cloudimg-amd64.qcow2"], node
    # one mapping for the card's id, with each node's own slot, IOMMU group and subsystem
    assert [(m["id"], m["map"]) for m in client.get("cluster/mapping/pci")] == [
        (
            "rtx3090",
            [
                "node=pve,path=0000:02:00,id=10de:2204,iommugroup=13,subsystem-id=1462:3881",
                "node=pve2,path=0000:01:00,id=10de:2204,iommugroup=9,subsystem-id=1043:88e2",
            ],
        )
    ]
    gpu2 = client.get("nodes/pve2/qemu/104/config")
    assert gpu2["hostpci0"] == "mapping=rtx3090,pcie=1" and int(gpu2["onboot"]) == 1
    assert gpu2["scsi0"].startswith("local-lvm:vm-104-disk-")

    # a second run: nothing to do, and each VM costs two reads, on its own node (its SSH host keys are in
    # known_hosts since the first run: not read again)
    out, mark = converge_again(lab, inventory=inventory)
    reads = [r["path"].split("/api2/json")[1] for r in lab.requests(mark)]
    for node, vmid in (("pve", 100), ("pve", 101), ("pve", 102), ("pve2", 103), ("pve2", 104)):
        assert [p for p in reads if f"/qemu/{vmid}/" in p] == [
            f"/nodes/{node}/qemu/{vmid}/pending",
            f"/nodes/{node}/qemu/{vmid}/agent/network-get-interfaces",
        ]
    assert reads.count("/cluster/mapping/pci") == 1
    assert sorted(p for p in reads if p.endswith("/hardware/pci")) == [
        "/nodes/pve/hardware/pci",
        "/nodes/pve2/hardware/pci",
    ]
    assert results(out, "pve_vm").keys() == {"vm-1", "vm-2", "vm-gpu", "vm-3", "vm-gpu2"}

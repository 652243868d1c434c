"""The simulator as a two-node PVE cluster (fixtures/cluster.yml): every node's hardware through one API,
VM ids unique cluster-wide, storages local to their node, and PCI mappings with one entry per node that
PVE checks on the node a VM starts on."""

from __future__ import annotations

import json

import pytest
import yaml
from unit.labsim.conftest import InProcessPveSim, start_lab, stop_lab
from unit.labsim.pve_sim_client import EXTRA_TOKENS, FAST_TIMINGS, vm_params

from labsim.fixture import fixtures_dir, load_fixture
from labsim.pve_api import PveApiSim
from labsim.pve_schema import load_schema

NOBLE = "https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img"
NOBLE_SHA256 = "d1940f7d69d343355e183dff1e08a59852d32e7309baa7a4bad8365b11b005ac"
MAP_PVE = "node=pve,path=0000:02:00,id=10de:2204,iommugroup=13,subsystem-id=1462:3881"
MAP_PVE2 = "node=pve2,path=0000:01:00,id=10de:2684,iommugroup=9,subsystem-id=1043:88e2"


@pytest.fixture(scope="module")
def cl(tmp_path_factory) -> InProcessPveSim:
    root = tmp_path_factory.mktemp("cluster")
    fixture = root / "fixture.yml"
    fixture.write_text(
        yaml.safe_dump(
            {
                "extends": str(fixtures_dir() / "cluster.yml"),
                "timings": FAST_TIMINGS,
                "access": {"tokens": EXTRA_TOKENS},
            }
        )
    )
    server, desc, thread = start_lab(root / "state", fixture)
    yield InProcessPveSim(server, desc, root / "state")
    stop_lab(server, thread)


@pytest.fixture(scope="module")
def api(cl):
    return cl.token_api()


def make_vm(api, node: str, vmid: int, storage: str, **extra) -> dict:
    """A small VM (vm_params) on `node`; the create task's final status."""
    upid = api.data("POST", f"/nodes/{node}/qemu", **vm_params(vmid, storage, **extra))
    return api.wait(upid, node)


def download(api, node: str, filename: str) -> dict:
    upid = api.data(
        "POST",
        f"/nodes/{node}/storage/local/download-url",
        content="import",
        filename=filename,
        url=NOBLE,
        checksum=NOBLE_SHA256,
        **{"checksum-algorithm": "sha256"},
    )
    status = api.wait(upid, node)
    log = [line["t"] for line in api.data("GET", f"/nodes/{node}/tasks/{upid}/log", limit=0)]
    return {"status": status, "log": log, "upid": upid}


def test_the_fixture_keeps_the_reference_node_and_adds_a_second_pc():
    cluster, reference = load_fixture("cluster"), load_fixture("reference")
    pve, pve2 = cluster["nodes"]
    assert {k: v for k, v in pve.items()} == reference["nodes"][0]
    gpus = {n["name"]: [d for d in n["pci"] if d["vendor"] == "0x10de"] for n in cluster["nodes"]}
    assert [(d["id"], d["device"], d["iommugroup"]) for d in gpus["pve2"]] == [
        ("0000:01:00.0", "0x2684", 9),
        ("0000:01:00.1", "0x22ba", 9),
    ]
    # pve2's screen is the CPU's graphics, pve's is its RTX 3090
    assert [d["id"] for d in pve2["pci"] if d.get("boot_vga")] == ["0000:00:02.0"]
    assert [d["id"] for d in pve["pci"] if d.get("boot_vga")] == ["0000:02:00.0"]
    others = [d for d in pve2["pci"] if d["iommugroup"] == 9 and d["vendor"] != "0x10de"]
    assert others == []


def test_every_node_answers_through_one_api(api):
    nodes = {n["node"]: n for n in api.data("GET", "/nodes")}
    assert set(nodes) == {"pve", "pve2"} and {n["status"] for n in nodes.values()} == {"online"}
    assert nodes["pve"]["maxmem"] == 33285996544 and nodes["pve2"]["maxmem"] == 66571993088
    assert nodes["pve2"]["maxcpu"] == 24
    status = api.data("GET", "/cluster/status")
    assert status[0] == {
        "type": "cluster",
        "id": "cluster",
        "name": "homelab",
        "nodes": 2,
        "quorate": 1,
        "version": 2,
    }
    assert [(s["name"], s["nodeid"], s["local"], s["online"], s["ip"]) for s in status[1:]] == [
        ("pve", 1, 1, 1, "10.213.0.5"),
        ("pve2", 2, 0, 1, "10.213.0.6"),
    ]
    storages = {s["id"] for s in api.data("GET", "/cluster/resources", type="storage")}
    assert storages == {
        "storage/pve/local",
        "storage/pve/local-zfs",
        "storage/pve2/local",
        "storage/pve2/local-lvm",
    }
    pci2 = api.data("GET", "/nodes/pve2/hardware/pci")
    assert [d["id"] for d in pci2 if d["vendor"] == "0x10de"] == ["0000:01:00.0", "0000:01:00.1"]
    assert "0x2204" not in {d["device"] for d in pci2}  # pve's card is not pve2's
    assert api.data("GET", "/nodes/pve2/status")["cpuinfo"]["cpus"] == 24
    r = api.get("/nodes/pve3/status")
    assert r.status_code == 595 and "no such cluster node 'pve3'" in r.json()["message"]


def test_a_lone_node_is_no_cluster(lab):
    assert [s["type"] for s in lab.token_api().data("GET", "/cluster/status")] == ["node"]


def test_vm_ids_are_unique_across_the_cluster(api):
    assert make_vm(api, "pve", 300, "local-zfs")["exitstatus"] == "OK"
    r = api.post("/nodes/pve2/qemu", vmid=300, scsi0="local-lvm:8")
    assert r.status_code == 500
    assert r.json()["message"].strip() == "unable to create VM 300 - VM 300 already exists on node 'pve'"
    r = api.get("/cluster/nextid", vmid=300)
    assert r.status_code == 400 and r.json()["errors"] == {"vmid": "VM 300 already exists"}
    r = api.get("/nodes/pve2/qemu/300/config")
    assert r.status_code == 500 and "nodes/pve2/qemu-server/300.conf" in r.json()["message"]
    assert make_vm(api, "pve2", 301, "local-lvm")["exitstatus"] == "OK"
    assert [v["vmid"] for v in api.data("GET", "/nodes/pve2/qemu")] == [301]
    on = {v["vmid"]: v["node"] for v in api.data("GET", "/cluster/resources", type="vm")}
    assert on == {300: "pve", 301: "pve2"}
    # a disk goes to a storage of the VM's own node
    r = api.post("/nodes/pve2/qemu", vmid=302, scsi0="local-zfs:8")
    assert r.status_code == 500 and r.json()["message"].strip() == "storage 'local-zfs' does not exist"
    assert api.data("GET", "/nodes/pve2/storage/local-lvm/content")[0]["volid"] == "local-lvm:vm-301-disk-0"


def test_a_node_knows_only_its_own_tasks(api):
    upid = api.data("POST", "/nodes/pve2/qemu/301/status/start")
    assert upid.startswith("UPID:pve2:")
    r = api.get(f"/nodes/pve/tasks/{upid}/status")
    assert r.status_code == 500 and r.json()["message"].strip() == "no such task"
    assert api.wait(upid, "pve2")["exitstatus"] == "OK"
    # its memory counts on its own node only
    mem = {n["node"]: n["mem"] for n in api.data("GET", "/nodes")}
    assert mem["pve2"] == 3221225472 + 2048 * 2**20 and mem["pve"] == 2684354560
    api.wait(api.data("POST", "/nodes/pve2/qemu/301/status/stop"), "pve2")


def test_each_node_downloads_to_its_own_storage(api):
    first = download(api, "pve", "noble.qcow2")
    assert (
        first["status"]["exitstatus"] == "OK"
        and "calculating checksum...OK, checksum verified" in first["log"]
    )
    assert [v["volid"] for v in api.data("GET", "/nodes/pve2/storage/local/content")] == []
    # the same file on pve2's `local` is another download, not pve's file
    second = download(api, "pve2", "noble.qcow2")
    assert second["status"]["exitstatus"] == "OK"
    assert any(" saved [614203392/614203392]" in line for line in second["log"]), second["log"]
    again = download(api, "pve2", "noble.qcow2")
    assert any("no need to download" in line for line in again["log"]), again["log"]
    disk = {n: api.data("GET", f"/nodes/{n}/storage/local/status")["used"] for n in ("pve", "pve2")}
    assert disk == {"pve": 614203392, "pve2": 614203392}


def test_import_from_needs_the_image_on_the_vms_node(api):
    api.data(
        "POST",
        "/nodes/pve/storage/local/download-url",
        content="import",
        filename="only-pve.qcow2",
        url=NOBLE,
    )
    r = api.post("/nodes/pve2/qemu", vmid=310, scsi0="local-lvm:0,import-from=local:import/only-pve.qcow2")
    assert (
        r.status_code == 500
        and r.json()["message"].strip() == "volume 'local:import/only-pve.qcow2' does not exist"
    )


def test_a_mapping_carries_one_entry_per_node_and_each_node_checks_its_own(api):
    api.data("POST", "/cluster/mapping/pci", id="gpu", map=[MAP_PVE, MAP_PVE2])
    item = api.data("GET", "/cluster/mapping/pci/gpu")
    assert item["map"] == [MAP_PVE, MAP_PVE2]
    for node in ("pve", "pve2"):
        listed = api.data("GET", "/cluster/mapping/pci", **{"check-node": node})
        assert next(m for m in listed if m["id"] == "gpu")["checks"] == [], node
    r = api.post(
        "/cluster/mapping/pci", id="twice", map=[MAP_PVE, MAP_PVE.replace("0000:02:00", "0000:03:00")]
    )
    assert r.status_code == 400 and r.json()["errors"] == {"map": "duplicate mapping for node 'pve'"}
    gpu = {"machine": "q35", "memory": "1024", "hostpci0": "mapping=gpu,pcie=1"}
    assert make_vm(api, "pve", 320, "local-zfs", **gpu)["exitstatus"] == "OK"
    assert make_vm(api, "pve2", 321, "local-lvm", **gpu)["exitstatus"] == "OK"
    for node, vmid in (("pve", 320), ("pve2", 321)):
        st = api.wait(api.data("POST", f"/nodes/{node}/qemu/{vmid}/status/start"), node)
        assert st["exitstatus"] == "OK", (node, st)
        api.wait(api.data("POST", f"/nodes/{node}/qemu/{vmid}/status/stop"), node)


def test_a_vm_starts_only_where_its_mapping_has_a_right_entry(api):
    api.data("POST", "/cluster/mapping/pci", id="only-pve", map=[MAP_PVE])
    gpu = {"machine": "q35", "memory": "1024", "hostpci0": "mapping=only-pve,pcie=1"}
    assert make_vm(api, "pve2", 330, "local-lvm", **gpu)["exitstatus"] == "OK"
    listed = api.data("GET", "/cluster/mapping/pci", **{"check-node": "pve2"})
    assert next(m for m in listed if m["id"] == "only-pve")["checks"] == [
        {"severity": "warning", "message": "No mapping for node pve2."}
    ]
    st = api.wait(api.data("POST", "/nodes/pve2/qemu/330/status/start"), "pve2")
    assert st["exitstatus"] == "PCI device mapping not found for 'only-pve'"
    # pve's card written as pve2's entry, at a slot where pve2 has no device
    digest = api.data("GET", "/cluster/mapping/pci/only-pve")["digest"]
    wrong = MAP_PVE.replace("node=pve,", "node=pve2,").replace("0000:02:00", "0000:04:00")
    api.data("PUT", "/cluster/mapping/pci/only-pve", map=[MAP_PVE, wrong], digest=digest)
    st = api.wait(api.data("POST", "/nodes/pve2/qemu/330/status/start"), "pve2")
    assert st["exitstatus"] == (
        "PCI device mapping invalid (hardware probably changed): pci device '0000:04:00.0' not found"
    )
    # pve2's own slot with pve's card's ids
    digest = api.data("GET", "/cluster/mapping/pci/only-pve")["digest"]
    wrong = MAP_PVE2.replace("id=10de:2684", "id=10de:2204")
    api.data("PUT", "/cluster/mapping/pci/only-pve", map=[MAP_PVE, wrong], digest=digest)
    st = api.wait(api.data("POST", "/nodes/pve2/qemu/330/status/start"), "pve2")
    assert st["exitstatus"] == (
        "PCI device mapping invalid (hardware probably changed): "
        "Invalid configuration: 'id' does not match for 'only-pve' (10de:2204 != 10de:2684)"
    )
    assert api.data("GET", "/nodes/pve2/qemu/330/status/current")["status"] == "stopped"


def test_a_state_from_before_volumes_per_node_keeps_its_volumes(tmp_path):
    """A lab state written when volumes were kept by storage only (one node) is read as that node's."""
    state = tmp_path / "state"
    state.mkdir()
    volume = {"volid": "local:iso/x.iso", "content": "iso", "format": "iso", "size": 1, "ctime": 1}
    (state / "pve-state.json").write_text(json.dumps({"volumes": {"local": [volume]}}))
    sim = PveApiSim(state, load_fixture("reference"), load_schema())
    try:
        assert sim.state.data["volumes"] == {"pve/local": [volume]}
        assert sim._find_volume("pve", "local:iso/x.iso") == volume
    finally:
        sim.close()

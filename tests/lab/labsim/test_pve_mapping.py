"""The mapping room (labsim.pve_mapping): /cluster/mapping/pci create, read, update with digest, delete, the
check-node checks and what a start makes of a mapping that no longer matches (several nodes:
test_cluster.py)."""

from __future__ import annotations

from unit.labsim.pve_sim_client import MAP, create_vm


def test_mapping_crud_digest_and_checks(api):
    api.data("POST", "/cluster/mapping/pci", id="gpu", map=MAP, description="the RTX 3090")
    r = api.post("/cluster/mapping/pci", id="gpu", map=MAP)
    assert r.status_code == 500
    item = api.data("GET", "/cluster/mapping/pci/gpu")
    assert item["map"] == [MAP] and item["description"] == "the RTX 3090"
    listed = api.data("GET", "/cluster/mapping/pci", **{"check-node": "pve"})
    assert next(m for m in listed if m["id"] == "gpu")["checks"] == []
    r = api.put("/cluster/mapping/pci/gpu", description="x", digest="0" * 40)
    assert r.status_code == 500
    wrong = MAP.replace("iommugroup=13", "iommugroup=12")
    api.data("PUT", "/cluster/mapping/pci/gpu", map=wrong, digest=item["digest"], delete="description")
    item = api.data("GET", "/cluster/mapping/pci/gpu")
    assert item["map"] == [wrong] and "description" not in item
    checks = next(
        m for m in api.data("GET", "/cluster/mapping/pci", **{"check-node": "pve"}) if m["id"] == "gpu"
    )["checks"]
    assert checks == [
        {
            "severity": "error",
            "message": "Invalid configuration: 'iommugroup' does not match for 'gpu' (12 != 13)\n",
        }
    ]
    create_vm(api, 310, machine="q35", memory="1024", hostpci0="mapping=gpu,pcie=1")
    st = api.run("POST", "/nodes/pve/qemu/310/status/start")
    assert st["exitstatus"].startswith(
        "PCI device mapping invalid (hardware probably changed): Invalid configuration"
    )
    api.data("DELETE", "/cluster/mapping/pci/gpu")
    assert api.get("/cluster/mapping/pci/gpu").status_code == 500


def test_mapping_refusals(api):
    r = api.post("/cluster/mapping/pci", id="bad", map="node=pve,path=0000:02:00")
    assert r.status_code == 400 and r.json()["errors"]["map"].startswith("invalid format - ")
    r = api.get("/cluster/mapping/pci/none-such")
    assert r.status_code == 500 and r.json()["message"].strip() == "PCI mapping 'none-such' not found"
    api.data("POST", "/cluster/mapping/pci", id="kept", map=MAP)
    r = api.put("/cluster/mapping/pci/kept", delete="map")
    assert r.status_code == 400 and r.json()["errors"] == {"delete": "cannot delete required property 'map'"}
    r = api.delete("/cluster/mapping/pci/none-such")
    assert r.status_code == 500 and r.json()["message"].strip() == "PCI mapping 'none-such' not found"

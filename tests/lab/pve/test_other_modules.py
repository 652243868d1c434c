"""pve_download, pve_pci_mapping and pve_info against the strict simulator."""

from __future__ import annotations

import time

from unit.pve.conftest import gpu_map, image_args, run_module

ISO_URL = "https://releases.ubuntu.com/24.04/ubuntu-24.04.3-live-server-amd64.iso"
ISO_SHA256 = "e93681f3cab37e29bdf53bf2231ffc4de4bcc9d90ad8dc5bb62d18a2355052a0"


def test_download_check_mode_then_transfer_then_nothing(own_lab):
    lab = own_lab()
    mark = lab.mark()
    res = run_module("pve_download", image_args(lab), check=True, diff=True)
    assert res["changed"] and not res["present_before"] and lab.writes(mark) == []
    assert "absent" in res["diff"]["before"]
    res = run_module("pve_download", image_args(lab))
    assert res["changed"] and res["transferred"] and res["progress"] == 100.0
    assert res["volid"] == "local:import/noble-server-cloudimg-amd64.qcow2"
    assert any("checksum verified" in line for line in res["log"])
    mark = lab.mark()
    res = run_module("pve_download", image_args(lab))
    assert not res["changed"] and res["present_before"] and not res["transferred"]
    assert lab.writes(mark) == [] and res["requests"] == {"reads": 1, "writes": 0}
    # verify_existing: PVE checks the file, no transfer
    res = run_module("pve_download", image_args(lab, verify_existing=True))
    assert not res["changed"] and not res["transferred"], res


def test_download_checksum_mismatch_fails_with_pves_message(own_lab):
    lab = own_lab()
    res = run_module("pve_download", image_args(lab, checksum="0" * 64))
    assert res["failed"] and "checksum mismatch" in res["msg"], res["msg"]
    res = run_module("pve_download", image_args(lab, checksum="0" * 128, checksum_algorithm="sha512"))
    assert res["failed"] and "checksum mismatch" in res["msg"]


def test_download_refuses_what_pve_would_refuse_before_asking(own_lab):
    lab = own_lab()
    mark = lab.mark()
    res = run_module("pve_download", image_args(lab, filename="noble-server-cloudimg-amd64.img"))
    assert res["failed"] and ".qcow2" in res["msg"]
    res = run_module("pve_download", image_args(lab, checksum="abc"))
    assert res["failed"] and "64 hex" in res["msg"]
    assert lab.requests(mark) == [] or lab.writes(mark) == []


def test_download_started_then_polled(own_lab):
    lab = own_lab(download_max_s=1.0)
    args = lab.conn(
        node="pve",
        storage="local",
        url=ISO_URL,
        filename="ubuntu-24.04.3-live-server-amd64.iso",
        checksum=ISO_SHA256,
    )
    res = run_module("pve_download", {**args, "wait": False})
    assert res["changed"] and res["upid"].startswith("UPID:pve:") and res["done"] is False
    seen = []
    # polled until the simulator's 1 s download ends (a fast machine polls 100 times within it)
    give_up = time.monotonic() + 30
    while True:
        poll = run_module("pve_download", {**args, "upid": res["upid"]})
        assert not poll.get("failed"), poll
        seen.append(poll["progress"])
        if poll["done"] or time.monotonic() > give_up:
            break
        time.sleep(0.05)
    assert poll["done"] and poll["progress"] == 100.0 and poll["transferred"], seen
    known = [p for p in seen if p is not None]  # None until the task log gives a size
    assert known == sorted(known), seen  # progress never goes back
    assert run_module("pve_download", args)["changed"] is False


def test_pci_mapping_create_idempotent_update_absent(own_lab):
    lab = own_lab()
    mark = lab.mark()
    res = run_module("pve_pci_mapping", lab.conn(id="rtx3090", entries=gpu_map()), check=True, diff=True)
    assert res["changed"] and lab.writes(mark) == [] and res["diff"]["before"] == {}
    res = run_module("pve_pci_mapping", lab.conn(id="rtx3090", entries=gpu_map()))
    assert res["changed"]
    assert res["mapping"]["map"] == [
        "node=pve,path=0000:02:00,id=10de:2204,iommugroup=13,subsystem-id=1462:3881"
    ]
    mark = lab.mark()
    res = run_module(
        "pve_pci_mapping",
        lab.conn(id="rtx3090", entries=gpu_map(id="10DE:2204", subsystem_id="0x1462:3881")),
    )
    assert not res["changed"] and lab.writes(mark) == [] and res["requests"] == {"reads": 1, "writes": 0}
    res = run_module("pve_pci_mapping", lab.conn(id="rtx3090", entries=gpu_map(iommugroup=14)), diff=True)
    assert res["changed"] and "iommugroup=14" in res["mapping"]["map"][0]
    (write,) = lab.writes(mark)
    assert write["method"] == "PUT" and write["params"].get("digest")
    res = run_module("pve_pci_mapping", lab.conn(id="rtx3090", state="absent"))
    assert res["changed"] and res["mapping"] is None
    assert lab.client().get("cluster/mapping/pci") == []
    assert run_module("pve_pci_mapping", lab.conn(id="rtx3090", state="absent"))["changed"] is False


def test_pci_mapping_refuses_a_path_without_domain(own_lab):
    lab = own_lab()
    res = run_module("pve_pci_mapping", lab.conn(id="rtx3090", entries=gpu_map(path="02:00")))
    assert res["failed"] and "domain" in res["msg"]


def test_info_reports_memory_gpu_group_and_vms(own_lab):
    lab = own_lab()
    res = run_module("pve_info", lab.conn(node="pve"))
    assert not res.get("failed"), res
    assert res["memory"]["total_mib"] == 31744
    gpu = [d for d in res["pci"] if d["vendor_device"] == "10de:2204"]
    assert gpu and gpu[0]["id"] == "0000:02:00.0" and gpu[0]["iommugroup"] == 13
    assert gpu[0]["subsystem_id"] == "1462:3881"
    assert res["iommu_groups"]["13"] == ["0000:02:00.0", "0000:02:00.1"]
    assert res["iommu_enabled"] is True
    assert res["vms"] == [] and {s["storage"] for s in res["storages"]} == {"local", "local-zfs"}
    assert res["requests"] == {"reads": 6, "writes": 0}
    res = run_module("pve_info", lab.conn(node="pve", gather=["memory"]))
    assert set(res) >= {"memory"} and "pci" not in res and res["requests"]["reads"] == 1


def test_password_login_and_wrong_fingerprint(own_lab):
    lab = own_lab()
    root = {k: v for k, v in lab.root_conn().items()}
    res = run_module("pve_info", {**root, "node": "pve", "gather": ["version"]})
    assert not res.get("failed"), res
    assert res["requests"] == {"reads": 1, "writes": 1}  # the ticket call
    res = run_module(
        "pve_info", lab.conn(node="pve", gather=["version"], api_fingerprint=":".join(["AB"] * 32))
    )
    assert res["failed"] and "TLS" in res["msg"] and "fingerprint" in res["msg"].lower()
    res = run_module("pve_info", lab.conn(node="pve", gather=["version"], api_fingerprint=None))
    assert res["failed"] and "TLS verification failed" in res["msg"]
    res = run_module("pve_info", {**root, "api_password": "wrong", "node": "pve"})
    assert res["failed"] and "root@pam" in res["msg"] and "password" in res["msg"]
    assert "wrong" not in res["msg"]


def test_info_nics_give_each_vms_mac_and_agent_address(lab):
    from unit.pve.conftest import gpu_vm_args, prepare_gpu_lab

    res = run_module("pve_info", lab.conn(node="pve", gather=["nics"]))
    assert res["nics"] == [] and res["requests"]["reads"] == 1
    prepare_gpu_lab(lab)
    created = run_module("pve_vm", gpu_vm_args(lab, state="present"))
    assert not created.get("failed"), created
    res = run_module("pve_info", lab.conn(node="pve", gather=["nics"]))
    # a stopped VM: its MAC from net0, no address (one list read, one config read)
    assert res["nics"] == [
        {"vmid": 102, "name": created["config"]["name"], "mac": created["mac"], "address": None}
    ]
    assert res["requests"] == {"reads": 2, "writes": 0}
    started = run_module("pve_vm", gpu_vm_args(lab, state="started", wait_for_address=True))
    res = run_module("pve_info", lab.conn(node="pve", gather=["nics"]))
    assert res["nics"][0]["address"] == started["address"] and res["requests"]["reads"] == 3

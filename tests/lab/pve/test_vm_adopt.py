"""pve_vm on a VM the user made by hand in PVE's Create VM wizard: it changes only what it must.

The wizard's choices (net0's firewall, the boot order, the CD-ROM, no guest agent, start at boot unset)
stay unless the spec names them; a card attached raw by root is the same passthrough as its mapping.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from unit.pve.conftest import download_iso, prepare_gpu_lab, run_module

ROOT = Path(__file__).resolve().parents[3]


@functools.cache
def homelab_plan(vm: str = "vm-gpu") -> dict:
    """`vm`'s plan as gpulab.vmspec resolves it from inventory/homelab (API token login)."""
    from gpulab import inventory, labdef, vmspec

    env = {
        "GPULAB_PVE_API_TOKEN_SECRET": "11111111-2222-4333-8444-555555555555",
        "GPULAB_ROUTER_PASSWORD": "pw",
    }
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        definition, problems = labdef.check(*inventory.load(ROOT / "inventory" / "homelab"))
    assert problems == [], [str(p) for p in problems]
    return vmspec.resolve(definition)[vm]


def spec() -> dict:
    """pve_vm's options for vm-gpu, exactly as stage vms sends them."""
    plan = homelab_plan()
    return {"node": plan["node"], "vmid": plan["vmid"], "name": plan["name"], **plan["spec"]}


ISO = "local:iso/ubuntu-24.04.3-live-server-amd64.iso"  # inventory/homelab's gpulab_os_iso
# What PVE 9's wizard stores for vm-gpu (q35/OVMF, card attached raw by root), as root@pam would post it.
WIZARD = {
    "name": "vm-gpu",
    "ostype": "l26",
    "scsihw": "virtio-scsi-single",
    "machine": "q35",
    "bios": "ovmf",
    "efidisk0": "local-zfs:1,efitype=4m,pre-enrolled-keys=0",
    "cpu": "host",
    "cores": 8,
    "memory": 16384,
    "balloon": 0,
    "scsi0": "local-zfs:200,iothread=1",
    "net0": "virtio,bridge=vmbr0,firewall=1",
    "ide2": f"{ISO},media=cdrom",
    "boot": "order=scsi0;ide2;net0",
    "hostpci0": "0000:02:00,pcie=1",
}


def wizard_vm(lab):
    prepare_gpu_lab(lab)
    # the simulated node serves the ISO from the lab's URL and checksum; the volume is inventory/homelab's
    assert homelab_plan()["image"]["volume"] == ISO == download_iso(lab)
    root = lab.client(
        api_token_id=None, api_token_secret=None, api_user="root@pam", api_password=lab.desc["password"]
    )
    upid = root.post("nodes/pve/qemu", vmid=102, **WIZARD)
    root.wait_task("pve", upid, 30, what="create the wizard's VM")
    return root.get("nodes/pve/qemu/102/config")


def test_the_wizards_vm_is_adopted_without_a_write(lab):
    before = wizard_vm(lab)
    mark = lab.mark()
    res = run_module("pve_vm", lab.conn(**spec()), diff=True)
    assert not res.get("failed"), res
    assert res["changed"] is False and res["set"] == {} and res["delete"] == [], res
    assert lab.writes(mark) == []
    after = lab.client().get("nodes/pve/qemu/102/config")
    assert after == before
    assert after["hostpci0"] == "0000:02:00,pcie=1" and "firewall=1" in after["net0"]
    assert after["boot"] == "order=scsi0;ide2;net0" and "agent" not in after and "onboot" not in after


def test_only_what_the_inventory_changes_is_written(lab):
    before_mac = wizard_vm(lab)["net0"].split("=")[1].split(",")[0]
    mark = lab.mark()
    res = run_module(
        "pve_vm",
        lab.conn(**{**spec(), "memory": 12288, "nets": [{"bridge": "vmbr0", "firewall": False}]}),
    )
    assert not res.get("failed"), res
    assert res["set"] == {"memory": "12288", "net0": res["set"]["net0"]}
    assert "firewall" not in res["set"]["net0"]
    assert f"macaddr={before_mac}" in res["set"]["net0"]  # the MAC PVE picked is kept
    assert [w["method"] for w in lab.writes(mark)] == ["POST"]


def test_a_new_iso_vm_gets_the_installer_options(lab):
    prepare_gpu_lab(lab)
    wizard_vm(lab)  # the ISO on local
    new = {**spec(), "vmid": 103, "name": "vm-new", "hostpci": []}
    res = run_module("pve_vm", lab.conn(**new))
    assert not res.get("failed") and res["created"], res
    cfg = res["config"]
    assert cfg["ide2"].startswith(ISO) and cfg["boot"] == "order=scsi0;ide2" and cfg["agent"] == "1"


def test_moving_a_raw_card_to_the_mapping_needs_root(lab):
    wizard_vm(lab)
    mapping_only = {**spec(), "hostpci": [{"mapping": "rtx3090", "pcie": True}]}
    mark = lab.mark()
    res = run_module("pve_vm", lab.conn(**mapping_only))
    assert (
        res["failed"]
        and "hostpci0: 0000:02:00,pcie=1 attached raw" in res["msg"]
        and "root@pam" in res["msg"]
    ), res
    assert lab.writes(mark) == []
    res = run_module(
        "pve_vm",
        {
            **{k: v for k, v in lab.conn(**mapping_only).items() if not k.startswith("api_token")},
            **lab.root_conn(),
        },
    )
    assert not res.get("failed"), res
    assert res["set"] == {"hostpci0": "mapping=rtx3090,pcie=1"}

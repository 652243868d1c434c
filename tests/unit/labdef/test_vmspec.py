"""gpulab.vmspec: each VM resolved once from the lab definition into what stage vms sends."""

from __future__ import annotations

import pytest

from gpulab import vmspec
from gpulab.pve import vmoptions


def plans(inv):
    lab, problems = inv.check()
    assert problems == [], [str(p) for p in problems]
    return vmspec.resolve(lab)


def test_the_reference_gpu_vm_is_resolved_whole(inv):
    gpu = plans(inv)["vm-gpu"]
    assert (gpu["node"], gpu["node_host"], gpu["vmid"], gpu["name"]) == ("pve", "pve", 102, "vm-gpu")
    assert gpu["install"] == "cloud_image" and gpu["gpus"] == ["rtx3090"]
    spec = gpu["spec"]
    assert spec["machine"] == "q35" and spec["bios"] == "ovmf" and spec["cpu"] == "host"
    assert spec["balloon"] == 0 and spec["onboot"] is False
    assert spec["hostpci"] == [{"mapping": "rtx3090", "host": "0000:02:00", "pcie": True}]
    assert spec["efidisk"] == {"storage": "local-zfs", "pre_enrolled_keys": False}
    assert spec["disks"] == [
        {
            "slot": "scsi0",
            "storage": "local-zfs",
            "size_gb": 200,
            "iothread": True,
            "import_from": "local:import/noble-server-cloudimg-amd64.qcow2",
        }
    ]
    assert spec["cloudinit"]["user"] == "ubuntu" and spec["cloudinit"]["ssh_keys"] == [
        "ssh-ed25519 AAAAC3Nza test"
    ]
    assert spec["extra_config"] == {"cicustom": "vendor=local:snippets/gpulab-vendor.yaml"}
    assert gpu["image"] == {
        "storage": "local",
        "content": "import",
        "url": "https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img",
        "filename": "noble-server-cloudimg-amd64.qcow2",
        "checksum": "d1940f7d69d343355e183dff1e08a59852d32e7309baa7a4bad8365b11b005ac",
        "checksum_algorithm": "sha256",
        "volume": "local:import/noble-server-cloudimg-amd64.qcow2",
    }


def test_every_spec_key_is_an_option_of_the_module(inv):
    for plan in plans(inv).values():
        assert set(plan["spec"]) <= {o.name for o in vmoptions.CONTROL}, plan["host"]


def test_gpu_vms_come_last(inv):
    inv.groups["vms"] = ["vm-gpu", "vm-1", "vm-2"]
    assert list(plans(inv)) == ["vm-1", "vm-2", "vm-gpu"]


# The four places where the role and the lab definition used to disagree.


def test_the_balloon_floor_is_what_pve_gets(inv):
    inv.hosts["vm-1"]["vm_balloon_min_mib"] = 1024
    assert plans(inv)["vm-1"]["spec"]["balloon"] == 1024
    assert plans(inv)["vm-2"]["spec"]["balloon"] == 4096  # no floor: all of its memory


def test_vm_name_names_the_vm(inv):
    inv.hosts["vm-1"]["vm_name"] = "web-1"
    plan = plans(inv)["vm-1"]
    assert plan["name"] == "web-1" and plan["host"] == "vm-1"


def test_a_vm_without_cores_memory_and_disk_gets_the_catalogue_defaults(inv):
    for name in ("vm_cores", "vm_memory_mib", "vm_disk_gb"):
        del inv.hosts["vm-2"][name]
    spec = plans(inv)["vm-2"]["spec"]
    assert (spec["cores"], spec["memory"], spec["disks"][0]["size_gb"]) == (2, 2048, 32)


def test_start_at_boot_is_what_the_definition_says(inv):
    # a boot-display GPU: refused by the checks unless overridden, and then honoured as it is
    inv.hosts["vm-gpu"]["vm_onboot"] = True
    assert any("vm_onboot" in m for m in inv.messages())
    inv.hosts["vm-gpu"]["vm_onboot_override_boot_display"] = True
    assert plans(inv)["vm-gpu"]["spec"]["onboot"] is True
    inv.hosts["pve"]["pve_gpus"][0]["boot_display"] = False
    del inv.hosts["vm-gpu"]["vm_onboot_override_boot_display"]
    assert plans(inv)["vm-gpu"]["spec"]["onboot"] is True


def test_start_at_boot_unset_is_left_to_pve(inv):
    # a new VM gets PVE's default (off); an existing one keeps its own setting (None: not managed)
    inv.hosts["vm-1"].pop("vm_onboot", None)
    assert plans(inv)["vm-1"]["spec"]["onboot"] is None


MAPPED = {"mapping": "rtx3090", "host": "0000:02:00", "pcie": True}


@pytest.mark.parametrize(
    ("login", "device"),
    [
        ({"pve_api_user": "root@pam", "pve_api_password": "pw"}, {"host": "0000:02:00", "pcie": True}),
        ({"pve_api_user": "admin@pve", "pve_api_password": "pw"}, MAPPED),
        ({}, MAPPED),  # the token
    ],
)
def test_mapping_unless_root_password(inv, login, device):
    # with a mapping, the raw address it maps is given too: a card attached raw already stays so
    if login:
        del inv.globals["pve_api_token_id"], inv.globals["pve_api_token_secret"]
        inv.globals.update(login)
    assert plans(inv)["vm-gpu"]["spec"]["hostpci"] == [device]


def test_the_mapping_only_when_the_inventory_asks(inv):
    inv.hosts["vm-gpu"]["vm_gpu_passthrough"] = "mapping"
    assert plans(inv)["vm-gpu"]["spec"]["hostpci"] == [{"mapping": "rtx3090", "pcie": True}]
    inv.hosts["vm-gpu"]["vm_gpu_passthrough"] = "raw"
    assert any("vm-gpu: vm_gpu_passthrough='raw'" in m for m in inv.messages()), inv.messages()


def test_an_iso_install_gets_the_installer_and_no_cloud_init(inv):
    inv.globals["gpulab_os_iso"] = {
        "url": "https://releases.ubuntu.com/24.04/ubuntu-24.04.3-live-server-amd64.iso",
        "filename": "ubuntu-24.04.3-live-server-amd64.iso",
        "checksum": "c3514bf0056180d09376462a7a1b4f213c1d6e8ea67fae5c25099c6fd3d8274b",
        "storage": "local",
    }
    inv.hosts["vm-1"]["vm_os_install"] = "iso"
    plan = plans(inv)["vm-1"]
    assert plan["install"] == "iso" and plan["snippet"] is None
    spec = plan["spec"]
    assert spec["cdrom"] == "local:iso/ubuntu-24.04.3-live-server-amd64.iso" == plan["image"]["volume"]
    assert "cloudinit" not in spec and "import_from" not in spec["disks"][0]
    assert spec["boot_order"] == ["scsi0", "ide2"] and spec["serial_console"] is None
    # what the installer needs, and the wizard's choices, only when gpulab creates the VM
    assert spec["create_only"] == ["cdrom", "boot_order", "agent", "ostype", "scsihw", "tags"]
    # a cloud-image VM is gpulab's own, but an existing one is not tagged afterwards (adopting never tags)
    assert plans(inv)["vm-2"]["spec"]["create_only"] == ["tags"]


def test_every_vm_is_created_with_the_owner_tag_and_only_created_with_it(inv):
    from gpulab.vmspec import OWNER_TAG

    for plan in plans(inv).values():
        assert plan["spec"]["tags"] == [OWNER_TAG] and "tags" in plan["spec"]["create_only"]


def test_no_snippet_when_it_is_turned_off(inv):
    inv.globals["gpulab_guest_agent_snippet"] = False
    plan = plans(inv)["vm-1"]
    assert plan["snippet"] is None and "extra_config" not in plan["spec"]


def test_the_snippet_goes_to_gpulab_snippet_storage(inv):
    inv.globals["gpulab_snippet_storage"] = "local-btrfs"
    plan = plans(inv)["vm-1"]
    assert plan["snippet"] == {"storage": "local-btrfs", "name": "gpulab-vendor.yaml"}
    assert plan["spec"]["extra_config"] == {"cicustom": "vendor=local-btrfs:snippets/gpulab-vendor.yaml"}

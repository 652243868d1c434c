"""`gpulab doctor` (gpulab.doctor) against each card fixture of issue 31: the read-only script runs over the node's
/sys and /proc as labsim.sysfs_tree materialises them from the fixture (GPULAB_SYSFS_ROOT points it there, as
over SSH it reads the node's own), and the report has the expected findings with their fixes; stage host's
refusals (gpulab.doctor.stage_host_problems) follow from the same report."""

from __future__ import annotations

import os
import subprocess

import pytest
from builders import FIXTURE_CARDS, RTX3090

from gpulab import doctor
from labsim import sysfs_tree
from labsim.fixture import DEFAULT_PVE, load_fixture, resolve_fixture
from labsim.net.node_host import dpkg_status

# fixture -> [(level, check, fragment of the finding)] of its card
CASES = {
    "reference": [("ok", "reset", "reset methods: flr bus")],
    "gtx1080": [("ok", "reset", "bus (no FLR"), ("ok", "BAR size", "BAR 256 MiB")],
    "rtx2080": [("ok", "IOMMU group", "group 16 holds only the card's own")],
    "cluster": [("ok", "reset", "flr bus"), ("ok", "driver", "no host driver")],
    "rtx5090": [("warn", "reset", "Blackwell"), ("warn", "BAR size", "BAR of 32 GiB")],
    "rtx5090-narrow-iommu": [
        ("warn", "BAR size", "the IOMMU's address width (39 bits) is below the CPU's (46)")
    ],
    "rtx-a4000": [("ok", "reset", "reset methods: flr bus")],
    "shared-group": [("blocks", "IOMMU group", "group 14 also holds 0000:03:00.0")],
    "irq-remap-off": [("ok", "IOMMU group", "group 13 holds only")],
}
# the node and card slot of each fixture's card (the added cards sit at 0000:05:00 on node pve)
WHERE = {
    "reference": ("pve", "0000:02:00"),
    "cluster": ("pve2", "0000:01:00"),
    "irq-remap-off": ("pve", "0000:02:00"),
}
BLOCKED = {"shared-group", "irq-remap-off"}


def read(tmp_path, fixture, node_name, state="vfio", dpkg=None, **variants):
    """The doctor's read of the fixture node's materialised tree (what `gpulab doctor` gets over SSH); ``dpkg``:
    the node's /var/lib/dpkg/status (none: a node whose package database says nothing of PVE)."""
    fix = load_fixture(resolve_fixture(fixture))
    node = next(n for n in fix["nodes"] if n["name"] == node_name)
    own = {str(d["id"]).lower() for d in node["pci"]} != sysfs_tree.reference_addresses()
    root = sysfs_tree.materialise(
        tmp_path / "root", state, pci=node["pci"] if own else None, hardware=node.get("hardware"), **variants
    )
    if dpkg is not None:
        (root / "var/lib/dpkg").mkdir(parents=True)
        (root / "var/lib/dpkg/status").write_text(dpkg)
    env = {**os.environ, "GPULAB_SYSFS_ROOT": str(root)}
    out = subprocess.run(["sh", "-c", doctor.SCRIPT], env=env, capture_output=True, text=True, check=True)
    assert out.stderr == ""
    return out.stdout


@pytest.mark.parametrize("fixture", list(CASES))
def test_each_fixture_has_its_findings(tmp_path, fixture):
    node, slot = WHERE.get(fixture, ("pve", "0000:05:00"))
    report = doctor.analyse(read(tmp_path, fixture, node))
    assert report.blocked is (fixture in BLOCKED), report.text()
    [card] = [c for c in report.cards if c.address == slot]
    for level, check, fragment in CASES[fixture]:
        assert any(f.level == level and f.check == check and fragment in f.text for f in card.findings), (
            report.text()
        )
    assert all(f.fix for f in card.findings if f.level != "ok")


def test_interrupt_remapping_off_blocks_with_its_fix(tmp_path):
    report = doctor.analyse(read(tmp_path, "irq-remap-off", "pve"))
    [ir] = [f for f in report.node if f.check == "interrupt remapping"]
    assert ir.level == "blocks" and "allow_unsafe_interrupts=1" in ir.fix and "BIOS" in ir.fix


def test_iommu_off_blocks_and_a_host_driver_is_named(tmp_path):
    report = doctor.analyse(read(tmp_path, "reference", "pve", state="stock", iommu=False))
    assert [f.level for f in report.node if f.check == "IOMMU"] == ["blocks"]
    [card] = report.cards
    assert any(f.check == "driver" and f.text == "nouveau holds it now" for f in card.findings)


def test_the_boot_framebuffer_is_named_on_the_boot_display(tmp_path):
    text = read(tmp_path, "reference", "pve").replace("== fb\n", "== fb\n0 simpledrmdrmfb\n")
    [card] = doctor.analyse(text).cards
    [fb] = [f for f in card.findings if f.check == "framebuffer"]
    assert fb.level == "warn" and "simpledrm holds its memory" in fb.text
    assert "initcall_blacklist=sysfb_init" in fb.fix


def test_a_large_bar_with_a_narrow_iommu_and_an_old_qemu_server_blocks(tmp_path):
    text = read(tmp_path, "rtx5090", "pve")
    text = text.replace(
        "== cpu\naddress sizes\t: 39 bits physical", "== cpu\naddress sizes\t: 46 bits physical"
    )
    text = text.replace("== dpkg\n", "== dpkg\nqemu-server 9.0.17\n")
    [bar] = [
        f for c in doctor.analyse(text).cards for f in c.findings if f.check == "BAR size" and f.level != "ok"
    ]
    assert bar.level == "blocks" and "qemu-server 9.0.18" in bar.fix
    newer = text.replace("qemu-server 9.0.17", "qemu-server 9.1.7")
    [bar] = [
        f
        for c in doctor.analyse(newer).cards
        for f in c.findings
        if f.check == "BAR size" and f.level != "ok"
    ]
    assert bar.level == "warn" and "guest-phys-bits=39" in bar.fix


def test_stage_host_refuses_a_card_that_cannot_be_reset_on_a_vm_that_starts_at_boot(tmp_path):
    report = doctor.analyse(read(tmp_path, "rtx5090", "pve"))
    gpus = [RTX3090, FIXTURE_CARDS["rtx5090"]]
    vm = {"host": "vm-gpu", "gpus": ["rtx5090"], "spec": {"onboot": True}}
    [problem] = doctor.stage_host_problems(report, gpus, [vm])
    assert "GPU rtx5090 (0000:05:00" in problem and "cannot be reset reliably" in problem
    assert "Fix: set vm_onboot: false on vm-gpu" in problem
    assert doctor.stage_host_problems(report, gpus, [{**vm, "spec": {"onboot": False}}]) == []


def test_stage_host_refuses_interrupt_remapping_off_only_with_a_card(tmp_path):
    report = doctor.analyse(read(tmp_path, "irq-remap-off", "pve"))
    [problem] = doctor.stage_host_problems(report, [RTX3090], [])
    assert problem.startswith("interrupt remapping: off")
    assert doctor.stage_host_problems(report, [], []) == []


def test_the_pve_version_comes_from_the_nodes_package_database(tmp_path):
    """The lab node's dpkg status (labsim.net.node_host.dpkg_status) as the doctor's awk reads a real one."""
    report = doctor.analyse(read(tmp_path, "reference", "pve", dpkg=dpkg_status(DEFAULT_PVE)))
    assert [f.text for f in report.node if f.check == "PVE"] == ["qemu-server 9.2.6, pve-manager 9.2.11"]
    assert report.qemu_server == "9.2.6"


SLOT_5090 = FIXTURE_CARDS["rtx5090"]["pci"]


def test_stage_vms_narrows_the_guest_address_width_for_a_large_bar_behind_a_narrow_iommu(tmp_path):
    text = read(tmp_path, "rtx5090-narrow-iommu", "pve", dpkg=dpkg_status(DEFAULT_PVE))
    report = doctor.analyse(text)
    out = doctor.vm_cpu(report, "host", [SLOT_5090])
    assert out["cpu"] == "host,guest-phys-bits=39"
    assert (
        "at 0000:05:00 (BAR 32 GiB): the node's IOMMU maps 39 address bits and its CPU has 46" in out["why"]
    )
    # the owner's width stays; a VM with only the 3090 (256 MiB BAR) needs none
    assert doctor.vm_cpu(report, "host,guest-phys-bits=42", [SLOT_5090]) == {
        "cpu": "host,guest-phys-bits=42",
        "why": "",
    }
    assert doctor.vm_cpu(report, "host", [RTX3090["pci"]]) == {"cpu": "host", "why": ""}
    # a qemu-server without guest-phys-bits: nothing to write (stage host has stopped the run on it)
    old = doctor.analyse(text.replace("qemu-server 9.2.6", "qemu-server 9.0.17"))
    assert doctor.vm_cpu(old, "host", [SLOT_5090]) == {"cpu": "host", "why": ""}


def test_no_narrowing_where_the_iommu_maps_all_the_cpu_addresses(tmp_path):
    report = doctor.analyse(read(tmp_path, "rtx5090", "pve"))
    assert (report.cpu_bits, report.iommu_bits) == (39, 39)
    assert doctor.vm_cpu(report, "host", [SLOT_5090]) == {"cpu": "host", "why": ""}


# --- issue 43: the display adapters and nomodeset, the boot loader ---------------------------------------------


def test_the_reference_card_alone_as_the_boot_display_keeps_nomodeset(tmp_path):
    report = doctor.analyse(read(tmp_path, "reference", "pve"))
    [finding] = [f for f in report.node if f.check == "nomodeset"]
    assert finding.level == "ok" and finding.text.startswith(
        "stage host adds nomodeset: the passed-through card"
    )


def test_an_igpu_as_the_boot_display_is_named_and_keeps_its_driver(tmp_path):
    """igpu-boot-vga: the UHD 630 on i915 drives the screen; stage host leaves nomodeset out and the doctor says
    what forcing it would take away."""
    report = doctor.analyse(read(tmp_path, "igpu-boot-vga", "pve", state="stock"))
    [finding] = [f for f in report.node if f.check == "nomodeset"]
    assert finding.level == "ok", report.text()
    assert (
        "leaves out nomodeset: no passed-through card is the boot display (0000:00:02.0 is)" in finding.text
    )
    assert "pve_host_nomodeset: true would take the driver off 0000:00:02.0 (8086:9bc5, i915 holds it)" in (
        finding.text
    )


def test_nomodeset_on_the_running_line_keeping_the_igpu_off_is_a_warning(tmp_path):
    cmdline = "initrd=\\EFI\\proxmox\\x\\initrd.img-x root=ZFS=rpool/ROOT/pve-1 boot=zfs nomodeset"
    report = doctor.analyse(read(tmp_path, "igpu-boot-vga", "pve", state="stock", cmdline=cmdline))
    [warn] = [f for f in report.node if f.check == "nomodeset" and f.level == "warn"]
    assert "keeps 0000:00:02.0 (8086:9bc5, i915) off its driver (no /dev/dri)" in warn.text
    assert "pve_host_nomodeset: auto" in warn.fix


def test_nomodeset_decision_keeps_the_owners_choice_and_names_the_igpu():
    igpu = {"address": "0000:00:02.0", "vendor_device": "8086:9bc5", "boot_vga": True, "driver": "i915",
            "modules": ["i915"]}  # fmt: skip
    card = {"address": "0000:02:00.0", "vendor_device": "10de:2204", "boot_vga": False, "driver": "vfio-pci",
            "modules": ["nvidiafb", "nouveau", "nova_core"]}  # fmt: skip
    forced = doctor.nomodeset_decision([igpu, card], ["0000:02:00"], True)
    assert forced["on"] is True
    assert "0000:00:02.0 (8086:9bc5, i915 holds it) would lose its DRM driver under it" in forced["why"]
    assert doctor.nomodeset_decision([igpu, card], ["0000:02:00"], "false")["on"] is False
    assert doctor.nomodeset_decision([igpu, card], ["0000:02:00"])["on"] is False
    # the card as the boot display with the iGPU still there: off, the iGPU can drive a screen
    both = doctor.nomodeset_decision(
        [{**igpu, "boot_vga": False}, {**card, "boot_vga": True}], ["02:00"], "auto"
    )
    assert both["on"] is False and "can drive the host's screen" in both["why"]
    # the card alone: on
    assert doctor.nomodeset_decision([{**card, "boot_vga": True}], ["0000:02:00"], "auto")["on"] is True


def test_a_stray_kernel_cmdline_on_a_grub_node_is_named(tmp_path):
    text = read(tmp_path, "grub-stray-cmdline", "pve")
    root = tmp_path / "root"
    (root / "etc/kernel").mkdir(parents=True)
    (root / "etc/kernel/cmdline").write_text("root=/dev/mapper/pve-root ro quiet intel_iommu=on iommu=pt\n")
    (root / "boot/grub").mkdir(parents=True)
    (root / "boot/grub/grub.cfg").write_text("# generated\n")
    env = {**os.environ, "GPULAB_SYSFS_ROOT": str(root)}
    text = subprocess.run(
        ["sh", "-c", doctor.SCRIPT], env=env, capture_output=True, text=True, check=True
    ).stdout
    [finding] = [f for f in doctor.analyse(text).node if f.check == "boot loader"]
    assert finding.level == "warn"
    assert (
        "/etc/kernel/cmdline exists but no ESP is registered" in finding.text and "UEFI boot" in finding.text
    )
    assert "remove the stray /etc/kernel/cmdline" in finding.fix
    (root / "etc/kernel/proxmox-boot-uuids").write_text("9A3B-1C2D\n")
    text = subprocess.run(
        ["sh", "-c", doctor.SCRIPT], env=env, capture_output=True, text=True, check=True
    ).stdout
    [finding] = [f for f in doctor.analyse(text).node if f.check == "boot loader"]
    assert finding.level == "ok" and "proxmox-boot-tool keeps 1 ESP(s)" in finding.text

"""The node host's command stand-ins (labsim.net.command_standins) against the upstream tools: one test per
behaviour listed in library/labsim/UPSTREAM.md (## command stand-ins), named after its id. Each runs the
stand-in as the lab host does, with its paths under a folder of the test (GPULAB_STANDIN_ROOT)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from labsim.net import command_standins

KERNEL = "6.17.2-1-pve"
CMDLINE = "root=ZFS=rpool/ROOT/pve-1 boot=zfs nomodeset"


@pytest.fixture
def node(tmp_path):
    """run(cmd, *args) runs a stand-in on a node whose files live under tmp_path; put(path, text) writes one."""
    root = tmp_path / "root"

    def put(path, text):
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    def run(cmd, *args, env=None):
        return subprocess.run(
            [sys.executable, command_standins.__file__, cmd, *args],
            capture_output=True,
            text=True,
            env={**os.environ, "GPULAB_STANDIN_ROOT": str(root), **(env or {})},
        )

    def read(path):
        return (root / path.lstrip("/")).read_text()

    put("/etc/gpulab-sim/node.json", json.dumps({"loader": "systemd-boot", "kernel": KERNEL}))
    put("/etc/kernel/cmdline", CMDLINE + "\n")
    run.put, run.read, run.root = put, read, root
    return run


def esp(node):
    node.put("/etc/kernel/proxmox-boot-uuids", "1A2B-3C4D\n")


def test_proxmox_boot_tool_refresh_systemd_boot(node):
    esp(node)
    out = node("proxmox-boot-tool", "refresh")
    assert out.returncode == 0
    # proxmox-boot-tool's own lines on stdout, the hooks' warnings on stderr
    assert out.stdout == (
        "Running hook script 'proxmox-auto-removal'..\n"
        "Running hook script 'zz-proxmox-boot'..\n"
        "Re-executing '/etc/kernel/postinst.d/zz-proxmox-boot' in new private mount namespace..\n"
    )
    assert out.stderr == (
        "Copying and configuring kernels on /dev/disk/by-uuid/1A2B-3C4D\n"
        f"\tCopying kernel and creating boot-entry for {KERNEL}\n"
    )
    # the loader entry takes the first line of /etc/kernel/cmdline
    assert node.read("/var/lib/gpulab-sim/boot/cmdline") == (
        f"initrd=\\EFI\\proxmox\\{KERNEL}\\initrd.img-{KERNEL} {CMDLINE}\n"
    )


def test_proxmox_boot_tool_refresh_no_esp_list(node):
    out = node("proxmox-boot-tool", "refresh")
    assert out.returncode == 0
    assert out.stderr == "No /etc/kernel/proxmox-boot-uuids found, skipping ESP sync.\n"
    assert not (node.root / "var/lib/gpulab-sim/boot/cmdline").exists()


def test_proxmox_boot_tool_refresh_no_root(node):
    esp(node)
    node.put("/etc/kernel/cmdline", "quiet nomodeset\n")
    out = node("proxmox-boot-tool", "refresh")
    assert out.returncode == 1 and out.stderr == "No root= parameter in /etc/kernel/cmdline found!\n"


def test_proxmox_boot_tool_status(node):
    missing = node("proxmox-boot-tool", "status")
    assert missing.returncode == 2 and missing.stderr == "E: /etc/kernel/proxmox-boot-uuids does not exist.\n"
    assert node("proxmox-boot-tool", "status", "--quiet").stderr == ""
    esp(node)
    assert node("proxmox-boot-tool", "status", "--quiet").returncode == 0
    out = node("proxmox-boot-tool", "status")
    assert out.returncode == 0
    assert out.stdout.splitlines()[1:] == [
        "System currently booted with uefi",
        f"1A2B-3C4D is configured with: uefi (versions: {KERNEL})",
    ]


def test_update_grub_on_proxmox_boot_tool(node):
    esp(node)
    out = node("update-grub")
    assert out.returncode == 0
    lines = out.stderr.splitlines()
    assert lines[:5] == [
        "Generating grub configuration file ...",
        "W: This system is booted via proxmox-boot-tool:",
        "W: Executing 'update-grub' directly does not update the correct configs!",
        "W: Running: 'proxmox-boot-tool refresh'",
        "",
    ]
    assert lines[-1] == "done" and out.stdout == ""  # the snippet sends the refresh's stdout to /dev/null
    assert node.read("/var/lib/gpulab-sim/boot/cmdline").endswith(CMDLINE + "\n")


def test_update_grub_plain(node):
    node.put("/etc/gpulab-sim/node.json", json.dumps({"loader": "grub", "kernel": KERNEL}))
    node.put("/etc/default/grub", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX=""\n')
    node.put(
        "/etc/default/grub.d/gpulab.cfg",
        'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT iommu=pt"\n',
    )
    out = node("update-grub")
    assert out.returncode == 0
    assert out.stderr.splitlines() == [
        "Generating grub configuration file ...",
        f"Found linux image: /boot/vmlinuz-{KERNEL}",
        f"Found initrd image: /boot/initrd.img-{KERNEL}",
        "done",
    ]
    assert node.read("/var/lib/gpulab-sim/boot/cmdline") == (
        f"BOOT_IMAGE=/boot/vmlinuz-{KERNEL} root=/dev/mapper/pve-root ro quiet iommu=pt\n"
    )


def test_update_initramfs_proxmox_boot_sync(node):
    esp(node)
    node.put("/etc/modprobe.d/vfio.conf", "options vfio-pci ids=10de:2204,10de:1aef\n")
    node.put("/etc/modules", "vfio_pci\n")
    out = node("update-initramfs", "-u", "-k", "all")
    assert out.returncode == 0
    # the post-update hook proxmox-boot-sync refreshes through the zz-proxmox-boot hook only
    assert out.stdout == (
        f"update-initramfs: Generating /boot/initrd.img-{KERNEL}\n"
        "Running hook script 'zz-proxmox-boot'..\n"
        "Re-executing '/etc/kernel/postinst.d/zz-proxmox-boot' in new private mount namespace..\n"
    )
    assert node.read("/var/lib/gpulab-sim/initramfs/modprobe.d/vfio.conf").startswith("options vfio-pci")
    assert node.read("/var/lib/gpulab-sim/initramfs/modules") == "vfio_pci\n"
    # called from a kernel's installation, the hook leaves the ESPs to the kernel hooks
    hooked = node("update-initramfs", "-u", env={"INITRAMFS_TOOLS_KERNEL_HOOK": "1"})
    assert hooked.stdout == f"update-initramfs: Generating /boot/initrd.img-{KERNEL}\n"
    # a guest (no node.json, no proxmox-kernel-helper) has no such hook
    (node.root / "etc/gpulab-sim/node.json").unlink()
    guest = node("update-initramfs", "-u")
    assert guest.returncode == 0 and guest.stdout.startswith("update-initramfs: Generating /boot/initrd.img-")
    assert len(guest.stdout.splitlines()) == 1 and guest.stderr == ""
    usage = node("update-initramfs")
    assert usage.returncode == 1
    assert usage.stderr == "Usage: update-initramfs {-c|-d|-u} [-k version] [-v] [-b directory]\n"


def test_shutdown_scheduled(node):
    before = time.time()
    out = node("shutdown", "-r", "+5")
    assert out.returncode == 0
    assert out.stderr.startswith("Reboot scheduled for ") and out.stderr.endswith(
        ", use 'shutdown -c' to cancel.\n"
    )
    stamp = out.stderr.removeprefix("Reboot scheduled for ").split(",")[0]
    when = time.mktime(time.strptime(stamp.rsplit(" ", 1)[0], "%a %Y-%m-%d %H:%M:%S"))
    assert before + 299 <= when <= time.time() + 301
    assert (node.root / "run/gpulab/reboot").exists()
    now = node("shutdown", "-h", "now")
    assert now.returncode == 0 and now.stderr == "" and (node.root / "run/gpulab/poweroff").exists()


def test_qm_list(node):
    node.put(
        "/var/lib/gpulab-sim/pve/vms.json",
        json.dumps(
            {
                "102": {"name": "vm-gpu", "status": "stopped", "mem_mb": 16384, "bootdisk_gb": 200, "pid": 7},
                "100": {"name": "vm-1", "status": "running", "mem_mb": 4096, "bootdisk_gb": 60, "pid": 4242},
            }
        ),
    )
    out = node("qm", "list")
    assert out.returncode == 0
    # qemu-server's qm list: printf "%10s %-20s %-10s %-10s %12s %-10s" for the head, "%12.2f" for the disk
    assert out.stdout.splitlines() == [
        "      VMID NAME                 STATUS     MEM(MB)    BOOTDISK(GB) PID       ",
        "       100 vm-1                 running    4096              60.00 4242      ",
        "       102 vm-gpu               stopped    16384            200.00 0         ",
    ]
    node.put("/var/lib/gpulab-sim/pve/vms.json", "{}")
    assert node("qm", "list").stdout == ""  # no VM: nothing at all, not even the head


def test_mokutil_sb_state(node):
    no_efi = node("mokutil", "--sb-state")
    assert no_efi.returncode == 1 and no_efi.stderr == "EFI variables are not supported on this system\n"
    node.put("/etc/gpulab-sim/firmware.json", json.dumps({"efi": True, "secure_boot": False}))
    assert node("mokutil", "--sb-state").stdout == "SecureBoot disabled\n"
    node.put("/etc/gpulab-sim/firmware.json", json.dumps({"efi": True, "secure_boot": True}))
    assert node("mokutil", "--sb-state").stdout == "SecureBoot enabled\n"

"""The disk tool stand-ins (labsim.net.disk_standins) against the upstream tools of Ubuntu 24.04: one test per
behaviour listed in library/labsim/UPSTREAM.md (## disk tools), named after its id.

The guest disk is the one the Ubuntu installer leaves on a 60 GiB BIOS VM (GPT: BIOS boot, /boot, the LVM PV);
a test that needs room to grow makes the disk bigger, as a resize through the PVE API does.
"""

from __future__ import annotations

import json

import pytest

from unit.labsim.guest_disk import GIB, guest_disk

SECTORS = 60 * GIB // 512


@pytest.fixture
def disk(tmp_path):
    """run(cmd, *args) runs a disk stand-in on a freshly installed 60 GiB disk; run.grow(gib) resizes the disk."""
    return guest_disk(tmp_path)


def part3(layout):
    return next(p for p in layout["partitions"] if p["number"] == 3)


# --- growpart (cloud-utils 0.33 bin/growpart) ---------------------------------------------------------------


def test_growpart_nochange_fudge(disk):
    # the installer aligns the PV's partition to 1 MiB: less than growpart's fudge is left behind it
    start, size = part3(disk.layout())["start"], part3(disk.layout())["sectors"]
    room = SECTORS - 33 - start - size
    assert 0 < room < 2048
    grow = disk("growpart", "/dev/sda", "3")
    assert grow.returncode == 1
    assert grow.stdout == f"NOCHANGE: partition 3 could only be grown by {room} [fudge=2048]\n"


def test_growpart_nochange_full(disk):
    disk.grow(80)
    assert disk("growpart", "/dev/sda", "3").returncode == 0
    again = disk("growpart", "/dev/sda", "3")
    size = part3(disk.layout())["sectors"]
    assert (
        again.returncode == 1
        and again.stdout == f"NOCHANGE: partition 3 is size {size}. it cannot be grown\n"
    )
    # a partition with another one right behind it cannot grow either
    assert disk("growpart", "/dev/sda", "2").stdout.startswith("NOCHANGE: partition 2 is size 4194304.")


def test_growpart_changed(disk):
    disk.grow(80)
    p = part3(disk.layout())
    grow = disk("growpart", "/dev/sda", "3")
    total = 80 * GIB // 512
    new = total - 33 - p["start"]  # up to the last sector before the backup GPT (total - 34)
    assert grow.returncode == 0, grow.stderr
    assert grow.stdout == (
        f"CHANGED: partition=3 start={p['start']} old: size={p['sectors']} end={p['start'] + p['sectors'] - 1} "
        f"new: size={new} end={total - 34}\n"
    )
    assert part3(disk.layout())["sectors"] == new


def test_growpart_dry_run(disk):
    disk.grow(80)
    before = disk.layout()
    grow = disk("growpart", "--dry-run", "/dev/sda", "3")
    assert grow.returncode == 0 and grow.stdout.startswith("CHANGE: partition=3 ")
    assert disk.layout() == before


def test_growpart_lvm_pv(disk):
    disk.grow(80)
    assert disk("growpart", "/dev/sda", "3").returncode == 0
    # growpart resized the PV of the partition it grew: the volume group has the new room already
    layout = disk.layout()
    assert layout["pv"]["bytes"] == part3(layout)["sectors"] * 512
    vg_free = disk("vgs", "--noheadings", "--nosuffix", "--units", "g", "-o", "vg_free").stdout.strip()
    assert vg_free == "49.00"
    # a dry run resizes nothing
    disk.grow(90)
    disk("growpart", "-N", "/dev/sda", "3")
    assert disk.layout()["pv"]["bytes"] == layout["pv"]["bytes"]


def test_growpart_no_disk(disk):
    # growpart's failures are echoed on stdout
    grow = disk("growpart", "/dev/sdb", "1")
    assert (grow.returncode, grow.stdout, grow.stderr) == (2, "FAILED: /dev/sdb: does not exist\n", "")
    grow = disk("growpart", "/dev/sda", "5")
    assert (grow.returncode, grow.stdout) == (
        2,
        "FAILED: failed to get start and end for /dev/sda5 in /dev/sda\n",
    )
    grow = disk("growpart", "/dev/sda", "x")
    assert (grow.returncode, grow.stdout) == (2, "FAILED: partition-number must be a number\n")


# --- lvm2 2.03.16 -------------------------------------------------------------------------------------------


def test_pvresize_resized(disk):
    out = disk("pvresize", "/dev/sda3")
    assert out.returncode == 0
    assert out.stdout == (
        '  Physical volume "/dev/sda3" changed\n'
        "  1 physical volume(s) resized or updated / 0 physical volume(s) not resized\n"
    )
    test = disk("pvresize", "--test", "/dev/sda3")
    assert test.stderr.startswith("  TEST MODE: Metadata will NOT be updated")


def test_lvextend_changed(disk):
    out = disk("lvextend", "-l", "+100%FREE", "ubuntu-vg/ubuntu-lv")
    assert out.returncode == 0, out.stderr
    assert out.stdout == (
        "  Size of logical volume ubuntu-vg/ubuntu-lv changed from <29.00 GiB (7423 extents) to "
        "<58.00 GiB (14847 extents).\n"
        "  Logical volume ubuntu-vg/ubuntu-lv successfully resized.\n"
    )


def test_lvextend_matches_existing(disk):
    disk("lvextend", "-l", "+100%FREE", "ubuntu-vg/ubuntu-lv")
    again = disk("lvextend", "-l", "+100%FREE", "/dev/ubuntu-vg/ubuntu-lv")
    assert again.returncode == 5
    assert again.stderr == "  New size (14847 extents) matches existing size (14847 extents).\n"


def test_lvextend_resizefs_unchanged(disk):
    disk("lvextend", "-l", "+100%FREE", "-r", "ubuntu-vg/ubuntu-lv")
    # with --resizefs the same size is a zero extension: the filesystem is resized (nothing to do), exit 0
    again = disk("lvextend", "-l", "+100%FREE", "--resizefs", "ubuntu-vg/ubuntu-lv")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(
        "  Size of logical volume ubuntu-vg/ubuntu-lv unchanged from <58.00 GiB (14847 extents).\n"
        "  Logical volume ubuntu-vg/ubuntu-lv successfully resized.\n"
    )
    assert "Nothing to do!" in again.stderr


def test_lvextend_insufficient_space(disk):
    out = disk("lvextend", "-L", "+1T", "ubuntu-vg/ubuntu-lv")
    assert out.returncode == 5
    assert out.stderr == "  Insufficient free space: 262144 extents needed, but only 7424 available\n"


def test_lvextend_percent_free_absolute(disk):
    # without '+' a share of the free extents is the new size itself: 100%FREE is 7424 extents, one more than now
    out = disk("lvextend", "-l", "100%FREE", "ubuntu-vg/ubuntu-lv")
    assert out.returncode == 0, out.stderr
    assert "changed from <29.00 GiB (7423 extents) to 29.00 GiB (7424 extents)." in out.stdout
    # half of the VG is less than the LV already: lvextend refuses to shrink
    half = disk("lvextend", "-l", "40%VG", "ubuntu-vg/ubuntu-lv")
    assert half.returncode == 5 and "not larger than existing size (7424 extents)" in half.stderr


def test_lvm_report_size_units(disk):
    # sizes rounded for display carry '<' when the shown value is above the real one (libdm dm_size_to_string)
    pvs = disk("pvs", "--noheadings", "-o", "pv_size,pv_free").stdout.split()
    assert pvs == ["<58.00g", "29.00g"]
    exact = disk("lvs", "--noheadings", "--nosuffix", "--units", "b", "-o", "lv_size").stdout.strip()
    assert exact == str(7423 * 4 * 2**20)


# --- e2fsprogs 1.47.0 resize2fs -------------------------------------------------------------------------------


def test_resize2fs_online_grow(disk):
    disk("lvextend", "-l", "+100%FREE", "ubuntu-vg/ubuntu-lv")
    out = disk("resize2fs", "/dev/mapper/ubuntu--vg-ubuntu--lv")
    assert out.returncode == 0
    assert out.stderr == "resize2fs 1.47.0 (5-Feb-2023)\n"
    assert out.stdout == (
        "Filesystem at /dev/mapper/ubuntu--vg-ubuntu--lv is mounted on /; on-line resizing required\n"
        "old_desc_blocks = 4, new_desc_blocks = 8\n"
        "The filesystem on /dev/mapper/ubuntu--vg-ubuntu--lv is now 15203328 (4k) blocks long.\n\n"
    )


def test_resize2fs_nothing_to_do(disk):
    out = disk("resize2fs", "/dev/mapper/ubuntu--vg-ubuntu--lv")
    assert out.returncode == 0 and out.stdout == ""
    assert out.stderr == (
        "resize2fs 1.47.0 (5-Feb-2023)\nThe filesystem is already 7601152 (4k) blocks long.  Nothing to do!\n\n"
    )


# --- util-linux 2.39.3 lsblk ----------------------------------------------------------------------------------


def test_lsblk_json(disk):
    out = disk("lsblk", "-J", "-b", "-o", "NAME,SIZE,RM,TYPE,MOUNTPOINTS")
    (sda,) = json.loads(out.stdout)["blockdevices"]
    # with --bytes SIZE is a JSON number, RM a boolean, MOUNTPOINTS a list ([null] when not mounted)
    assert sda == {**sda, "name": "sda", "size": 60 * GIB, "rm": False, "type": "disk", "mountpoints": [None]}
    lv = sda["children"][2]["children"][0]
    assert (lv["name"], lv["type"], lv["mountpoints"]) == ("ubuntu--vg-ubuntu--lv", "lvm", ["/"])
    assert out.stdout.startswith('{\n   "blockdevices": [')  # libsmartcols indents by three spaces


def test_lsblk_unknown_column(disk):
    out = disk("lsblk", "-o", "NOPE")
    assert out.returncode == 1 and out.stderr == "lsblk: unknown column: NOPE\n"


def test_lsblk_not_a_block_device(disk):
    out = disk("lsblk", "/dev/sdz")
    assert out.returncode == 32 and out.stderr == "lsblk: /dev/sdz: not a block device\n"


def test_findmnt_target(disk):
    # --target finds the filesystem a path is on: the deepest mount point above it
    out = disk("findmnt", "--noheadings", "--output", "SOURCE", "--target", "/")
    assert (out.returncode, out.stdout) == (0, "/dev/mapper/ubuntu--vg-ubuntu--lv\n")
    boot = disk("findmnt", "-n", "-o", "TARGET,SOURCE,FSTYPE", "/boot")
    assert boot.stdout.split() == ["/boot", "/dev/sda2", "ext4"]
    as_json = json.loads(disk("findmnt", "-J", "-b", "-o", "TARGET,SIZE", "--target", "/").stdout)
    assert as_json == {"filesystems": [{"target": "/", "size": 7423 * 4 * 2**20}]}

"""A guest disk for the disk tool stand-ins (labsim.net.disk_standins), shared by their tests
(test_upstream_disk.py, test_homelab_lab.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from labsim.net import disk_standins

GIB = 2**30


def guest_disk(tmp_path, *, sr0=None):
    """run(cmd, *args) runs a disk stand-in on a guest disk as the Ubuntu installer left it (60 GiB, BIOS), with
    `sr0` bytes in the CD drive (None: empty). run.layout() is the disk's layout as the stand-ins saved it,
    run.grow(gib) makes the disk `gib` GiB (as a resize through the PVE API does) with the drive empty."""
    layout, hw = tmp_path / "layout.json", tmp_path / "hw.json"
    layout.write_text(json.dumps(disk_standins.install_layout(60 * GIB, efi=False)))
    hw.write_text(json.dumps({"sda": 60 * GIB, "sr0": sr0}))
    # the stand-ins' call log too: by default /var/log of the machine running the tests, where a later
    # node-host test (tests/lab/host) would read this test's calls as its node's own
    env = {
        **os.environ,
        "GPULAB_DISK_LAYOUT": str(layout),
        "GPULAB_DISK_HW": str(hw),
        "GPULAB_STANDINS_LOG": str(tmp_path / "standins.log"),
    }

    def run(cmd, *args):
        return subprocess.run(
            [sys.executable, disk_standins.__file__, cmd, *args], capture_output=True, text=True, env=env
        )

    run.grow = lambda gib: hw.write_text(json.dumps({"sda": gib * GIB, "sr0": None}))
    run.layout = lambda: json.loads(layout.read_text())
    return run

"""guest_base's root growth (tasks/grow_root.yml) on this machine, against the lab's disk stand-ins (the disk,
partitions and LVM an Ubuntu ISO install leaves: the root LV on half the disk) first on the PATH: the first run
grows the LV, a run after a disk raise grows the partition, the PV and the LV, each dry run changes nothing,
and a run with nothing to grow changes nothing. The root tests prove the same on the lab's guests."""

import json
import os
import sys

import pytest

from lab.k3s.test_roles_local import FakeK3sFolder
from labsim.net import disk_standins

pytestmark = pytest.mark.slow

GIB = 2**30
TOOLS = ("lsblk", "findmnt", "lvs", "pvs", "growpart", "pvresize", "lvextend")
GROW = {"Grow the partition": "growpart", "Grow the root's physical volume": "pvresize",
        "Grow the root logical volume": "lvextend"}  # fmt: skip


@pytest.fixture
def guest(tmp_path, monkeypatch):
    lab = FakeK3sFolder(tmp_path)
    layout, hw = tmp_path / "layout.json", tmp_path / "hw.json"
    layout.write_text(json.dumps(disk_standins.install_layout(60 * GIB, efi=False)))
    hw.write_text(json.dumps({"sda": 60 * GIB, "sr0": 3213064192}))
    for tool in TOOLS:
        script = lab.root / "bin" / tool
        script.write_text(f'#!/bin/sh\nexec {sys.executable} {disk_standins.__file__} {tool} "$@"\n')
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{lab.root / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("GPULAB_DISK_LAYOUT", str(layout))
    monkeypatch.setenv("GPULAB_DISK_HW", str(hw))
    # the stand-ins' own log, not this machine's /var/log (a lab host laid over it would inherit it)
    monkeypatch.setenv("GPULAB_STANDINS_LOG", str(tmp_path / "standins.log"))
    lab.layout, lab.hw = layout, hw
    return lab


def grow(lab, check=False):
    """Run grow_root.yml on the guest; {tool: changed} for the three steps that ran."""
    task = {"name": "grow", "ansible.builtin.include_role": {"name": "guest_base", "tasks_from": "grow_root"}}
    rc, out = lab.play([task], check=check, extra_vars={"guest_base_grow_min_free_mib": 1024})
    assert rc == 0, lab.failures(out)
    ran = {}
    for entry in out["plays"][0]["tasks"]:
        result = entry["hosts"].get("vm-1", {})
        for prefix, tool in GROW.items():
            # "guest_base : <task>": the play includes the role by its short name (ansible.cfg's roles_path)
            if entry["task"].removeprefix("guest_base : ").startswith(prefix) and not result.get("skipped"):
                ran[tool] = bool(result.get("changed"))
    return ran


def sizes(lab):
    layout = json.loads(lab.layout.read_text())
    return disk_standins.free_extents(layout), layout["lvs"][0]["extents"]


def test_the_root_lv_grows_to_the_disk_and_after_a_raise_the_partition_and_pv_too(guest):
    fresh = sizes(guest)
    assert fresh[0] > 0  # the installer left half the volume group free

    # dry run: lvextend --test says it would grow, nothing changes
    assert grow(guest, check=True) == {"growpart": False, "lvextend": True}
    assert sizes(guest) == fresh
    # first run: the LV takes the free half; the partition already ends at the disk's end
    assert grow(guest) == {"growpart": False, "lvextend": True}
    free, extents = sizes(guest)
    assert free == 0 and extents > fresh[1]
    assert grow(guest) == {"growpart": False}  # nothing to grow

    # vm_disk_gb raised by 20 GB (PVE grew the disk only): partition, PV and LV, in that order
    guest.hw.write_text(json.dumps({"sda": 80 * GIB, "sr0": 3213064192}))
    assert grow(guest, check=True) == {"growpart": True, "pvresize": True}
    assert sizes(guest) == (0, extents)
    assert grow(guest) == {"growpart": True, "pvresize": True, "lvextend": True}
    free, raised = sizes(guest)
    assert free == 0 and (raised - extents) * 4 * 2**20 >= 19.9 * GIB
    assert grow(guest) == {"growpart": False}

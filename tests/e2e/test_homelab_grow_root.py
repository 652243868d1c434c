"""The ISO path on the user's own lab (fixture homelab, inventory/homelab-lab): the installer left the root LV on
half the disk; stage guests grows it to the whole disk on the first run. After a later vm_disk_gb raise, stage vms
grows the disk (PVE grows only the disk) and stage guests grows the partition (growpart), the physical volume
(pvresize) and the LV with its filesystem (lvextend -r); a run after that changes nothing. Read with lvs/pvs/lsblk:
the lab's simulated disk is not what df or ansible_mounts see."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .helpers import (
    REPO,
    VENV_BIN,
    RunningLab,
    playbook_env,
    run_playbook,
    set_vars,
)

pytestmark = [pytest.mark.root, pytest.mark.slow]

HOMELAB_LAB = REPO / "inventory" / "homelab-lab"
MIB = 1024 * 1024


def _root_lvm(lab: RunningLab, inventory: Path, host: str) -> dict[str, float]:
    """The root LV's size and its VG's free space, its PV's size and device size, and the disk's size (MiB)."""
    script = (
        "src=$(findmnt --noheadings --output SOURCE --target /); "
        'lvs --noheadings --nosuffix --units m --separator , --options lv_size,vg_free "$src"; '
        "pv=$(pvs --noheadings --options pv_name | tr -d ' '); "
        'pvs --noheadings --nosuffix --units m --separator , --options pv_size,dev_size "$pv"; '
        'lsblk --noheadings --nodeps --bytes --output SIZE "$(echo "$pv" | sed "s/[0-9]*$//")"'
    )
    proc = subprocess.run(
        [
            str(VENV_BIN / "ansible"),
            "-i",
            str(inventory),
            host,
            "-b",
            "-m",
            "ansible.builtin.shell",
            "-a",
            script,
        ],
        cwd=REPO,
        env=playbook_env(lab),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line.strip() for line in proc.stdout.splitlines()[1:] if line.strip()]
    lv_size, vg_free = (float(x) for x in lines[0].split(","))
    pv_size, dev_size = (float(x) for x in lines[1].split(","))
    return {
        "lv": lv_size,
        "vg_free": vg_free,
        "pv": pv_size,
        "dev": dev_size,
        "disk": int(lines[2]) / MIB,
    }


def _changed(out: str, task: str, host: str) -> bool:
    """Whether TASK reported `changed` for HOST in a run's output."""
    block = out.split(f"TASK [gpulab.homelab.guest_base : {task}", 1)
    assert len(block) == 2, f"no task {task!r} in the run"
    return re.search(rf"^changed: \[{re.escape(host)}\]", block[1].split("\nTASK [", 1)[0], re.M) is not None


def test_the_root_lv_fills_the_disk_and_follows_a_later_disk_raise(
    homelab: RunningLab, tmp_path: Path
) -> None:
    inventory = tmp_path / "homelab-lab"
    shutil.copytree(HOMELAB_LAB, inventory)

    # First run: stage host blacklists the card's drivers but may not reboot (vm-gpu waits for that reboot:
    # held, skipped), stage vms starts the other adopted VMs, stage guests grows the root LV into the half of
    # the disk the installer left free.
    stages = ("--tags", "host,vms,guests", "-e", "pve_host_reboot_allowed=false")
    first = run_playbook(homelab, inventory, *stages, timeout=900)
    out = first.stdout + first.stderr
    assert first.returncode == 0, out[-6000:]
    assert _changed(out, "Grow the root logical volume and its filesystem", "vm-2")
    assert not _changed(out, "Grow the partition of the root's physical volume", "vm-2")
    grown = _root_lvm(homelab, inventory, "vm-2")
    assert grown["vg_free"] < 1024 and grown["dev"] - grown["pv"] < 1024, grown
    assert 60 * 1024 - 3 * 1024 < grown["lv"] <= grown["pv"], grown

    # vm_disk_gb raised by 20 GB: stage vms grows the disk, stage guests the partition, the PV and the LV.
    set_vars(inventory, "vm-2", {"vm_disk_gb": 80})
    raised = run_playbook(homelab, inventory, *stages, timeout=900)
    out = raised.stdout + raised.stderr
    assert raised.returncode == 0, out[-6000:]
    for task in (
        "Grow the partition of the root's physical volume",
        "Grow the root's physical volume into its partition",
        "Grow the root logical volume and its filesystem",
    ):
        assert _changed(out, task, "vm-2"), task
    after = _root_lvm(homelab, inventory, "vm-2")
    assert abs(after["disk"] - 80 * 1024) < 1, after
    assert after["vg_free"] < 1024 and after["dev"] - after["pv"] < 1024, after
    assert after["lv"] - grown["lv"] > 19 * 1024, (grown, after)
    # vm-1 kept its disk and its grown LV
    assert _root_lvm(homelab, inventory, "vm-1")["disk"] == pytest.approx(60 * 1024, abs=1)

    # And again: nothing to grow, nothing changed.
    again = run_playbook(homelab, inventory, *stages, timeout=600)
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-6000:]
    recap = {m[0]: int(m[1]) for m in re.findall(r"^(vm-\S+)\s+:\s+ok=\d+\s+changed=(\d+)", out, re.M)}
    assert recap.get("vm-1") == 0 and recap.get("vm-2") == 0, out[-4000:]

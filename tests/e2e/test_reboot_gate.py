"""The reboot gate: while the node still needs the reboot stage host may not do, no GPU VM starts (a host
driver may still hold its card); the run says so, goes on with the VMs that need no card, and the later
stages skip the held VM. With stage host left out of a run, preflight reads the node itself and stops the run
before any write while a host driver still binds the card. Once the node has rebooted and vfio-pci owns
every function, the GPU VM starts."""

from __future__ import annotations

import pytest

from .helpers import DEMO, RunningLab, api, run_playbook

pytestmark = [pytest.mark.root, pytest.mark.slow]


def _status(lab: RunningLab) -> dict[str, str]:
    return {r["name"]: r["status"] for r in api(lab, "GET", "/cluster/resources", type="vm")}


def test_no_gpu_vm_starts_while_the_node_waits_for_its_reboot(lab: RunningLab) -> None:
    held = run_playbook(
        lab, DEMO, "--tags", "host,vms,network,guests", "-e", "pve_host_reboot_allowed=false", timeout=500
    )
    out = held.stdout + held.stderr
    assert held.returncode == 0, out[-4000:]
    assert _status(lab) == {"vm-1": "running", "vm-2": "running", "vm-gpu": "stopped"}
    assert "vm-gpu: VM 102 on pve, stopped" in out and "NOT STARTED: its node still needs a reboot" in out
    # stage guests went on with the VMs that need no card, and skipped the held one
    guests = out.split("PLAY [Guests", 1)[1].split("\nPLAY [", 1)[0]
    assert "[vm-1]" in guests and "[vm-gpu]" not in guests

    # stage vms alone: preflight reads the node, finds the card not yet on vfio-pci and stops the run before
    # any write, naming the node, the field, what holds the card and the fix (stage host is not in this run)
    before = len(lab.requests())
    alone = run_playbook(lab, DEMO, "--tags", "vms", timeout=300)
    out = alone.stdout + alone.stderr
    assert alone.returncode != 0, out[-4000:]
    assert "host pve, field pve_gpus (the cards of vm-gpu)" in out, out[-4000:]
    assert "is bound to nouveau, not vfio-pci" in out and "run stage host first" in out, out[-4000:]
    assert "PLAY [Stage" not in out and lab.writes(before) == []
    assert _status(lab)["vm-gpu"] == "stopped"

    # the node reboots (allowed now, the plain VMs running through it); the GPU VM starts after the proof
    freed = run_playbook(
        lab, DEMO, "--tags", "host,vms", "-e", "pve_host_reboot_with_running_vms=true", timeout=500
    )
    out = freed.stdout + freed.stderr
    assert freed.returncode == 0, out[-4000:]
    assert _status(lab)["vm-gpu"] == "running"
    assert "NOT STARTED" not in out

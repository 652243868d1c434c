"""Stage host on a fresh lab node with reboots allowed: the node's reboot kills every process of the host,
sshd and Ansible's connection included (as a real reboot does); the run reconnects, verifies the node after
the reboot and completes. A second run finds nothing to do and does not reboot again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .helpers import DEMO, RunningLab, run_playbook

pytestmark = [pytest.mark.root, pytest.mark.slow]


def _reboots(lab: RunningLab) -> list[dict]:
    log = Path(lab.info["node_host"]["standins_log"])
    if not log.exists():
        return []
    calls = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [
        c for c in calls if c["command"] == "reboot" or (c["command"] == "shutdown" and "-r" in c["argv"])
    ]


def test_reboot_drops_ssh_and_the_run_completes(lab: RunningLab) -> None:
    assert _reboots(lab) == []
    proc = run_playbook(lab, DEMO, "--tags", "host", timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert len(_reboots(lab)) == 1
    # The reboot task ran, and the node was read and verified again after it.
    assert "TASK [gpulab.homelab.pve_host : Reboot the node to apply the GPU passthrough settings]" in out
    after = out.split(
        "TASK [gpulab.homelab.pve_host : Reboot the node to apply the GPU passthrough settings]", 1
    )[1]
    assert "TASK [gpulab.homelab.pve_host : Read the node again after the reboot]" in after
    assert "failed=0" in out.split("PLAY RECAP", 1)[1]
    # The demo has one k3s server (SQLite, no etcd): stage host does not wait for etcd after the reboot, and says why.
    assert "Not waiting for etcd after stage host on pve: 1 k3s server(s): no embedded etcd" in after
    assert "Wait until etcd has every k3s server" not in out

    again = run_playbook(lab, DEMO, "--tags", "host", timeout=400)
    out2 = again.stdout + again.stderr
    assert again.returncode == 0, out2[-4000:]
    recap = out2.split("PLAY RECAP", 1)[1]
    assert "changed=0" in next(line for line in recap.splitlines() if line.startswith("pve "))
    assert len(_reboots(lab)) == 1

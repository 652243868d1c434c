"""Stage host on a fresh lab node, and the node's network goes away while it reboots (the SSH connection
drops and cannot come back): the reboot task gives up after its timeout with a clear message. Once the
network is back, a second run verifies the rebooted node and completes without another reboot."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

from .helpers import DEMO, Lab, run_playbook

pytestmark = [pytest.mark.root, pytest.mark.slow]

REBOOT_TIMEOUT_S = 15


def _reboots(lab: Lab) -> int:
    log = Path(lab.info["node_host"]["standins_log"])
    if not log.exists():
        return 0
    calls = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return sum(
        1 for c in calls if c["command"] == "reboot" or (c["command"] == "shutdown" and "-r" in c["argv"])
    )


def _bridge_port(lab: Lab) -> str:
    """The lab bridge's port towards the node (the host end of the node's veth): the node's own boot
    cannot bring it back up."""
    ns = lab.info["node_host"]["netns"]
    [inner] = json.loads(
        subprocess.run(
            ["ip", "-n", ns, "-j", "link", "show", "vmbr0"], capture_output=True, text=True, check=True
        ).stdout
    )
    links = json.loads(
        subprocess.run(["ip", "-j", "link"], capture_output=True, text=True, check=True).stdout
    )
    [port] = [link["ifname"] for link in links if link["ifindex"] == inner["link_index"]]
    return port


def _node_link(port: str, state: str) -> None:
    subprocess.run(["ip", "link", "set", "dev", port, state], check=True)


def _ssh_args(lab: Lab) -> str:
    # Without keep-alives a connection whose peer vanished (no reset) hangs far past reboot_timeout.
    return (
        f"-o UserKnownHostsFile={lab.info['ssh_known_hosts']} -o StrictHostKeyChecking=accept-new "
        "-o ServerAliveInterval=3 -o ServerAliveCountMax=2"
    )


def test_network_lost_during_reboot_then_second_run(lab: Lab) -> None:
    assert _reboots(lab) == 0
    port = _bridge_port(lab)
    stop = threading.Event()
    cut = threading.Event()

    def cut_when_rebooting() -> None:
        while not stop.is_set():
            if _reboots(lab):
                _node_link(port, "down")
                cut.set()
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=cut_when_rebooting, daemon=True)
    watcher.start()
    try:
        proc = run_playbook(
            lab,
            DEMO,
            "--tags",
            "host",
            "-e",
            f"pve_host_reboot_timeout={REBOOT_TIMEOUT_S}",
            "-e",
            json.dumps({"ansible_ssh_common_args": _ssh_args(lab)}),
            timeout=200,
        )
    finally:
        stop.set()
        watcher.join(timeout=5)
        _node_link(port, "up")
    out = proc.stdout + proc.stderr
    assert cut.is_set(), out[-3000:]
    assert proc.returncode == 2, out[-3000:]
    fatal = [line for line in out.splitlines() if line.startswith("fatal: [pve]")]
    assert fatal, out[-3000:]
    msg = json.loads(fatal[0].split("=> ", 1)[1])["msg"]
    assert "timed out" in msg.lower() or "timeout" in msg.lower(), msg
    assert "Reboot the node" in out.split(fatal[0], 1)[0].rsplit("TASK [", 1)[1]

    again = run_playbook(lab, DEMO, "--tags", "host", timeout=400)
    out2 = again.stdout + again.stderr
    assert again.returncode == 0, out2[-4000:]
    assert _reboots(lab) == 1
    recap = out2.split("PLAY RECAP", 1)[1]
    assert "failed=0" in next(line for line in recap.splitlines() if line.startswith("pve "))

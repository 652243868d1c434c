"""Stage host on a fresh lab node, and the node's network goes away while it reboots (the SSH connection
drops and cannot come back): the reboot task gives up after its timeout with a clear message. Once the
network is back, a second run verifies the rebooted node and completes without another reboot.

The network must be gone before the node is back up, or the run would reach the rebooted node and pass. A
watcher outside the node cannot win that race for sure (the lab node reboots in about a second, and Ansible
asks again one to three seconds later), so the node's init is paused for the run: the reboot is asked for,
the watcher sees it and cuts the node's link, and only then does the init go on and reboot the node."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from .helpers import DEMO, RunningLab, run_playbook

pytestmark = [pytest.mark.root, pytest.mark.slow]

REBOOT_TIMEOUT_S = 15


def _reboots(lab: RunningLab) -> int:
    log = Path(lab.info["node_host"]["standins_log"])
    if not log.exists():
        return 0
    # Whole lines only: the watcher may read while a stand-in appends.
    lines = log.read_text().split("\n")[:-1]
    calls = [json.loads(line) for line in lines if line.strip()]
    return sum(
        1 for c in calls if c["command"] == "reboot" or (c["command"] == "shutdown" and "-r" in c["argv"])
    )


def _bridge_port(lab: RunningLab) -> str:
    """The lab bridge's port towards the node (the host end of the node's veth): the node's own boot
    cannot bring it back up."""
    ns = lab.info["node_host"]["netns"]
    # vmbr0 is a bridge in the node; its port eno1 is the node's end of the veth
    [inner] = [
        link
        for link in json.loads(
            subprocess.run(["ip", "-n", ns, "-j", "link"], capture_output=True, text=True, check=True).stdout
        )
        if link.get("master") == "vmbr0" and "link_index" in link
    ]
    links = json.loads(
        subprocess.run(["ip", "-j", "link"], capture_output=True, text=True, check=True).stdout
    )
    [port] = [link["ifname"] for link in links if link["ifindex"] == inner["link_index"]]
    return port


def _node_link(port: str, state: str) -> None:
    subprocess.run(["ip", "link", "set", "dev", port, state], check=True)


def _node_init(lab: RunningLab) -> int:
    """The pid (as this machine sees it) of the node's init: PID 1 of the node's own pid namespace."""
    ns = lab.info["node_host"]["netns"]
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=True).stdout
    found = []
    for pid in pids.split():
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        nspid = next(line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:"))
        if nspid[-1] == "1" and b"hostinit.py" in cmdline:
            found.append(int(pid))
    assert len(found) == 1, f"the node's init in {ns}: {found}"
    return found[0]


def _ssh_args(lab: RunningLab) -> str:
    # Without keep-alives a connection whose peer vanished (no reset) hangs far past reboot_timeout.
    return (
        f"-o UserKnownHostsFile={lab.info['ssh_known_hosts']} -o StrictHostKeyChecking=accept-new "
        "-o ServerAliveInterval=3 -o ServerAliveCountMax=2"
    )


def test_network_lost_during_reboot_then_second_run(lab: RunningLab) -> None:
    assert _reboots(lab) == 0
    port = _bridge_port(lab)
    init = _node_init(lab)
    stop = threading.Event()
    cut = threading.Event()

    def cut_when_rebooting() -> None:
        while not stop.is_set():
            if _reboots(lab):
                _node_link(port, "down")
                cut.set()
                os.kill(init, signal.SIGCONT)  # the node reboots now, without its network
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=cut_when_rebooting, daemon=True)
    os.kill(init, signal.SIGSTOP)
    try:
        watcher.start()
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
        os.kill(init, signal.SIGCONT)
        _node_link(port, "up")
    out = proc.stdout + proc.stderr
    assert cut.is_set(), out[-3000:]
    assert proc.returncode == 2, out[-3000:]
    assert _reboots(lab) == 1
    fatal = [line for line in out.splitlines() if line.startswith("fatal: [pve]")]
    assert fatal, out[-3000:]
    result = json.loads(fatal[0].split("=> ", 1)[1])
    msg = result["msg"]
    assert "timed out" in msg.lower() or "timeout" in msg.lower(), msg
    assert f"timeout={REBOOT_TIMEOUT_S}" in msg, msg
    assert result.get("rebooted") is True, result
    assert "Reboot the node" in out.split(fatal[0], 1)[0].rsplit("TASK [", 1)[1]

    again = run_playbook(lab, DEMO, "--tags", "host", timeout=400)
    out2 = again.stdout + again.stderr
    assert again.returncode == 0, out2[-4000:]
    assert _reboots(lab) == 1
    # The second run verified the rebooted node (nothing pending, vfio-pci on the GPU) and changed nothing.
    assert "TASK [gpulab.homelab.pve_host : Verify the node (nothing is pending)]" in out2
    assert "TASK [gpulab.homelab.pve_host : Verify every GPU function is on vfio-pci" in out2
    recap = out2.split("PLAY RECAP", 1)[1]
    pve_recap = next(line for line in recap.splitlines() if line.startswith("pve "))
    assert "failed=0" in pve_recap and "changed=0" in pve_recap, pve_recap

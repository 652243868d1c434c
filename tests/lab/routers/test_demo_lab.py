"""Acceptance in the simulated lab: `playbooks/network.yml -i inventory/demo` against the lab's real
router host (sshd + dnsmasq in its own namespace), then a DHCP client with a VM's MAC gets its address.

The VMs' MACs come from an extra inventory layer here (stage vms records them as facts in a full run),
and the addresses are the planned ones, since no VM has booted to hold a lease.
"""

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from simlab import running_lab
from unit.routers.conftest import CLIENT_SCRIPT
from unit.routers.resolved import router_extra_vars

pytestmark = [pytest.mark.root, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
MACS = {"vm-1": "BC:24:11:4D:00:01", "vm-2": "BC:24:11:4D:00:02", "vm-gpu": "BC:24:11:4D:00:03"}


@pytest.fixture
def demo_lab():
    def dnsmasq_router(desc):
        return desc.get("router", {}).get("server") == "dnsmasq"

    with running_lab(
        "gt4lab", ("dnsmasq", "sshd", "dhclient"), dnsmasq_router, "with a dnsmasq router host"
    ) as lab:
        yield lab


def play(state: Path, extra_inv: Path, *args):
    env = dict(
        os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), GPULAB_LAB_STATE=str(state), ANSIBLE_NOCOLOR="1"
    )
    resolved = router_extra_vars(
        [ROOT / "inventory/demo", extra_inv],
        extra_inv.parent,
        {"GPULAB_LAB_STATE": str(state)},
        router_dhcp_reservation_mode="planned",
    )
    cmd = [str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(ROOT / "inventory/demo"), "-i", str(extra_inv),
           str(ROOT / "playbooks/network.yml"), "-e", "router_dhcp_reservation_mode=planned", *resolved, *args]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300, check=False)
    out = proc.stdout + proc.stderr
    recap = re.search(r"localhost\s*:\s*ok=\d+\s+changed=(\d+)", out)
    assert recap, out
    return proc.returncode, int(recap.group(1)), out


def test_network_stage_in_the_demo_lab(demo_lab, tmp_path):
    state, desc = demo_lab
    prefix = desc["subnet"].split("/")[0].rsplit(".", 1)[0]
    extra = tmp_path / "macs.yml"
    extra.write_text(
        yaml.safe_dump({"all": {"children": {"vms": {"hosts": {n: {"vm_mac": m} for n, m in MACS.items()}}}}})
    )
    hosts = Path(desc["router"]["upper_dir"]) / desc["router"]["hosts_file"].lstrip("/")

    rc, changed, out = play(state, extra, "--check", "--diff")
    assert (rc, changed) == (0, 1), out
    assert f"+{MACS['vm-gpu'].lower()} {prefix}.55 vm-gpu" in out
    assert MACS["vm-1"].lower() not in (hosts.read_text() if hosts.exists() else "")

    rc, changed, out = play(state, extra)
    assert (rc, changed) == (0, 1), out
    lines = hosts.read_text().splitlines()
    for n, (name, mac) in enumerate(MACS.items()):
        assert f"{mac.lower()},{prefix}.{53 + n},{name}" in lines

    rc, changed, out = play(state, extra)
    assert (rc, changed) == (0, 0), out

    # a client with vm-1's MAC on the lab bridge is handed vm-1's reserved address
    ns, veth = "gt4demo", "gt4demov"
    client = CLIENT_SCRIPT
    try:
        subprocess.run(["ip", "netns", "add", ns], check=True)
        subprocess.run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns, "address",
                        MACS["vm-1"]], check=True)  # fmt: skip
        subprocess.run(["ip", "link", "set", veth, "master", desc["bridge"], "up"], check=True)
        for cmd in (["ip", "link", "set", "eth0", "up"], ["ethtool", "-K", "eth0", "tx", "off"]):
            subprocess.run(["ip", "netns", "exec", ns, *cmd], check=False, capture_output=True)
        subprocess.run(["ethtool", "-K", veth, "tx", "off"], check=False, capture_output=True)
        subprocess.run(["ip", "netns", "exec", ns, "dhclient", "-4", "-1", "-sf", str(client), "-lf",
                        str(tmp_path / "lease"), "-pf", str(tmp_path / "pid"), "eth0"], timeout=60, check=False)  # fmt: skip
        addr = subprocess.run(["ip", "-n", ns, "-4", "-o", "addr", "show", "dev", "eth0"], capture_output=True,
                              text=True, check=False).stdout  # fmt: skip
        assert f" {prefix}.53/" in addr
    finally:
        if (tmp_path / "pid").exists():
            subprocess.run(["kill", (tmp_path / "pid").read_text().strip()], check=False)
        subprocess.run(["ip", "link", "del", veth], check=False, capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)

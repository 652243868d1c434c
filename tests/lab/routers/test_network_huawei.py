"""Stage network with the reference lab's router kind (Huawei ONT), against its simulator."""

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from unit.routers.resolved import router_extra_vars

from labsim.routers.huawei import HuaweiOntSim

ROOT = Path(__file__).resolve().parents[3]
PW = "Homelab-Ont-Pw-7"
VMS = {"vm-1": ("BC:24:11:00:0B:01", "192.168.100.53"), "vm-2": ("BC:24:11:00:0B:02", "192.168.100.54"),
       "vm-gpu": ("BC:24:11:00:0B:03", "192.168.100.55")}  # fmt: skip


def run_stage(tmp_path, url, *extra):
    router = {"router_kind": "huawei_ont", "router_address": "192.168.100.1", "router_subnet": "192.168.100.0/24",
              "router_dhcp_pool": {"start": "192.168.100.2", "end": "192.168.100.254"}, "router_user": "admin",
              "router_password": PW, "router_url": url}  # fmt: skip
    # the MAC and address come from stage vms' facts here (no vm_mac in the inventory)
    vms = {
        n: {"vm_address": ip, "gpulab_vm_mac": mac, "gpulab_vm_address": ip} for n, (mac, ip) in VMS.items()
    }
    inv = {"all": {"children": {"router": {"hosts": {"isp-router": router}}, "vms": {"hosts": vms}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inv))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    cmd = [str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(tmp_path / "hosts.yml"),
           str(ROOT / "playbooks/network.yml"), *router_extra_vars(tmp_path / "hosts.yml", tmp_path), *extra]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)
    out = proc.stdout + proc.stderr
    recap = re.search(r"localhost\s*:\s*ok=\d+\s+changed=(\d+)", out)
    assert recap, out
    return proc.returncode, int(recap.group(1)), out


@pytest.mark.slow
def test_keep_on_the_huawei_ont_check_then_apply(tmp_path):
    with HuaweiOntSim(password=PW) as sim:
        rc, changed, out = run_stage(tmp_path, sim.url, "--check", "--diff", "-v")
        assert (rc, changed) == (0, 1), out
        assert sim.table() == []
        assert PW not in out
        rc, changed, out = run_stage(tmp_path, sim.url)
        assert (rc, changed) == (0, 1), out
        assert sorted(sim.table()) == sorted((mac.lower(), ip) for mac, ip in VMS.values())
        assert sim.sessions == {}  # every run logged out again

"""New VMs' SSH host keys, with host key checking strict as on a real controller.

The demo inventory connects with StrictHostKeyChecking=yes against the lab's known_hosts for the user
(STATE/net/ssh/user_known_hosts, gpulab_known_hosts_file): at the start it holds the node's and the router's
keys, as a user has them after README step 4, and nothing of the VMs. Stage vms reads each VM it created
through the guest agent (PVE's agent/file-read, over the pinned API) and writes its keys there, so the run
goes on into stage guests in one command. A VM made again gets its line replaced; a VM gpulab did not make
(no gpulab tag) is never trusted silently: stage guests stops with the fix.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from .helpers import DEMO, RunningLab, api, inventory_copy, run_playbook, set_vars, wait_task

STAGES = ("--tags", "host,vms,network,guests")
VMS = {"vm-1": (100, ".53"), "vm-2": (101, ".54"), "vm-gpu": (102, ".55")}


def known(lab: RunningLab) -> list[list[str]]:
    """The user's known_hosts, one [host, type, key, ...] per line."""
    text = Path(lab.info["ssh_user_known_hosts"]).read_text()
    return [line.split() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def host_key(lab: RunningLab, vmid: int) -> list[str]:
    """[type, key] of the VM host's own ed25519 key, the file its sshd serves."""
    pub = lab.state / "net" / "hosts" / f"vm{vmid}" / "upper" / "etc" / "ssh" / "ssh_host_ed25519_key.pub"
    return pub.read_text().split()[:2]


def lines_for(lab: RunningLab, address: str) -> list[list[str]]:
    return [line for line in known(lab) if line[0] == address]


def test_a_fresh_lab_converges_in_one_command_with_strict_host_key_checking(lab: RunningLab) -> None:
    before = known(lab)
    node, router = lab.info["node_host"]["address"], lab.info["router"]["address"]
    assert sorted(line[0] for line in before) == sorted([node, router]), before
    proc = run_playbook(lab, DEMO, *STAGES, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "Host key verification failed" not in out and "answers, but its SSH host key" not in out
    # exactly one line per created VM and key type, for the address Ansible connects to, with the key the
    # VM's sshd serves; the node's and the router's lines as they were
    for _name, (vmid, last) in VMS.items():
        assert [line[1:3] for line in lines_for(lab, lab.prefix + last)] == [host_key(lab, vmid)]
    assert len(known(lab)) == len(before) + len(VMS)
    assert [line for line in known(lab) if line[0] in (node, router)] == before
    # the keys came through the guest agent, over the API
    reads = [r for r in lab.requests() if str(r.get("path", "")).endswith("/agent/file-read")]
    assert {r["path"].split("/")[-3] for r in reads} == {"100", "101", "102"}


def test_a_vm_made_again_gets_its_line_replaced_not_added(lab: RunningLab, tmp_path: Path) -> None:
    vmid, last = VMS["vm-2"]
    node = lab.info["node"]
    old = host_key(lab, vmid)
    count = len(known(lab))
    # made again with its MAC (vm_mac), so that the router's reservation of its address still fits it
    net0 = api(lab, "GET", f"/nodes/{node}/qemu/{vmid}/config")["net0"]
    inventory = inventory_copy(tmp_path / "inventory")
    set_vars(inventory, "vm-2", {"vm_mac": re.search(r"=([0-9A-Fa-f:]{17})", net0).group(1)})
    wait_task(lab, api(lab, "POST", f"/nodes/{node}/qemu/{vmid}/status/stop"))
    wait_task(lab, api(lab, "DELETE", f"/nodes/{node}/qemu/{vmid}"))
    proc = run_playbook(lab, inventory, "--tags", "vms,network,guests", timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    new = host_key(lab, vmid)
    assert new != old  # a new VM, new keys
    assert [line[1:3] for line in lines_for(lab, lab.prefix + last)] == [new]
    assert len(known(lab)) == count


def test_a_vm_gpulab_did_not_make_is_not_trusted_silently(lab: RunningLab) -> None:
    vmid, last = VMS["vm-1"]
    node, address = lab.info["node"], lab.prefix + last
    # vm-1 as a VM the user made: without gpulab's tag, and its key not (yet) recorded by the user
    api(lab, "PUT", f"/nodes/{node}/qemu/{vmid}/config", delete="tags")
    kh = lab.info["ssh_user_known_hosts"]
    subprocess.run(["ssh-keygen", "-R", address, "-f", kh], check=True, capture_output=True)
    # no SSH connection of the earlier runs kept open (ControlPersist): the next one meets the key afresh
    for socket in Path(lab.info["ssh_control_path_dir"]).iterdir():
        socket.unlink()
    proc = run_playbook(lab, DEMO, "--tags", "vms,network,guests", timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-6000:]
    assert lines_for(lab, address) == []  # stage vms wrote nothing for it
    assert f"vm-1 ({address}) answers, but its SSH host key is not in known_hosts" in out, out[-6000:]
    assert f"ssh-keyscan -H {address} >> ~/.ssh/known_hosts" in out

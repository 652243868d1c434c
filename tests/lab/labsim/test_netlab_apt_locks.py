"""Ubuntu's background apt in the lab: every lab VM runs the unattended-upgrades stand-in after each boot, which
holds apt's and dpkg's locks for a while as the real one does. Role guest_base meets it on a fresh VM, waits
for it naming the holder, and passes; held past gpulab_apt_lock_timeout, the run fails naming the process
(unattended-upgr) and its PID. Real apt and dpkg in a lab VM name the stand-in as they name the real one.

Needs root (network namespaces, veth links, mounts); VM hosts boot systemd where the machine allows it, as a
real guest does (apt-daily-upgrade.service starts the stand-in), and the simple init elsewhere.
"""

from __future__ import annotations

import contextlib
import copy
import re
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml
from simlab import lab_ssh
from unit.labsim.conftest import NETWORK_LAB

from labsim import network_lab
from labsim.fixture import load_fixture

ROOT = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")

pytestmark = [*NETWORK_LAB, pytest.mark.slow]


def ssh(facts, address, command, timeout=30):
    return lab_ssh(facts, "ubuntu", address, command, timeout=timeout)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    state = tmp_path_factory.mktemp("netlab-apt")
    fixture = load_fixture()
    facts = network_lab.up(state, fixture)
    yield state, fixture, facts
    network_lab.down(state)


@contextlib.contextmanager
def fresh_vm(lab, vmid: int, hold_s: float | None):
    """A VM just started (as PVE's start hook does) whose unattended-upgrades runs `hold_s` seconds after boot
    (None: the lab's default), and its address; destroyed at exit."""
    state, fixture, facts = lab
    fixture = copy.deepcopy(fixture)
    if hold_s is not None:
        fixture["network"] = {**fixture.get("network", {}), "guest_apt_hold_s": hold_s}
    hooks = network_lab.make_hooks(state, fixture)
    key = Path(facts["ssh_public_key"]).read_text()
    config = {
        "name": f"apt-vm-{vmid}",
        "net0": f"virtio=bc:24:11:00:11:{vmid - 100:02x},bridge=vmbr0,firewall=1",
        "ciuser": "ubuntu",
        "sshkeys": urllib.parse.quote(key, safe=""),
        "ipconfig0": "ip=dhcp",
    }
    hooks.vm_started("pve", vmid, config)
    try:
        [address] = [
            a["ip-address"]
            for iface in hooks.guest_interfaces("pve", vmid, config)
            if iface["name"] == "ens18"
            for a in iface.get("ip-addresses", [])
            if a["ip-address-type"] == "ipv4"
        ]
        yield address
    finally:
        hooks.vm_destroyed("pve", vmid)


def holder_pid(facts, address) -> int:
    """The PID of the unattended-upgr process in the guest (as the guest sees it), once it holds the locks."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        # its three write locks in /proc/locks, under its PID as the guest sees it
        res = ssh(
            facts,
            address,
            'p=$(pgrep -x unattended-upgr) && [ "$(sudo -n grep -c "WRITE *$p " /proc/locks)" -ge 3 ] && echo $p',
        )
        if res.returncode == 0:
            return int(res.stdout)
        time.sleep(0.3)
    raise AssertionError(f"no unattended-upgr holds apt's locks in the guest: {res.stdout}{res.stderr}")


def guest_base(facts, address, tmp_path, *extra: str) -> subprocess.CompletedProcess:
    """Role guest_base on the guest, as stage guests runs it (become, the lab's SSH settings)."""
    book = tmp_path / "guest_base.yml"
    play = {"hosts": "all", "become": True, "gather_facts": False, "roles": ["gpulab.homelab.guest_base"]}
    book.write_text(yaml.safe_dump([play]))
    ssh_args = f"-o UserKnownHostsFile={facts['ssh_known_hosts']} -o StrictHostKeyChecking=yes"
    argv = [
        str(ANSIBLE_PLAYBOOK), "-i", f"{address},", "-u", "ubuntu", "--private-key", facts["ssh_private_key"],
        "-e", f"ansible_ssh_common_args='{ssh_args}'", *extra, str(book),
    ]  # fmt: skip
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin:/usr/sbin:/sbin",
        "HOME": str(tmp_path),
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        # the lab's short folder for SSH control sockets (as inventory/demo's ansible_control_path_dir): under
        # pytest-xdist, HOME's .ansible/cp is too deep for ssh's socket path
        "ANSIBLE_SSH_CONTROL_PATH_DIR": facts["ssh_control_path_dir"],
    }
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False, cwd=ROOT, env=env)


def test_guest_base_on_a_fresh_vm_waits_for_unattended_upgrades_and_names_it(lab, tmp_path):
    *_, facts = lab
    # held well past the apt module's own 60 s from when the role reaches apt: without gpulab's wait (and
    # lock_timeout) the install fails with "Failed to lock apt for exclusive operation"
    with fresh_vm(lab, 181, hold_s=100) as address:
        pid = holder_pid(facts, address)
        started = time.monotonic()
        run = guest_base(facts, address, tmp_path)
        took = time.monotonic() - started
        out = run.stdout + run.stderr
        assert run.returncode == 0, out
        # the wait said at once who holds which lock, and kept saying it
        assert re.search(
            rf"^{re.escape(address)}: .*/var/lib/dpkg/lock-frontend.* held by process {pid} \(unattended-upgr\); "
            r"waiting up to 900 s",
            out,
            re.M,
        ), out
        assert re.search(
            rf"waiting for apt's locks: .*held by process {pid} \(unattended-upgr\): \d+ s of 900 s", out
        )
        assert took > 70  # it did wait for the stand-in to let go
        # the stand-in finished as unattended-upgrade does, then the packages came from the lab's archive
        log = ssh(facts, address, "cat /var/log/unattended-upgrades/unattended-upgrades.log").stdout
        assert "No packages found that can be upgraded unattended" in log
        status = ssh(facts, address, "dpkg-query -W -f '${Status}' qemu-guest-agent").stdout
        assert status == "install ok installed"


def test_guest_base_fails_naming_unattended_upgr_when_the_lock_outlasts_the_timeout(lab, tmp_path):
    *_, facts = lab
    with fresh_vm(lab, 182, hold_s=600) as address:
        pid = holder_pid(facts, address)
        run = guest_base(facts, address, tmp_path, "-e", "gpulab_apt_lock_timeout=8")
        out = run.stdout + run.stderr
        assert run.returncode != 0, out
        assert f"apt's locks on {address} are still held after" in out, out
        assert re.search(rf"held by process {pid} \(unattended-upgr\)\. On Ubuntu", out), out
        assert "raise gpulab_apt_lock_timeout" in out
        # nothing was installed: the run stopped at the wait
        status = ssh(facts, address, "dpkg-query -W -f '${Status}' qemu-guest-agent 2>/dev/null").stdout
        assert status != "install ok installed"


def test_unattended_upgrades_apt_locks(lab):
    """Real apt and dpkg in a lab VM meet the stand-in as they meet Ubuntu's unattended-upgrades: apt-get update
    cannot lock the lists, apt-get install cannot take dpkg's front-end lock, dpkg refuses, each
    naming the process unattended-upgr; after its hold the locks are free and the stand-in has exited."""
    *_, facts = lab
    with fresh_vm(lab, 183, hold_s=30) as address:
        pid = holder_pid(facts, address)
        update = ssh(facts, address, "sudo -n apt-get update -q")
        assert update.returncode == 100
        assert (
            f"E: Could not get lock /var/lib/apt/lists/lock. It is held by process {pid} (unattended-upgr)"
            in update.stderr
        )
        install = ssh(facts, address, "sudo -n apt-get install -y -q qemu-guest-agent")
        assert install.returncode == 100
        assert (
            f"Could not get lock /var/lib/dpkg/lock-frontend. It is held by process {pid} (unattended-upgr)"
            in install.stderr
        )
        dpkg = ssh(facts, address, "sudo -n dpkg --configure -a")
        # dpkg 1.22 names the executable, the Python interpreter of the unattended-upgrade script (as for the real one)
        assert re.search(
            rf"dpkg frontend lock was locked by /usr/bin/python3[.\d]* process with pid {pid}\n", dpkg.stderr
        )
        deadline = time.monotonic() + 60
        while ssh(facts, address, "pgrep -x unattended-upgr").returncode == 0 and time.monotonic() < deadline:
            time.sleep(1)
        assert ssh(facts, address, "sudo -n apt-get update -q").returncode == 0


def test_apt_daily_upgrade_after_boot(lab):
    """The stand-in runs at each boot, as the main process of apt-daily-upgrade.service on a systemd VM, holds the
    locks for the fixture's time, then exits and lets go; a reboot starts it again."""
    *_, facts = lab
    with fresh_vm(lab, 184, hold_s=8) as address:
        first = holder_pid(facts, address)
        if facts["vm_init"] == "systemd":
            unit = ssh(
                facts, address, "systemctl show -p MainPID -p ActiveState apt-daily-upgrade.service"
            ).stdout
            assert sorted(unit.split()) == ["ActiveState=active", f"MainPID={first}"]
        deadline = time.monotonic() + 30
        while ssh(facts, address, "pgrep -x unattended-upgr").returncode == 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert ssh(facts, address, "pgrep -x unattended-upgr").returncode == 1
        assert ssh(facts, address, "sudo -n grep -c WRITE /proc/locks").stdout.strip() == "0"
        # a reboot from inside the guest: unattended-upgrades runs again in the new boot
        boot = ssh(facts, address, "cat /proc/sys/kernel/random/boot_id").stdout
        ssh(facts, address, "sudo -n reboot")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            res = ssh(facts, address, "cat /proc/sys/kernel/random/boot_id", timeout=10)
            if res.returncode == 0 and res.stdout != boot:
                break
            time.sleep(0.5)
        assert res.stdout != boot
        holder_pid(facts, address)
        log = ssh(facts, address, "cat /var/log/unattended-upgrades/unattended-upgrades.log").stdout
        assert log.count("Starting unattended upgrades script") == 2

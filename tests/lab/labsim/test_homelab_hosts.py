"""The user's lab before gpulab ran, on the lab's real hosts (fixtures/homelab.yml, issue 17).

Needs root. One lab (`gpulab lab up --fixture homelab`, short task timings) for the module: the router
holds the seeded leases, the VMs started through the API come up at them as ISO-installed Ubuntu
guests (no cloud-init, sudo with the installer user's password, half the disk on the root LV), a resize
through the API grows the disk and nothing else, and the guest's own tools grow the root for good.
The node's command line as a fixture choice is proven on a second node (homelab-blacklisted).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import requests
from simlab import WAIT_FOR_UNATTENDED_UPGRADES
from unit.labsim.conftest import NETWORK_LAB, InProcessPveSim

from lab.labsim.test_homelab_lab import fast_homelab
from lab.labsim.test_netlab_hosts import ssh
from lab.labsim.test_node_proxy import presented_fingerprint
from labsim import cli, network_lab
from labsim.fixture import load_fixture

ROOT = Path(__file__).resolve().parents[3]
LV = "/dev/mapper/ubuntu--vg-ubuntu--lv"

pytestmark = NETWORK_LAB


@pytest.fixture(scope="module")
def homelab(tmp_path_factory):
    root = tmp_path_factory.mktemp("homelab_hosts")
    fixture = fast_homelab(root / "fixture.yml", network={"vm_init": "simple"})
    state = root / "state"
    desc = cli.up(state, str(fixture))
    api = InProcessPveSim(None, desc, state).root_api()
    yield desc, api
    cli.down(state)


def address(desc, name):
    return desc["seed"]["vms"][name]["address"]


def sudo(desc, host, command, password=None, check=True, timeout=20):
    """``command`` with sudo as the installer's user, the password on sudo's stdin (as Ansible's become does)."""
    pw = desc["seed"]["guest_password"] if password is None else password
    return ssh(desc, "ubuntu", host, f"echo '{pw}' | sudo -S -p '' {command}", check=check, timeout=timeout)


def started(desc, api, vmid, name):
    if api.data("GET", f"/nodes/pve/qemu/{vmid}/status/current")["status"] != "running":
        assert api.run("POST", f"/nodes/pve/qemu/{vmid}/status/start")["exitstatus"] == "OK"
    return address(desc, name)


def test_router_holds_the_seeded_leases_before_any_vm_starts(homelab):
    desc, _api = homelab
    prefix = desc["subnet"].rsplit(".", 1)[0]
    assert {n: v["address"] for n, v in desc["seed"]["vms"].items()} == {
        "vm-1": f"{prefix}.53", "vm-2": f"{prefix}.54", "vm-gpu": f"{prefix}.55"
    }  # fmt: skip
    router = desc["router"]
    leases = (Path(router["upper_dir"]) / router["leases_file"].lstrip("/")).read_text()
    for name, vm in desc["seed"]["vms"].items():
        assert f" {vm['mac']} {vm['address']} {name} " in leases
    out = ssh(desc, "root", router["address"], f"cat {router['leases_file']}").stdout
    assert out.count("bc:24:11:4e:0a:5") == 3


def test_seeded_vms_start_at_their_leased_addresses(homelab):
    desc, api = homelab
    for vmid, name in ((100, "vm-1"), (102, "vm-gpu")):
        ip = started(desc, api, vmid, name)
        out = ssh(desc, "ubuntu", ip, "hostname; cat /sys/class/net/ens18/address").stdout.split()
        assert out == [name, desc["seed"]["vms"][name]["mac"]]
    hosts = network_lab.status(Path(desc["state_dir"]))["vm_hosts"]
    assert hosts["100"]["address"] == address(desc, "vm-1") and hosts["102"]["address"] == address(
        desc, "vm-gpu"
    )


def test_iso_guest_has_no_cloud_init_and_sudo_asks_for_the_password(homelab):
    desc, api = homelab
    ip = started(desc, api, 100, "vm-1")
    assert ssh(desc, "ubuntu", ip, "test ! -e /etc/cloud && ! command -v cloud-init").returncode == 0
    assert "sudo" in ssh(desc, "ubuntu", ip, "id -nG").stdout.split()
    nopass = ssh(desc, "ubuntu", ip, "sudo -n true", check=False)
    assert nopass.returncode == 1 and "a password is required" in nopass.stderr
    wrong = sudo(desc, ip, "true", password="not-the-password", check=False)
    assert wrong.returncode == 1 and "incorrect password" in wrong.stderr
    assert sudo(desc, ip, "id -u").stdout == "0\n"
    # root logs in with no key: the installer locks root; the lab's key is the ubuntu account's
    assert ssh(desc, "root", ip, "true", check=False).returncode == 255


def test_root_lv_holds_half_of_the_installed_disk(homelab):
    desc, api = homelab
    for vmid, name, disk_gb, efi in ((100, "vm-1", 60, False), (102, "vm-gpu", 200, True)):
        ip = started(desc, api, vmid, name)
        assert ssh(desc, "ubuntu", ip, "findmnt --noheadings --output SOURCE --target /").stdout == f"{LV}\n"
        tree = json.loads(ssh(desc, "ubuntu", ip, "lsblk -b -J -o NAME,SIZE,TYPE,MOUNTPOINT").stdout)[
            "blockdevices"
        ]
        sda = tree[0]
        assert sda["size"] == disk_gb * 2**30 and tree[1]["type"] == "rom"  # the ISO is still in the drive
        assert [p["mountpoint"] for p in sda["children"]] == (
            ["/boot/efi", "/boot", None] if efi else [None, "/boot", None]
        )
        vg = sudo(
            desc, ip, "vgs --noheadings --nosuffix --units b -o vg_size,vg_free ubuntu-vg"
        ).stdout.split()
        size, free = int(vg[0]), int(vg[1])
        lv = int(sudo(desc, ip, f"lvs --noheadings --nosuffix --units b -o lv_size {LV}").stdout)
        assert abs(lv - size / 2) <= 4 * 2**20 and lv + free == size


def test_api_resize_grows_the_disk_only_and_the_grown_root_stays_grown(homelab):
    desc, api = homelab
    ip = started(desc, api, 100, "vm-1")
    assert api.run("PUT", "/nodes/pve/qemu/100/resize", disk="scsi0", size="+20G")["exitstatus"] == "OK"
    tree = json.loads(ssh(desc, "ubuntu", ip, "lsblk -b -J -o NAME,SIZE").stdout)["blockdevices"]
    assert tree[0]["size"] == 80 * 2**30 and tree[0]["children"][2]["size"] < 59 * 2**30
    assert sudo(desc, ip, "growpart /dev/sda 3").stdout.startswith("CHANGED: partition=3")
    assert sudo(desc, ip, "pvresize /dev/sda3").returncode == 0
    grown = sudo(desc, ip, "lvextend -r -l +100%FREE ubuntu-vg/ubuntu-lv")
    assert "successfully resized" in grown.stdout and "(4k) blocks long" in grown.stdout
    lv = int(sudo(desc, ip, f"lvs --noheadings --nosuffix --units b -o lv_size {LV}").stdout)
    assert lv > 77 * 2**30
    # stopped and started again through the API: same address, the same grown root
    assert api.run("POST", "/nodes/pve/qemu/100/status/stop")["exitstatus"] == "OK"
    assert api.run("POST", "/nodes/pve/qemu/100/status/start")["exitstatus"] == "OK"
    assert int(sudo(desc, ip, f"lvs --noheadings --nosuffix --units b -o lv_size {LV}").stdout) == lv
    assert "NOCHANGE" in sudo(desc, ip, "growpart /dev/sda 3", check=False).stdout


def test_homelab_lab_inventory_reaches_the_guest_with_its_key_and_become_password(homelab):
    desc, api = homelab
    started(desc, api, 100, "vm-1")
    env = {**os.environ, "GPULAB_LAB_STATE": desc["state_dir"], "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    argv = [str(ROOT / ".venv" / "bin" / "ansible"), "-i", str(ROOT / "inventory" / "homelab-lab"), "vm-1",
            "-b", "-m", "ansible.builtin.command", "-a", "id -u"]  # fmt: skip
    res = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert res.returncode == 0 and res.stdout.strip().endswith("0"), res.stdout + res.stderr
    assert desc["seed"]["guest_password"] not in res.stdout + res.stderr


def test_node_starts_with_the_installers_command_line_and_lists_the_vms(homelab):
    desc, _api = homelab
    out = ssh(desc, "root", desc["node_host"]["address"], "cat /etc/kernel/cmdline /proc/cmdline").stdout
    assert "modprobe.blacklist" not in out and "nomodeset" not in out
    assert network_lab.node_boot_state(Path(desc["state_dir"]))["state"] == "stock"
    rows = [
        line.split()
        for line in ssh(desc, "root", desc["node_host"]["address"], "qm list").stdout.splitlines()
    ]
    assert [r[:2] for r in rows[1:]] == [["100", "vm-1"], ["101", "vm-2"], ["102", "vm-gpu"]]
    assert rows[2][2:5] == ["stopped", "4096", "60.00"]  # vm-2 was never started here


def test_node_with_the_blacklist_already_on_its_command_line(tmp_path):
    state = tmp_path / "state"
    facts = network_lab.up(state, load_fixture("homelab-blacklisted"))
    try:
        node = facts["node_host"]["address"]
        deadline = time.monotonic() + 10
        while network_lab.node_boot_state(state) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        line = ssh(facts, "root", node, "cat /proc/cmdline").stdout
        assert "nomodeset modprobe.blacklist=nova_core,nova_drm,nova,nouveau" in line
        assert network_lab.node_boot_state(state)["state"] == "blacklisted"
        assert (
            ssh(facts, "root", node, "readlink /sys/bus/pci/devices/0000:02:00.0/driver", check=False).stdout
            == ""
        )
    finally:
        network_lab.down(state)


def test_seeded_vms_running_when_the_lab_starts_hold_their_leases(tmp_path):
    fixture = fast_homelab(tmp_path / "f.yml", network={"vm_init": "simple"}, seed={"status": "running"})
    state = tmp_path / "state"
    desc = cli.up(state, str(fixture))
    try:
        deadline = time.monotonic() + 40
        names = {}
        while time.monotonic() < deadline and len(names) < 3:
            time.sleep(0.5)
            for name in desc["seed"]["vms"]:
                res = ssh(desc, "ubuntu", address(desc, name), "hostname", check=False, timeout=5)
                if res.returncode == 0:
                    names[name] = res.stdout.strip()
        assert names == {"vm-1": "vm-1", "vm-2": "vm-2", "vm-gpu": "vm-gpu"}
    finally:
        cli.down(state)


def test_iso_guest_agent_answers_only_once_the_guest_installs_it(homelab):
    desc, api = homelab
    ip = started(desc, api, 100, "vm-1")
    api.data("PUT", "/nodes/pve/qemu/100/config", agent="enabled=1")  # pending until the next start
    assert api.run("POST", "/nodes/pve/qemu/100/status/stop")["exitstatus"] == "OK"
    assert api.run("POST", "/nodes/pve/qemu/100/status/start")["exitstatus"] == "OK"
    time.sleep(0.3)  # the fixture's agent_delay
    r = api.get("/nodes/pve/qemu/100/agent/network-get-interfaces")
    assert r.status_code == 500 and "QEMU guest agent is not running" in r.text
    # a fresh boot: unattended-upgrades holds apt's locks for a while first
    install = "apt-get update -q && apt-get install -y -q qemu-guest-agent"
    sudo(desc, ip, f'sh -c "{WAIT_FOR_UNATTENDED_UPGRADES}; {install}"', timeout=120)
    ifaces = api.data("GET", "/nodes/pve/qemu/100/agent/network-get-interfaces")["result"]
    ens18 = next(i for i in ifaces if i["name"] == "ens18")
    assert ip in [a["ip-address"] for a in ens18["ip-addresses"]]


def test_the_node_s_own_address_serves_the_api_on_8006_with_the_certificate_pvenode_shows(homelab):
    desc, _api = homelab
    node = desc["node_host"]["address"]
    url = desc["node_host"]["pve_api_url"]
    assert url == f"https://{node}:8006"
    shown = json.loads(ssh(desc, "root", node, "pvenode cert info --output-format json").stdout)
    assert presented_fingerprint(url) == shown[0]["fingerprint"] == desc["fingerprint"]
    auth = {"Authorization": f"PVEAPIToken={desc['token_id']}={desc['token_secret']}"}
    mine = requests.get(f"{url}/api2/json/nodes/pve/status", headers=auth, verify=False, timeout=30)
    assert mine.status_code == 200 and mine.json()["data"]["cpuinfo"]["cpus"] == 20, mine.text
    old = requests.get(
        f"{desc['pve_url']}/api2/json/nodes/pve/status", headers=auth, verify=False, timeout=30
    )
    assert old.status_code == 200  # the 127.0.0.1 URL of lab.json keeps working
    # the node's pveproxy is a service of the node host: in its namespace, on the node's address only
    listening = subprocess.run(
        ["ip", "netns", "exec", desc["node_host"]["netns"], "ss", "-Hltn", "sport", "= :8006"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert f"{node}:8006" in listening

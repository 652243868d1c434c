"""The lab's real hosts: namespaces, sshd, real DHCP (dnsmasq and Kea), VM cycles, safety and teardown.

Needs root (network namespaces, veth links, mounts). Each lab lives in its own temporary state
directory with its own ``gl...`` prefix and range, and is taken down at the end.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from simlab import WAIT_FOR_UNATTENDED_UPGRADES, lab_ssh, machine_apt_lists_aged
from unit.labsim.conftest import NETWORK_LAB

from labsim import network_lab
from labsim.fixture import load_fixture
from labsim.net import addressing, guest_kernel

ROOT = Path(__file__).resolve().parents[3]

pytestmark = NETWORK_LAB


def ssh(facts, user, address, command, check=True, timeout=20):
    res = lab_ssh(facts, user, address, command, timeout=timeout)
    if check:
        assert res.returncode == 0, res.stderr
    return res


def lab_objects(lab_id):
    """Namespaces, links, routes and processes on the machine that carry this lab's prefix or range."""
    links = [n for n in os.listdir("/sys/class/net") if n.startswith(lab_id)]
    nss = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return links, [line.split()[0] for line in nss.splitlines() if line.startswith(lab_id)]


def blackholes(subnet):
    out = subprocess.run(
        ["ip", "-j", "route", "show", "table", "all", "type", "blackhole"], capture_output=True, text=True
    )
    return [r for r in json.loads(out.stdout or "[]") if r.get("dst") == subnet]


def vm_config(facts, name, mac, user="ubuntu"):
    key = Path(facts["ssh_public_key"]).read_text()
    return {
        "name": name,
        "net0": f"virtio={mac},bridge=vmbr0,firewall=1",
        "ciuser": user,
        "sshkeys": urllib.parse.quote(key, safe=""),
        "ipconfig0": "ip=dhcp",
    }


@contextlib.contextmanager
def lab_vm(lab, vmid, name, mac):
    """A VM started on the lab's node (its host brought up as PVE's start hook does), destroyed at exit."""
    state, fixture, facts = lab
    hooks = network_lab.make_hooks(state, fixture)
    cfg = vm_config(facts, name, mac)
    hooks.vm_started("pve", vmid, cfg)
    try:
        yield hooks, cfg
    finally:
        hooks.vm_destroyed("pve", vmid)


def ens18(hooks, vmid, config):
    for iface in hooks.guest_interfaces("pve", vmid, config):
        if iface["name"] == "ens18":
            return [a["ip-address"] for a in iface.get("ip-addresses", []) if a["ip-address-type"] == "ipv4"]
    return []


def reserve(facts, name, line):
    """A reservation on the dnsmasq router host, made over SSH as the network stage does."""
    router = facts["router"]
    path = f"{router['hosts_dir']}/{name}"
    cmd = f"rm -f {path}" if line is None else f"echo {line} > {path}"
    ssh(facts, "root", router["address"], f"{cmd} && kill -HUP $(cat {router['pid_file']})")
    time.sleep(0.2)


def lab_address(facts, host):
    return facts["subnet"].rsplit(".", 1)[0] + f".{host}"


@pytest.fixture(scope="module")
def routes_before():
    return addressing.read_routes()


@pytest.fixture(scope="module")
def lab(tmp_path_factory, routes_before):
    state = tmp_path_factory.mktemp("network_lab")
    fixture = load_fixture()
    # VM hosts without systemd here (faster); test_systemd_vm_* covers the systemd ones
    fixture["network"] = {**fixture.get("network", {}), "vm_init": "simple"}
    t0 = time.monotonic()
    facts = network_lab.up(state, fixture)
    facts["_up_s"] = time.monotonic() - t0
    yield state, fixture, facts
    network_lab.down(state)


def test_up_builds_bridge_router_and_node_on_a_range_of_its_own(lab, routes_before):
    state, _fixture, facts = lab
    print(f"\nreference lab up in {facts['_up_s']:.2f} s")
    assert facts["network"] == "up" and not facts["reused"]
    subnet = addressing.ipaddress.ip_network(facts["subnet"])
    assert subnet.is_private
    # the range overlaps nothing the machine had before the lab came
    assert not addressing.conflicts(subnet, routes_before)
    assert facts["bridge"].startswith(facts["lab_id"])
    assert Path("/sys/class/net", facts["bridge"]).exists()
    assert facts["router"]["kind"] == "dnsmasq"
    assert facts["router"]["address"] == lab_address(facts, 1)
    # the router is a host too: the network stage reaches it over SSH
    out = ssh(
        facts,
        "root",
        facts["router"]["address"],
        f"hostname; test -s {facts['router']['pid_file']} && echo ok",
    )
    assert out.stdout.split() == ["lab-router", "ok"]
    assert facts["node_host"]["address"] == lab_address(facts, 5)
    status = network_lab.status(state)
    assert status["healthy"], status["problems"]


def test_blackhole_route_exists_while_up(lab):
    _state, _fixture, facts = lab
    (route,) = blackholes(facts["subnet"])
    assert route["metric"] == network_lab.BLACKHOLE_METRIC


def test_node_host_has_its_own_files_address_and_view(lab):
    _state, _fixture, facts = lab
    node = facts["node_host"]
    out = ssh(facts, "root", node["address"], "hostname; cat /etc/kernel/cmdline; cat /proc/cmdline; "
              "readlink /sys/bus/pci/devices/0000:02:00.0/driver; cat /sys/bus/pci/devices/0000:02:00.0/boot_vga; "
              "ip -4 route show default | wc -l; grep -cx 'blacklist nvidiafb' /etc/modprobe.d/pve-blacklist.conf")  # fmt: skip
    hostname, kcmd, pcmd, driver, boot_vga, default_routes, blk = out.stdout.splitlines()
    assert hostname == "pve"
    assert kcmd.strip() == "root=ZFS=rpool/ROOT/pve-1 boot=zfs"
    assert pcmd.endswith("root=ZFS=rpool/ROOT/pve-1 boot=zfs") and pcmd.startswith("initrd=")
    assert driver.endswith("/nouveau") and boot_vga == "1"
    assert default_routes == "0"  # no way out of the lab
    assert blk == "1"
    # the hardware view as one tree too, /proc/modules included (some kernels have no /proc/modules)
    hw = facts["node_host"]["hardware_root"]
    out = ssh(facts, "root", node["address"], f"grep -c '^nouveau ' {hw}/proc/modules; cat {hw}/proc/cmdline")
    assert out.stdout.splitlines() == ["1", pcmd]
    # its home directories are its own: none of the machine's dotfiles, caches or keys show there
    assert ssh(facts, "root", node["address"], "ls -A /root; ls -A /home").stdout.split() == [".ssh"]


def test_hosts_are_isolated_from_each_other_and_from_the_machine(lab):
    *_, facts = lab
    with lab_vm(lab, 190, "iso-vm", "bc:24:11:00:10:01") as (hooks, cfg):
        (vm_ip,) = ens18(hooks, 190, cfg)
        marker = f"/etc/modprobe.d/gpulab-isolation-{os.getpid()}.conf"
        ssh(facts, "root", facts["node_host"]["address"], f"mkdir -p /etc/modprobe.d && echo x > {marker}")
        assert ssh(facts, "root", facts["node_host"]["address"], f"cat {marker}").stdout == "x\n"
        assert not Path(marker).exists()  # not on the machine
        assert ssh(facts, "ubuntu", vm_ip, f"test -e {marker}", check=False).returncode == 1  # not on the VM
        upper = Path(facts["node_host"]["upper_dir"]) / marker.lstrip("/")
        assert upper.read_text() == "x\n"  # it lives in the node's own upper directory
        # the node knows the VM runs on it (`qm list`, read before a reboot)
        rows = ssh(facts, "root", facts["node_host"]["address"], "qm list").stdout.splitlines()
        assert rows[0].split() == ["VMID", "NAME", "STATUS", "MEM(MB)", "BOOTDISK(GB)", "PID"]
        assert rows[1].split()[:3] == ["190", "iso-vm", "running"]
        hooks.vm_stopped("pve", 190)
        rows = ssh(facts, "root", facts["node_host"]["address"], "qm list").stdout.splitlines()
        assert rows[1].split()[:3] == ["190", "iso-vm", "stopped"]
    assert ssh(facts, "root", facts["node_host"]["address"], "qm list").stdout == ""


def _image_list(root, *argv):
    return subprocess.run(["chroot", str(root), *argv], capture_output=True, text=True, check=True).stdout


def test_vm_boots_from_the_guest_image_and_borrows_nothing_of_the_machine(lab):
    *_, facts = lab
    img = Path(facts["guest_image"])
    with lab_vm(lab, 196, "img-vm", "bc:24:11:00:10:07") as (hooks, cfg):
        (addr,) = ens18(hooks, 196, cfg)

        def vm(command):
            return ssh(facts, "ubuntu", addr, command).stdout

        # package selections: the image's and the Ubuntu kernel the lab lays over it (labsim.net.guest_kernel);
        # what the machine installed for the lab is not in the VM
        packages = _image_list(img, "dpkg-query", "-W", "-f", "${Package}\n").split()
        kernel = sorted(guest_kernel.dpkg_stanzas(guest_kernel.DEFAULT_SERIES))
        assert sorted(vm("dpkg-query -W -f '${Package}\\n'").split()) == sorted([*packages, *kernel])
        assert {"sudo", "python3-apt", "systemd-timesyncd", "openssh-server", "gnupg"} <= set(packages)
        assert "dnsmasq-base" not in packages and Path("/usr/sbin/dnsmasq").exists()
        assert vm("test -e /usr/sbin/dnsmasq || echo absent") == "absent\n"
        # users and sudoers: the image's, plus what cloud-init makes for ciuser
        image_users = [line.split(":")[0] for line in (img / "etc/passwd").read_text().splitlines()]
        assert [line.split(":")[0] for line in vm("cat /etc/passwd").splitlines()] == [*image_users, "ubuntu"]
        assert vm("sudo -n ls /etc/sudoers.d").split() == sorted(
            [*os.listdir(img / "etc/sudoers.d"), "90-gpulab-ubuntu"]
        )
        # apt: the lab archive as its only source, and no lists until its first update
        router = facts["router"]["address"]
        assert vm("cat /etc/apt/sources.list") == f"deb [trusted=yes] http://{router}/ubuntu ./\n"
        assert vm("ls -A /etc/apt/sources.list.d") == ""
        assert set(vm("ls -A /var/lib/apt/lists").split()) <= {"lock", "partial"}
        assert vm("cat /etc/machine-id").strip() not in ("", Path("/etc/machine-id").read_text().strip())


@pytest.mark.parametrize(
    "machine_lists_age_s", [0, 5 * 86400], ids=["machine-just-updated", "machine-days-old"]
)
def test_guest_base_apt_refresh_does_not_depend_on_the_machine_apt_lists(lab, machine_lists_age_s):
    """guest_base's refresh (cache_valid_time) reads the VM's own lists, however old the machine's are."""
    *_, facts = lab
    import yaml

    valid = yaml.safe_load((ROOT / "roles/guest_base/defaults/main.yml").read_text())[
        "guest_base_apt_cache_valid_time"
    ]
    vmid = 197 if machine_lists_age_s == 0 else 198
    mac = f"bc:24:11:00:10:{vmid - 100:02x}"
    with (
        machine_apt_lists_aged(machine_lists_age_s),
        lab_vm(lab, vmid, f"apt-vm-{vmid}", mac) as (hooks, cfg),
    ):
        (addr,) = ens18(hooks, vmid, cfg)
        ssh_args = f"-o UserKnownHostsFile={facts['ssh_known_hosts']} -o StrictHostKeyChecking=yes"
        args = json.dumps({"name": "qemu-guest-agent", "update_cache": True, "cache_valid_time": valid})
        res = subprocess.run(
            [
                str(Path(sys.executable).with_name("ansible")), "all", "-i", f"{addr},", "-u", "ubuntu", "-b",
                "--private-key", facts["ssh_private_key"], "-e", f"ansible_ssh_common_args='{ssh_args}'",
                "-m", "ansible.builtin.apt", "-a", args, "-o",
            ],
            capture_output=True, text=True, timeout=180, check=False,
            env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")},
        )  # fmt: skip
        assert res.returncode == 0, res.stdout + res.stderr
        assert "CHANGED" in res.stdout  # refreshed from the lab archive and installed
        assert ssh(facts, "ubuntu", addr, "dpkg-query -W -f '${Status}' qemu-guest-agent").stdout == (
            "install ok installed"
        )


def test_listeners_are_bound_to_lab_addresses_only(lab):
    state, _, facts = lab
    with lab_vm(lab, 191, "listen-vm", "bc:24:11:00:10:02"):
        rec = json.loads((state / "net" / "record.json").read_text())
        lab_prefix = facts["subnet"].rsplit(".", 1)[0] + "."
        for ns in rec["netns"]:
            out = subprocess.run(
                ["ip", "netns", "exec", ns, "ss", "-Hlntu"], capture_output=True, text=True
            ).stdout
            for line in out.splitlines():
                proto, local = line.split()[0], line.split()[4]
                addr, port = local.rsplit(":", 1)
                if proto == "udp" and (port, ns.endswith("-r")) in (("67", True), ("68", False)):
                    # DHCP server (router) and client (VM) must hear broadcasts, so they bind 0.0.0.0,
                    # inside namespaces whose only link is the lab's
                    continue
                assert addr.startswith(lab_prefix) or addr.startswith("127."), (ns, line)
        # and nothing of the lab listens in the machine's own namespace
        pids = {str(p["pid"]) for p in rec["procs"].values()}
        root_ns = subprocess.run(["ss", "-Hlntup"], capture_output=True, text=True).stdout
        assert not any(f"pid={p}," in root_ns for p in pids)


def test_vm_gets_reserved_address_from_real_dhcp_and_moves_when_the_reservation_changes(lab):
    state, fixture, facts = lab
    hooks = network_lab.make_hooks(state, fixture)
    mac = "bc:24:11:00:10:03"
    cfg = vm_config(facts, "vm-1", mac)
    reserved, moved = lab_address(facts, 53), lab_address(facts, 63)
    router = facts["router"]
    reserve(facts, "vm192", f"{mac},{reserved}")
    t0 = time.monotonic()
    hooks.vm_started("pve", 192, cfg)
    print(f"\nVM host up (sshd + DHCP lease) in {time.monotonic() - t0:.2f} s")
    try:
        assert ens18(hooks, 192, cfg) == [reserved]
        out = ssh(facts, "ubuntu", reserved, "hostname; cat /sys/class/net/ens18/address; sudo -n id -u")
        assert out.stdout.split() == ["vm-1", mac, "0"]
        leases = (Path(router["upper_dir"]) / router["leases_file"].lstrip("/")).read_text()
        assert f"{mac} {reserved}" in leases
        # the guest reboots itself: new boot id, same address, back on ssh
        boot1 = ssh(facts, "ubuntu", reserved, "cat /proc/sys/kernel/random/boot_id").stdout
        ssh(facts, "ubuntu", reserved, "sudo -n reboot", check=False)
        deadline = time.monotonic() + 20
        boot2 = boot1
        while boot2 == boot1 and time.monotonic() < deadline:
            time.sleep(0.3)
            res = ssh(
                facts, "ubuntu", reserved, "cat /proc/sys/kernel/random/boot_id", check=False, timeout=5
            )
            boot2 = res.stdout if res.returncode == 0 else boot1
        assert boot2 != boot1
        # a changed reservation takes effect on the next start (the client renews its lease)
        reserve(facts, "vm192", f"{mac},{moved}")
        hooks.vm_stopped("pve", 192)
        assert ens18(hooks, 192, cfg) == []
        assert not [n for n in lab_objects(facts["lab_id"])[1] if n.endswith("v192")]  # the host is gone
        hooks.vm_started("pve", 192, cfg)
        assert ens18(hooks, 192, cfg) == [moved]
        assert ssh(facts, "ubuntu", moved, "hostname").stdout == "vm-1\n"

    finally:
        hooks.vm_destroyed("pve", 192)
        reserve(facts, "vm192", None)
    links, nss = lab_objects(facts["lab_id"])
    assert not [n for n in links + nss if n.endswith("v192")]
    assert not (state / "net" / "hosts" / "vm192").exists()


def test_node_reboot_applies_the_new_command_line_and_binds_vfio(lab):
    _state, _fixture, facts = lab
    node = facts["node_host"]["address"]
    script = textwrap.dedent("""\
        set -e
        echo 'root=ZFS=rpool/ROOT/pve-1 boot=zfs nomodeset modprobe.blacklist=nova_core,nova_drm,nova,nouveau' \
          > /etc/kernel/cmdline
        printf 'options vfio-pci ids=10de:2204,10de:1aef\\nsoftdep nouveau pre: vfio-pci\\nsoftdep snd_hda_intel pre: vfio-pci\\n' \
          > /etc/modprobe.d/vfio.conf
        printf 'vfio\\nvfio_iommu_type1\\nvfio_pci\\n' >> /etc/modules
        update-initramfs -u -k all
        cat /proc/sys/kernel/random/boot_id
        """)  # fmt: skip
    boot1 = ssh(facts, "root", node, script).stdout.splitlines()[-1]
    # before the reboot nothing changed in the running kernel
    assert "nouveau" in ssh(facts, "root", node, "readlink /sys/bus/pci/devices/0000:02:00.0/driver").stdout
    ssh(facts, "root", node, "shutdown -r now", check=False)
    deadline = time.monotonic() + 20
    out = None
    while time.monotonic() < deadline:
        time.sleep(0.3)
        res = ssh(facts, "root", node, "cat /proc/sys/kernel/random/boot_id /proc/cmdline; "
                  "readlink /sys/bus/pci/devices/0000:02:00.0/driver /sys/bus/pci/devices/0000:02:00.1/driver",
                  check=False, timeout=5)  # fmt: skip
        if res.returncode == 0 and res.stdout.splitlines()[0] != boot1:
            out = res.stdout.splitlines()
            break
    assert out is not None, "the node did not come back with a new boot id"
    assert "modprobe.blacklist=nova_core,nova_drm,nova,nouveau" in out[1]
    assert out[2].endswith("/vfio-pci") and out[3].endswith("/vfio-pci")
    boot = network_lab.node_boot_state(_state)
    assert boot["state"] == "vfio" and boot["cmdline"] == out[1]
    log = (Path(facts["node_host"]["standins_log"])).read_text().splitlines()
    commands = [json.loads(line)["command"] for line in log]
    assert commands[-2:] == ["update-initramfs", "shutdown"]


def test_up_again_reuses_the_running_lab(lab):
    state, fixture, facts = lab
    again = network_lab.up(state, fixture)
    assert again["reused"] is True
    assert again["subnet"] == facts["subnet"] and again["node_host"] == facts["node_host"]


def test_configured_range_overlapping_a_route_is_refused_and_leaves_nothing(tmp_path, monkeypatch):
    fixture = load_fixture()
    fixture["network"] = {**fixture.get("network", {}), "subnet": "10.199.77.0/24"}
    fake = [{"dst": "10.199.0.0/16", "dev": "homenet0", "protocol": "kernel"}]
    monkeypatch.setattr(addressing, "read_routes", lambda netns=None: fake)
    with pytest.raises(network_lab.SubnetConflict, match=r"10\.199\.0\.0/16 dev homenet0"):
        network_lab.up(tmp_path, fixture)
    links, nss = lab_objects(network_lab.lab_id(tmp_path))
    assert links == [] and nss == []
    assert blackholes("10.199.77.0/24") == []


def test_kea_router_serves_reservations_set_through_its_control_agent(tmp_path):
    # the same state directory ran a dnsmasq router before: the router host is re-installed for Kea
    network_lab.up(tmp_path, load_fixture())
    network_lab.down(tmp_path)
    fixture = load_fixture()
    # renew every 2 s (dnsmasq never sends a T1 under a minute; Kea does)
    fixture["network"] = {"router": "kea", "subnet": "auto", "dhcp_renew_s": 2, "vm_init": "simple"}
    facts = network_lab.up(tmp_path, fixture)
    try:
        url = facts["router"]["control_agent_url"]
        assert url.startswith(f"http://{facts['router']['address']}:")

        def post(body):
            req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=5) as resp:
                return json.load(resp)

        def reserve_kea(mac, address):
            args = post({"command": "config-get", "service": ["dhcp4"]})[0]["arguments"]
            args.pop("hash", None)
            args["Dhcp4"]["subnet4"][0]["reservations"] = [{"hw-address": mac, "ip-address": address}]
            assert post({"command": "config-set", "service": ["dhcp4"], "arguments": args})[0]["result"] == 0

        mac, reserved, again = "bc:24:11:00:10:04", lab_address(facts, 54), lab_address(facts, 64)
        reserve_kea(mac, reserved)
        hooks = network_lab.make_hooks(tmp_path, fixture)
        cfg = vm_config(facts, "vm-2", mac)
        hooks.vm_started("pve", 193, cfg)
        assert ens18(hooks, 193, cfg) == [reserved]
        assert ssh(facts, "ubuntu", reserved, "hostname").stdout == "vm-2\n"
        # a running VM follows a changed reservation at its next renew, and its sshd with it
        reserve_kea(mac, again)
        deadline = time.monotonic() + 15
        while ens18(hooks, 193, cfg) != [again] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ens18(hooks, 193, cfg) == [again]
        assert ssh(facts, "ubuntu", again, "hostname").stdout == "vm-2\n"
        assert network_lab.status(tmp_path)["vm_hosts"]["193"]["address"] == again
    finally:
        network_lab.down(tmp_path)
    assert lab_objects(network_lab.lab_id(tmp_path)) == ([], [])


CRASHER = """
import os, signal, sys, urllib.parse
from pathlib import Path
from labsim import network_lab
from labsim.fixture import load_fixture
state, fixture = Path(sys.argv[1]), load_fixture()
facts = network_lab.up(state, fixture)
key = Path(facts["ssh_public_key"]).read_text()
cfg = {"name": "crash-vm", "net0": "virtio=bc:24:11:00:10:05,bridge=vmbr0", "sshkeys": urllib.parse.quote(key)}
network_lab.make_hooks(state, fixture).vm_started("pve", 194, cfg)
print("started", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_down_cleans_up_after_a_killed_lab_and_up_refuses_until_then(tmp_path):
    res = subprocess.run(
        [sys.executable, "-c", CRASHER, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == -signal.SIGKILL and "started" in res.stdout, res.stderr
    lab_id = network_lab.lab_id(tmp_path)
    rec = json.loads((tmp_path / "net" / "record.json").read_text())
    subnet = rec["subnet"]
    links, nss = lab_objects(lab_id)
    assert len(nss) == 3 and len(links) == 4  # router, node, VM and the bridge survive the crash
    # part of the lab dies with the crash (here: the router host)
    os.kill(rec["procs"]["host:router"]["pid"], signal.SIGKILL)
    time.sleep(0.2)
    with pytest.raises(network_lab.LabNetError, match="gpulab lab down"):
        network_lab.up(tmp_path, load_fixture())
    t0 = time.monotonic()
    network_lab.down(tmp_path)
    print(f"\ndown after a crash in {time.monotonic() - t0:.2f} s")
    assert lab_objects(lab_id) == ([], [])
    assert blackholes(subnet) == []
    for proc in rec["procs"].values():
        assert not network_lab._alive(proc)
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(tmp_path) not in mounts
    cgroups = network_lab.cgroup2_mount()
    assert cgroups is None or not (cgroups / f"gpulab-{lab_id}").exists()
    network_lab.down(tmp_path)  # idempotent
    # and a fresh lab starts again in the same state directory; its down leaves nothing either
    facts = network_lab.up(tmp_path, load_fixture())
    assert facts["reused"] is False
    others_before = lab_objects("gl")
    network_lab.down(tmp_path)
    assert lab_objects(facts["lab_id"]) == ([], [])
    assert blackholes(facts["subnet"]) == []
    assert not Path("/sys/class/net", facts["bridge"]).exists()
    # nothing of any other lab was touched
    links_after, nss_after = lab_objects("gl")
    assert set(others_before[0]) - set(links_after) == {
        n for n in others_before[0] if n.startswith(facts["lab_id"])
    }
    assert set(others_before[1]) - set(nss_after) == {
        n for n in others_before[1] if n.startswith(facts["lab_id"])
    }
    assert network_lab.status(tmp_path) is None


@pytest.mark.slow
def test_gpu_vm_installs_the_driver_and_toolkit_from_the_lab_archive(lab):
    state, fixture, facts = lab
    hooks = network_lab.make_hooks(state, fixture)
    cfg = {**vm_config(facts, "vm-gpu", "bc:24:11:00:10:06"), "hostpci0": "0000:02:00,pcie=1"}
    hooks.vm_started("pve", 195, cfg)
    try:
        (addr,) = ens18(hooks, 195, cfg)
        router = facts["router"]
        query = (
            "nvidia-smi --query-gpu=uuid,name,memory.total,driver_version,pci.bus_id --format=csv,noheader"
        )
        script = textwrap.dedent(f"""\
            set -e
            export DEBIAN_FRONTEND=noninteractive
            {WAIT_FOR_UNATTENDED_UPGRADES}
            sudo -n apt-get update -q >/dev/null
            sudo -n apt-get install -y -q nvidia-driver-580-server linux-headers-$(uname -r) >/dev/null
            {query} || echo "rc=$?"
            sudo -n mkdir -p /etc/apt/keyrings
            curl -fsS {router['nvidia_key_url']} | sudo -n tee /etc/apt/keyrings/nvidia.asc >/dev/null
            echo 'deb [signed-by=/etc/apt/keyrings/nvidia.asc] {router['nvidia_repo_url']} /' \\
              | sudo -n tee /etc/apt/sources.list.d/nvidia-container-toolkit.list >/dev/null
            sudo -n apt-get update -q >/dev/null
            sudo -n apt-get install -y -q nvidia-container-toolkit >/dev/null
            nvidia-ctk --version | head -1
            """)  # fmt: skip
        out = ssh(facts, "ubuntu", addr, script, timeout=120).stdout.splitlines()
        # installed but not loaded until the guest reboots
        assert out[0].startswith("NVIDIA-SMI has failed") and out[1] == "rc=9"
        assert out[2] == "NVIDIA Container Toolkit CLI version 1.20.0"
        hooks.vm_stopped("pve", 195)  # a restart through the API
        hooks.vm_started("pve", 195, cfg)
        (addr,) = ens18(hooks, 195, cfg)
        (line,) = ssh(facts, "ubuntu", addr, query).stdout.splitlines()
        uuid, name, memory, driver, bus = line.split(", ")
        assert (name, memory, bus) == ("NVIDIA GeForce RTX 3090", "24576 MiB", "00000000:01:00.0")
        assert driver.startswith("580.") and uuid.startswith("GPU-")
        # nothing of it reached the machine itself
        assert not Path("/usr/bin/nvidia-ctk").exists() and not Path("/etc/apt/keyrings/nvidia.asc").exists()
    finally:
        hooks.vm_destroyed("pve", 195)


@pytest.fixture(scope="module")
def sd_lab(tmp_path_factory):
    """A lab whose VM hosts boot systemd."""
    state = tmp_path_factory.mktemp("netlab-systemd")
    fixture = load_fixture()
    fixture["network"] = {**fixture.get("network", {}), "vm_init": "systemd"}
    facts = network_lab.up(state, fixture)
    yield state, fixture, facts
    network_lab.down(state)
    cgroups = network_lab.cgroup2_mount()
    assert not (cgroups / f"gpulab-{network_lab.lab_id(state)}").exists()


needs_systemd = pytest.mark.skipif(
    network_lab.systemd_hosts_possible() is not None, reason=str(network_lab.systemd_hosts_possible())
)


@pytest.mark.slow
@needs_systemd
def test_systemd_vm_runs_services_and_reboots_through_systemd(sd_lab):
    tmp_path, fixture, facts = sd_lab
    try:
        assert facts["vm_init"] == "systemd"
        hooks = network_lab.make_hooks(tmp_path, fixture)
        cfg = vm_config(facts, "vm-sd", "bc:24:11:00:10:07")
        t0 = time.monotonic()
        hooks.vm_started("pve", 196, cfg)
        print(f"\nsystemd VM host up in {time.monotonic() - t0:.2f} s")
        (addr,) = ens18(hooks, 196, cfg)
        out = ssh(facts, "ubuntu", addr, "cat /proc/1/comm; systemctl is-system-running --wait; "
                  "systemctl is-active gpulab-sshd; cat /proc/sys/kernel/random/boot_id")  # fmt: skip
        comm, state, sshd, boot1 = out.stdout.split()
        assert (comm, state, sshd) == ("systemd", "running", "active")
        # none of the machine's own services came up in the VM: sshd on the lab address, the DHCP client
        listeners = {
            " ".join(line.split()[i] for i in (0, 4))
            for line in ssh(facts, "ubuntu", addr, "ss -Hlntu").stdout.splitlines()
        }
        assert listeners == {f"tcp {addr}:22", "udp 0.0.0.0:68"}
        # a package's service, started by systemd
        install = (
            f"{WAIT_FOR_UNATTENDED_UPGRADES}; sudo -n apt-get update -q >/dev/null"
            " && sudo -n apt-get install -y -q qemu-guest-agent >/dev/null"
        )
        ssh(facts, "ubuntu", addr, f"{install} && sudo -n systemctl start qemu-guest-agent", timeout=60)
        assert ssh(facts, "ubuntu", addr, "systemctl is-active qemu-guest-agent").stdout == "active\n"
        # systemd's own reboot: the host comes back with a new boot id, its address and its disk
        ssh(facts, "ubuntu", addr, "sudo -n systemctl reboot", check=False)
        deadline, boot2 = time.monotonic() + 30, boot1
        while boot2 == boot1 and time.monotonic() < deadline:
            time.sleep(0.3)
            res = ssh(facts, "ubuntu", addr, "cat /proc/sys/kernel/random/boot_id", check=False, timeout=5)
            boot2 = res.stdout.strip() if res.returncode == 0 else boot1
        assert boot2 != boot1
        assert (
            ssh(facts, "ubuntu", addr, "dpkg -s qemu-guest-agent >/dev/null && echo kept").stdout == "kept\n"
        )
        # no systemd of the lab runs in the machine's own namespaces
        own_pid_ns = os.readlink("/proc/self/ns/pid")
        for pid in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text().strip() == "systemd":
                    assert os.readlink(f"/proc/{pid}/ns/pid") != own_pid_ns or pid == "1"
    finally:
        network_lab.make_hooks(tmp_path, fixture).vm_destroyed("pve", 196)
    assert not (network_lab.cgroup2_mount() / f"gpulab-{network_lab.lab_id(tmp_path)}" / "vm196").exists()


@pytest.mark.slow
@needs_systemd
def test_k3s_from_the_lab_file_server_forms_a_cluster(sd_lab):
    tmp_path, fixture, facts = sd_lab
    try:
        hooks = network_lab.make_hooks(tmp_path, fixture)
        addrs = {}
        for vmid, name in ((197, "k3s-1"), (198, "k3s-2"), (199, "k3s-3")):
            cfg = vm_config(facts, name, f"bc:24:11:00:11:{vmid - 190:02x}")
            hooks.vm_started("pve", vmid, cfg)
            (addrs[name],) = ens18(hooks, vmid, cfg)
        url = facts["router"]["k3s_install_script_url"]

        def install(name, config, exec_):
            script = (
                "set -e; sudo -n mkdir -p /etc/rancher/k3s; "
                f"printf '{config}' | sudo -n tee /etc/rancher/k3s/config.yaml >/dev/null; "
                f"curl -fsS -o /tmp/install.sh {url}; chmod +x /tmp/install.sh; "
                f"sudo -n env INSTALL_K3S_VERSION=v1.33.5+k3s1 INSTALL_K3S_EXEC={exec_} /tmp/install.sh"
            )
            return ssh(facts, "ubuntu", addrs[name], script, timeout=60).stdout

        server = addrs["k3s-1"]
        assert "systemd: Starting k3s" in install("k3s-1", "node-name: k3s-1\\n", "server")
        token = ssh(facts, "ubuntu", server, "sudo -n cat /var/lib/rancher/k3s/server/token").stdout.strip()
        assert token.startswith("K10") and "::server:" in token
        agent_cfg = (
            f"server: https://{server}:6443\\ntoken: {token}\\nnode-name: k3s-2\\nnode-label:\\n  - gpu=on\\n"
        )
        install("k3s-2", agent_cfg, "agent")
        assert "No change detected" in install("k3s-2", agent_cfg, "agent")  # idempotent, like get.k3s.io
        install("k3s-3", f"server: https://{server}:6443\\ntoken: wrong\\nnode-name: k3s-3\\n", "agent")
        deadline, names = time.monotonic() + 30, set()
        while time.monotonic() < deadline and names != {"k3s-1", "k3s-2"}:
            time.sleep(0.5)
            res = ssh(facts, "ubuntu", server, "k3s kubectl get nodes -o json", check=False)
            if res.returncode == 0:
                items = json.loads(res.stdout)["items"]
                ready = [i for i in items if i["status"]["conditions"][0]["status"] == "True"]
                names = {i["metadata"]["name"] for i in ready}
        assert names == {"k3s-1", "k3s-2"}  # the agent with a wrong token never joins
        nodes = {i["metadata"]["name"]: i for i in items}
        assert nodes["k3s-2"]["metadata"]["labels"]["gpu"] == "on"
        assert nodes["k3s-2"]["status"]["addresses"][0]["address"] == addrs["k3s-2"]
        out = ssh(facts, "ubuntu", server, "sudo -n k3s kubectl label node k3s-1 gpu=on --overwrite; "
                  "sudo -n k3s kubectl label node k3s-1 gpu=on --overwrite; k3s --version | head -1")  # fmt: skip
        assert out.stdout.splitlines() == [
            "node/k3s-1 labeled",
            "node/k3s-1 not labeled",
            "k3s version v1.33.5+k3s1 (0000000a)",
        ]
        # k3s places its packaged RuntimeClasses a little after it starts, not with the node: wait as a client would
        deadline, handler = time.monotonic() + 20, ""
        while time.monotonic() < deadline and handler != "nvidia":
            time.sleep(0.5)
            cmd = "k3s kubectl get runtimeclass nvidia -o jsonpath={.handler}"
            handler = ssh(facts, "ubuntu", server, cmd, check=False).stdout.strip()
        assert handler == "nvidia"
        listening = ssh(facts, "ubuntu", server, "ss -Hltn").stdout
        assert f"{server}:6443" in listening and "*:6443" not in listening and "0.0.0.0:6443" not in listening
    finally:
        for vmid in (197, 198, 199):
            hooks.vm_destroyed("pve", vmid)

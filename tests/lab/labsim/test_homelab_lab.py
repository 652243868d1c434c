"""The user's lab before gpulab ran (fixtures/homelab.yml, issue 17): what the API and the lab's files hold.

API-only (no root): the seeded VMs as PVE 9's Create VM wizard stores them, the ISO already on `local`,
the raw hostpci root attached, the guests' installation, the leases, the node's command line, the disk
stand-ins and inventory/homelab-lab kept value for value with inventory/homelab. What the real hosts do
with it is in test_homelab_hosts.py (root).
"""

from __future__ import annotations

import ipaddress
import json
import re
import stat
from pathlib import Path

import pytest
import yaml
from unit.labsim.conftest import InProcessPveSim, start_lab, stop_lab
from unit.labsim.guest_disk import guest_disk
from unit.labsim.pve_sim_client import FAST_TIMINGS

from labsim import cli, seed
from labsim.fixture import FixtureError, fixtures_dir, load_fixture, resolve_fixture
from labsim.net import disk_standins, node_host
from labsim.vm_hooks import VmHooks

ROOT = Path(__file__).resolve().parents[3]
HOMELAB = ROOT / "inventory" / "homelab"
HOMELAB_LAB = ROOT / "inventory" / "homelab-lab"
ISO = "local:iso/ubuntu-24.04.3-live-server-amd64.iso"
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
BLACKLIST = "nomodeset modprobe.blacklist=nova_core,nova_drm,nova,nouveau"


def fast_homelab(path: Path, name: str = "homelab", **extra) -> Path:
    """A homelab fixture with the tests' short task timings."""
    data = {"extends": str(fixtures_dir() / f"{name}.yml"), "timings": FAST_TIMINGS, **extra}
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def hl(tmp_path_factory) -> InProcessPveSim:
    root = tmp_path_factory.mktemp("homelab")
    server, desc, thread = start_lab(root / "state", fast_homelab(root / "fixture.yml"))
    yield InProcessPveSim(server, desc, root / "state")
    stop_lab(server, thread)


@pytest.fixture(scope="module")
def hl_root(hl):
    return hl.root_api()


def config(api, vmid):
    return api.data("GET", f"/nodes/pve/qemu/{vmid}/config")


def host_vars(inventory: Path, host: str) -> dict:
    return yaml.safe_load((inventory / "host_vars" / f"{host}.yml").read_text())


# --------------------------------------------------------------------------------------- fixture selection
def test_named_fixtures_resolve_and_build_on_the_reference_machine():
    assert resolve_fixture("homelab") == fixtures_dir() / "homelab.yml"
    assert resolve_fixture(None) == fixtures_dir() / "reference.yml"
    reference, homelab, blacklisted = (
        load_fixture(n) for n in ("reference", "homelab", "homelab-blacklisted")
    )
    assert homelab["name"] == "homelab" and blacklisted["name"] == "homelab-blacklisted"
    # the same machine: nodes, PCI devices, storages, network
    assert homelab["nodes"][0]["pci"] == reference["nodes"][0]["pci"]
    assert homelab["network"] == reference["network"] and "seed" not in reference
    assert blacklisted["seed"]["vms"] == homelab["seed"]["vms"]
    # the lab as it runs: the same VMs, all running, behind the user's kind of router
    running = load_fixture("homelab-running")
    assert [v["vmid"] for v in running["seed"]["vms"]] == [v["vmid"] for v in homelab["seed"]["vms"]]
    assert {v["status"] for v in running["seed"]["vms"]} == {"running"}
    assert running["network"]["router"] == "huawei_ont" and homelab["network"]["router"] == "dnsmasq"
    with pytest.raises(FixtureError, match=r"the names are: .*homelab"):
        resolve_fixture("no-such-lab")


def test_cli_takes_a_fixture_name_and_publishes_the_seed(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(cli.API_ONLY_ENV, "1")
    state = tmp_path / "state"
    try:
        assert cli.main(["up", "--state", str(state), "--fixture", "homelab"]) == 0
        desc = json.loads(capsys.readouterr().out)
        assert desc["fixture"] == str(fixtures_dir() / "homelab.yml")
        lab_json = json.loads((state / "lab.json").read_text())
        assert lab_json["seed"] == desc["seed"] and stat.S_IMODE((state / "lab.json").stat().st_mode) == 0o600
        assert desc["seed"]["guest_user"] == "ubuntu" and desc["seed"]["guest_sudo"] == "password"
        assert len(desc["seed"]["guest_password"]) >= 12
        assert {n: v["vmid"] for n, v in desc["seed"]["vms"].items()} == {
            "vm-1": 100,
            "vm-2": 101,
            "vm-gpu": 102,
        }
        # the password is nowhere in the request log or the server's output
        logs = (state / "pve-requests.jsonl").read_text() + (state / "server.log").read_text()
        assert desc["seed"]["guest_password"] not in logs
    finally:
        cli.down(state)
    assert cli.main(["up", "--state", str(tmp_path / "x"), "--fixture", "homelab-nope"]) == 1
    assert "the names are:" in capsys.readouterr().err


# --------------------------------------------------------------------------------------- the seeded VMs
WIZARD_KEYS = {"name", "ostype", "ide2", "scsihw", "scsi0", "sockets", "cores", "numa", "cpu", "memory", "net0",
               "boot", "smbios1", "vmgenid", "meta", "digest"}  # fmt: skip


@pytest.mark.parametrize(("vmid", "host"), [(100, "vm-1"), (101, "vm-2"), (102, "vm-gpu")])
def test_seeded_vm_is_stored_as_the_create_wizard_stores_it(hl, vmid, host):
    api = hl.token_api()
    cfg = config(api, vmid)
    mac = hl.desc["seed"]["vms"][host]["mac"].upper()
    gpu = host == "vm-gpu"
    assert set(cfg) == WIZARD_KEYS | (
        {"machine", "bios", "efidisk0", "balloon", "hostpci0"} if gpu else set()
    )
    assert cfg["name"] == host
    assert re.fullmatch(rf"{re.escape(ISO)},media=cdrom,size=\d+K", cfg["ide2"])
    assert cfg["net0"] == f"virtio={mac},bridge=vmbr0,firewall=1"
    assert cfg["scsihw"] == "virtio-scsi-single" and cfg["ostype"] == "l26"
    assert cfg["boot"] == "order=scsi0;ide2;net0"
    assert re.fullmatch(f"uuid={UUID}", cfg["smbios1"]) and re.fullmatch(UUID, cfg["vmgenid"])
    assert "agent" not in cfg and "onboot" not in cfg  # no guest agent, start at boot left to PVE's default
    disk = 1 if gpu else 0
    inv = host_vars(HOMELAB, host)
    assert cfg["scsi0"] == f"local-zfs:vm-{vmid}-disk-{disk},iothread=1,size={inv['vm_disk_gb']}G"
    assert (cfg["cores"], cfg["memory"], cfg["sockets"], cfg["numa"]) == (
        inv["vm_cores"],
        str(inv["vm_memory_mib"]),  # a property string since PVE 8 ([current=]<MiB>)
        1,
        0,
    )
    assert cfg["cpu"] == inv.get("vm_cpu", "x86-64-v2-AES")
    assert cfg.get("machine", "i440fx") == inv["vm_machine"]
    assert cfg.get("bios", "seabios") == inv["vm_firmware"]
    if gpu:
        assert cfg["efidisk0"] == f"local-zfs:vm-{vmid}-disk-0,efitype=4m,pre-enrolled-keys=0,size=1M"
        assert cfg["balloon"] == 0 and inv["vm_balloon"] is False
        assert cfg["hostpci0"] == "0000:02:00,pcie=1"
    status = api.data("GET", f"/nodes/pve/qemu/{vmid}/status/current")
    assert status["status"] == "stopped" and "agent" not in status


def test_raw_hostpci_is_roots_and_a_token_cannot_touch_it(hl, hl_root):
    api = hl.token_api()
    r = api.put("/nodes/pve/qemu/102/config", hostpci0="mapping=rtx3090,pcie=1")
    assert r.status_code == 500 and "only root can set 'hostpci0' config for non-mapped devices" in r.text
    r = api.put("/nodes/pve/qemu/102/config", delete="hostpci0")
    assert r.status_code == 500 and "non-mapped" in r.text
    tasks = hl_root.data("GET", "/nodes/pve/tasks", vmid=102)
    assert {t["type"] for t in tasks} == {"qmcreate"} and all(t["user"] == "root@pam" for t in tasks)


def test_iso_is_on_local_and_the_inventory_checksum_finds_it_there(hl):
    api = hl.token_api()
    content = api.data("GET", "/nodes/pve/storage/local/content", content="iso")
    assert [c["volid"] for c in content] == [ISO]
    iso = yaml.safe_load((HOMELAB / "group_vars" / "all" / "main.yml").read_text())["gpulab_os_iso"]
    st = api.run(
        "POST", "/nodes/pve/storage/local/download-url", content="iso", url=iso["url"], filename=iso["filename"],
        checksum=iso["checksum"], **{"checksum-algorithm": iso["checksum_algorithm"]},
    )  # fmt: skip
    assert st["exitstatus"] == "OK"
    log = api.data("GET", f"/nodes/pve/tasks/{st['upid']}/log")
    assert any("no need to download" in line["t"] for line in log)
    st = api.run(
        "POST",
        "/nodes/pve/storage/local/download-url",
        content="iso",
        url=iso["url"],
        filename=iso["filename"],
    )
    assert "refusing to override existing file" in st["exitstatus"]


def test_seeding_runs_once_per_state_directory(tmp_path):
    fixture = fast_homelab(tmp_path / "f.yml")
    server, desc, thread = start_lab(tmp_path / "state", fixture)
    first = {k: dict(v["config"]) for k, v in server.lab.state.data["vms"].items()}
    stop_lab(server, thread)
    server, desc2, thread = start_lab(tmp_path / "state", fixture)
    try:
        assert {k: dict(v["config"]) for k, v in server.lab.state.data["vms"].items()} == first
        assert desc2["seed"]["guest_password"] == desc["seed"]["guest_password"]
        assert len(server.lab.state.data["volumes"]["pve/local"]) == 1
    finally:
        stop_lab(server, thread)


def test_seeded_vms_can_be_running_when_the_lab_starts(tmp_path):
    fixture = fast_homelab(tmp_path / "f.yml", seed={"vms": [{"vmid": 100, "status": "running", **_vm1()}]})
    server, _desc, thread = start_lab(tmp_path / "state", fixture)
    try:
        assert server.lab.state.data["vms"]["100"]["status"] == "running"
    finally:
        stop_lab(server, thread)
    fixture = fast_homelab(tmp_path / "g.yml", seed={"status": "running"})  # every VM (a mapping: merged)
    server, _desc, thread = start_lab(tmp_path / "state2", fixture)
    try:
        assert {k: v["status"] for k, v in server.lab.state.data["vms"].items()} == dict.fromkeys(
            ("100", "101", "102"), "running"
        )
    finally:
        stop_lab(server, thread)


def _vm1() -> dict:
    vm = next(v for v in load_fixture("homelab")["seed"]["vms"] if v["vmid"] == 100)
    return {"address": vm["address"], "create": vm["create"]}


# --------------------------------------------------------------------------------------- the installation
def test_each_seeded_guest_has_its_installation_and_loses_it_with_its_disk(tmp_path):
    server, desc, thread = start_lab(tmp_path / "state", fast_homelab(tmp_path / "f.yml"))
    try:
        lab = InProcessPveSim(server, desc, tmp_path / "state")
        for vmid, firmware, size in ((100, "bios", 60), (101, "bios", 60), (102, "efi", 200)):
            path = seed.installation_path(lab.state_dir, vmid)
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            inst = seed.installation(lab.state_dir, vmid)
            assert (inst["install"], inst["os"], inst["user"], inst["sudo"]) == (
                "iso",
                "ubuntu-24.04",
                "ubuntu",
                "password",
            )
            assert inst["password"] == desc["seed"]["guest_password"] and inst["firmware"] == firmware
            assert inst["disk"]["slot"] == "scsi0" and inst["disk"]["installed_bytes"] == size * 2**30
        assert lab.root_api().run("DELETE", "/nodes/pve/qemu/101")["exitstatus"] == "OK"
        assert seed.installation(lab.state_dir, 101) is None and seed.installation(lab.state_dir, 100)
    finally:
        stop_lab(server, thread)


def test_resize_through_the_api_grows_the_disk_and_tells_the_guest(tmp_path):
    server, desc, thread = start_lab(tmp_path / "state", fast_homelab(tmp_path / "f.yml"))
    calls = []

    class Recorder(VmHooks):
        def vm_resized(self, node, vmid, disk, size, config):
            calls.append((vmid, disk, size, config[disk]))

    server.lab.hooks = Recorder(server.lab.fixture)
    try:
        api = InProcessPveSim(server, desc, tmp_path / "state").token_api()
        assert api.run("PUT", "/nodes/pve/qemu/100/resize", disk="scsi0", size="+20G")["exitstatus"] == "OK"
        assert config(api, 100)["scsi0"] == "local-zfs:vm-100-disk-0,iothread=1,size=80G"
        assert calls == [(100, "scsi0", 80 * 2**30, "local-zfs:vm-100-disk-0,iothread=1,size=80G")]
    finally:
        stop_lab(server, thread)


def test_leases_are_the_seeded_addresses_inside_the_labs_range():
    leases = seed.leases(load_fixture("homelab"), ipaddress.ip_network("10.77.3.0/24"))
    assert leases == [
        {"mac": "bc:24:11:4e:0a:53", "address": "10.77.3.53", "hostname": "vm-1"},
        {"mac": "bc:24:11:4e:0a:54", "address": "10.77.3.54", "hostname": "vm-2"},
        {"mac": "bc:24:11:4e:0a:55", "address": "10.77.3.55", "hostname": "vm-gpu"},
    ]
    assert seed.leases(load_fixture("reference"), ipaddress.ip_network("10.77.3.0/24")) == []


# --------------------------------------------------------------------------------------- the node
@pytest.mark.parametrize(("name", "line", "state"), [
    ("homelab", "root=ZFS=rpool/ROOT/pve-1 boot=zfs \n", "stock"),
    ("homelab-blacklisted", f"root=ZFS=rpool/ROOT/pve-1 boot=zfs {BLACKLIST}\n", "blacklisted"),
    # the node stage host has configured (its files in seed.node.files): the first boot packs them, vfio-pci wins
    ("homelab-configured", f"root=ZFS=rpool/ROOT/pve-1 boot=zfs {BLACKLIST}\n", "vfio"),
])  # fmt: skip
def test_node_command_line_is_a_fixture_choice(tmp_path, name, line, state):
    node = load_fixture(name)["nodes"][0]
    spec = node_host.node_host_spec(node, tmp_path / "hdir")
    assert spec["files"]["/etc/kernel/cmdline"] == line
    root = tmp_path / "root"
    for path, text in {**spec["files"], **spec["tools"]}.items():
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / path.lstrip("/")).write_text(text)
    result = node_host.boot(root, tmp_path / "view", {"iommu": True})
    assert result["state"] == state and result["cmdline"].endswith(line.strip())
    assert (tmp_path / "view" / "proc" / "cmdline").read_text().strip() == result["cmdline"]
    for path, text in (node.get("lab") or {}).get("files", {}).items():
        assert spec["files"][path] == text  # the fixture's node files replace the first-boot ones


@pytest.mark.parametrize(
    "files", [{"/root/.bashrc": "x"}, {"/etc/../root/x": "x"}, {"/etc/modules": 1}, ["x"]]
)
def test_node_files_of_a_fixture_must_be_text_under_etc(tmp_path, files):
    fixture = tmp_path / "bad.yml"
    fixture.write_text(
        yaml.safe_dump({"extends": "homelab", "name": "bad", "seed": {"node": {"files": files}}})
    )
    with pytest.raises(FixtureError, match=r"seed\.node\.files must map paths under /etc/"):
        load_fixture(fixture)


# --------------------------------------------------------------------------------------- the disk stand-ins
@pytest.fixture
def disk(tmp_path):
    """A guest disk as the installer left it (60 GiB, BIOS, an ISO in the CD drive); run(cmd, *args) runs a
    stand-in on it."""
    return guest_disk(tmp_path, sr0=3213064192)


def test_installer_layout_gives_the_root_lv_half_the_volume_group():
    for size, efi in ((60, False), (200, True)):
        layout = disk_standins.install_layout(size * 2**30, efi)
        free, total = disk_standins.free_extents(layout), disk_standins.pe_count(layout)
        assert layout["lvs"][0]["extents"] == total // 2 and free == total - total // 2
        assert [p.get("mount") for p in layout["partitions"]] == (
            ["/boot/efi", "/boot", None] if efi else [None, "/boot", None]
        )
    assert disk_standins.root_lv_bytes(400 * 2**30) == 100 * 2**30  # capped, as the installer does


def test_fresh_install_reports_half_the_disk_and_cannot_grow_the_partition(disk):
    out = disk("lsblk", "-b", "-J", "-o", "NAME,SIZE,TYPE,MOUNTPOINT")
    sda, sr0 = json.loads(out.stdout)["blockdevices"]
    assert (sda["name"], sda["size"], sr0["type"]) == ("sda", 60 * 2**30, "rom")
    lv = sda["children"][2]["children"][0]
    assert (lv["name"], lv["type"], lv["mountpoint"]) == ("ubuntu--vg-ubuntu--lv", "lvm", "/")
    assert (
        disk("findmnt", "--noheadings", "--output", "SOURCE", "--target", "/").stdout
        == "/dev/mapper/ubuntu--vg-ubuntu--lv\n"
    )
    lvs = disk("lvs", "--noheadings", "--nosuffix", "--units", "m", "--separator", ",", "--options",
               "vg_name,lv_name,vg_free", "/dev/mapper/ubuntu--vg-ubuntu--lv")  # fmt: skip
    assert lvs.stdout == "  ubuntu-vg,ubuntu-lv,29696.00\n"
    grow = disk("growpart", "/dev/sda", "3")  # the installer left less than growpart's 1 MiB fudge
    assert grow.returncode == 1 and grow.stdout.startswith("NOCHANGE: partition 3 could only be grown by")
    assert disk("pvs").stdout.splitlines()[1].split() == [
        "/dev/sda3",
        "ubuntu-vg",
        "lvm2",
        "a--",
        "<58.00g",
        "29.00g",
    ]


def test_root_grows_into_the_free_space_then_into_a_bigger_disk_and_stays_grown(disk):
    first = disk("lvextend", "--extents", "+100%FREE", "--resizefs", "ubuntu-vg/ubuntu-lv")
    assert first.returncode == 0, first.stderr
    assert "changed from <29.00 GiB (7423 extents) to <58.00 GiB (14847 extents)" in first.stdout
    assert "is now 15203328 (4k) blocks long" in first.stdout
    again = disk("lvextend", "-l", "+100%FREE", "/dev/ubuntu-vg/ubuntu-lv")
    assert again.returncode == 5 and "matches existing size" in again.stderr
    # a resize through the API: the disk is bigger, the partition, PV and LV are as they were
    disk.grow(80)
    out = disk("lsblk", "-b", "-J", "-o", "NAME,SIZE")
    sda = json.loads(out.stdout)["blockdevices"]
    assert len(sda) == 1 and sda[0]["size"] == 80 * 2**30 and sda[0]["children"][2]["size"] < 59 * 2**30
    assert disk("vgs", "--noheadings", "--nosuffix", "--units", "g", "-o", "vg_free").stdout.strip() == "0.00"
    grow = disk("growpart", "/dev/sda", "3")
    assert grow.returncode == 0 and grow.stdout.startswith(
        "CHANGED: partition=3 start=4198400 old: size=121628672"
    )
    assert disk("growpart", "/dev/sda", "3").returncode == 1
    assert disk("pvresize", "/dev/sda3").stdout.startswith('  Physical volume "/dev/sda3" changed')
    assert (
        disk("vgs", "--noheadings", "--nosuffix", "--units", "g", "-o", "vg_free").stdout.strip() == "20.00"
    )
    assert disk("lvresize", "-l", "+100%FREE", "/dev/mapper/ubuntu--vg-ubuntu--lv").returncode == 0
    assert "is now 20446208 (4k) blocks long" in disk("resize2fs", "/dev/mapper/ubuntu--vg-ubuntu--lv").stdout
    assert "Nothing to do!" in disk("resize2fs", "/dev/mapper/ubuntu--vg-ubuntu--lv").stderr
    report = json.loads(
        disk("lvs", "--reportformat", "json", "--units", "b", "--nosuffix", "-o", "lv_name,lv_size").stdout
    )
    assert report == {"report": [{"lv": [{"lv_name": "ubuntu-lv", "lv_size": str(19967 * 4 * 2**20)}]}]}
    saved = disk.layout()  # the guest's own disk keeps it (a reboot reads it again)
    assert saved["lvs"][0]["extents"] == 19967 and saved["lvs"][0]["fs_bytes"] == 19967 * 4 * 2**20


def test_disk_standins_refuse_what_the_real_tools_refuse(disk):
    assert disk("lvs", "-o", "nosuchfield").returncode == 5
    assert disk("lvextend", "-L", "+1T", "ubuntu-vg/ubuntu-lv").stderr.startswith("  Insufficient free space")
    assert "Failed to find logical volume" in disk("lvextend", "-l", "+1", "ubuntu-vg/other").stderr
    assert disk("growpart", "/dev/sdb", "1").returncode == 2
    assert disk("lsblk", "-o", "NOPE").returncode == 1


# --------------------------------------------------------------------------------------- the inventory
#: what inventory/homelab-lab may add or change: addresses, secrets, and how it reaches the lab
GLUE = {
    "group_vars/all/main.yml": {"labsim_state", "labsim", "labsim_prefix", "ansible_ssh_private_key_file",
                                "ansible_ssh_common_args", "ansible_control_path_dir", "gpulab_state_dir",
                                "pve_api_url", "pve_api_token_secret", "pve_api_fingerprint", "k3s_token"},
    "group_vars/vms.yml": {"ansible_sudo_pass", "nvidia_container_toolkit_key_url",
                           "nvidia_container_toolkit_repo_url", "k3s_server_install_script_url",
                           "k3s_agent_install_script_url"},
    "host_vars/isp-router.yml": {"ansible_host", "ansible_user", "router_kind", "router_address", "router_subnet",
                                 "router_dhcp_pool", "router_url", "router_user", "router_password"},
    "host_vars/pve.yml": {"ansible_host", "pve_host_sysfs_root"},
    "host_vars/vm-1.yml": {"vm_address"},
    "host_vars/vm-2.yml": {"vm_address"},
    "host_vars/vm-gpu.yml": {"vm_address"},
    "hosts.yml": set(),
}  # fmt: skip


@pytest.mark.parametrize("rel", sorted(GLUE))
def test_homelab_lab_inventory_is_homelab_value_for_value(rel):
    mine, theirs = (yaml.safe_load((inv / rel).read_text()) for inv in (HOMELAB_LAB, HOMELAB))
    keys = (set(mine) | set(theirs)) - GLUE[rel]
    assert {k: mine.get(k) for k in keys} == {k: theirs.get(k) for k in keys}


def test_homelab_lab_inventory_has_every_file_of_homelab_and_its_lab_glue():
    files = {str(p.relative_to(HOMELAB)) for p in HOMELAB.rglob("*.yml")}
    assert (
        files <= set(GLUE)
        and (HOMELAB_LAB / "zz-labsim.yml").read_text()
        == (ROOT / "inventory" / "demo" / "zz-labsim.yml").read_text()
    )
    for n, host in ((53, "vm-1"), (54, "vm-2"), (55, "vm-gpu")):
        assert host_vars(HOMELAB_LAB, host)["vm_address"] == "{{ labsim_prefix }}." + str(n)
        assert host_vars(HOMELAB, host)["vm_address"] == f"192.168.100.{n}"

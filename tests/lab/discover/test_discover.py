"""gpulab discover's pure part against a node stand-in (conftest.Node): the API simulator answers pvesh as
root@pam, the lab's /sys tree of the reference node answers the sysfs walk.

What it writes is compared with inventory/homelab-lab (the same machine and VMs, described by hand), then
filled in as a user would and checked with `gpulab plan`. Bad input (not Proxmox VE, IOMMU off, no NVIDIA
GPU, an existing folder) ends with a message and writes nothing.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import paramiko
import pytest
import yaml
from unit.discover.conftest import Node, fixture_sim, sysfs
from unit.discover.filling import fill, placeholders, plan

from gpulab import cli, discover, discover_ssh, vmspec
from gpulab.pve import vmoptions

# the simulator's certificate is self-signed: its requests go unverified, on purpose
pytestmark = pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
ROOT = Path(__file__).resolve().parents[3]
HOMELAB_LAB = ROOT / "inventory" / "homelab-lab"
ROUTER = {"router_kind": "dnsmasq", "router_user": "root", "start": "192.168.100.2", "end": "192.168.100.250"}
ADDRESSES = {"vm-1": "192.168.100.53", "vm-2": "192.168.100.54", "vm-gpu": "192.168.100.55"}


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def written(node: Node, tmp: Path, public_key: str | None = None) -> Path:
    raw = discover.collect(node.run, "192.168.100.5", "root", public_key)
    out = tmp / "mylab"
    discover.write_new(out, discover.render(discover.analyse(raw)))
    return out


@pytest.fixture
def homelab_inv(homelab_sim, tmp_path) -> Path:
    return written(Node(homelab_sim, sysfs(tmp_path)), tmp_path)


# ------------------------------------------------------------------------------------ the homelab lab
def test_the_node_is_written_as_inventory_homelab_lab_describes_it(homelab_inv, homelab_sim):
    mine, theirs = load(homelab_inv / "host_vars" / "pve.yml"), load(HOMELAB_LAB / "host_vars" / "pve.yml")
    for key in ("pve_node", "pve_memory_mib", "pve_threads", "ansible_user", "ansible_python_interpreter"):
        assert mine[key] == theirs[key], key
    assert (
        mine["pve_gpus"] == theirs["pve_gpus"]
    )  # id, slot, vendor:device, functions, group 13, boot display
    assert mine["ansible_host"] == "192.168.100.5"
    # the storages as the node has them: the lab's are smaller than the reference PC's 2 TB pool
    node = homelab_sim.server.lab.fixture["nodes"][0]
    assert mine["pve_storages"] == {
        s["name"]: {"type": s["type"], "content": s["content"], "size_gb": int(s["total"]) // 2**30}
        for s in node["storages"]
    }
    assert set(mine["pve_storages"]) == set(theirs["pve_storages"])
    router = load(homelab_inv / "host_vars" / "lan-router.yml")
    assert (router["ansible_host"], router["router_address"], router["router_subnet"]) == (
        "192.168.100.1",
        "192.168.100.1",
        "192.168.100.0/24",
    )
    main = load(homelab_inv / "group_vars" / "all" / "main.yml")
    assert main["pve_api_url"] == "https://192.168.100.5:8006"
    assert main["pve_api_fingerprint"] == homelab_sim.desc["fingerprint"]
    reference = load(HOMELAB_LAB / "group_vars" / "all" / "main.yml")
    assert main["gpulab_os_iso"] == reference["gpulab_os_iso"]  # the ISO on local the VMs were made from
    for key in ("k3s_version", "nvidia_driver_branch", "hami_chart_version", "gpulab_host_reserve_mib"):
        assert main[key] == reference[key]


@pytest.mark.parametrize("host", ["vm-1", "vm-2", "vm-gpu"])
def test_each_vm_is_written_in_gpulabs_variables_as_homelab_lab_has_it(homelab_inv, host):
    mine = {**load(homelab_inv / "group_vars" / "vms.yml"), **load(homelab_inv / "host_vars" / f"{host}.yml")}
    theirs = {
        **load(HOMELAB_LAB / "group_vars" / "vms.yml"),
        **load(HOMELAB_LAB / "host_vars" / f"{host}.yml"),
    }
    vm_vars = {k for k in theirs if k.startswith("vm_")} - {"vm_address", "vm_ssh_user"}
    assert {k: mine.get(k) for k in vm_vars} == {k: theirs[k] for k in vm_vars}
    assert {k for k in mine if k.startswith("vm_")} - vm_vars == {"vm_address", "vm_ssh_user"}
    # what discover cannot read (the VMs are off, the installer's account is the user's) is a placeholder
    assert mine["vm_address"] == mine["vm_ssh_user"] == "CHANGE-ME"


def test_the_placeholders_are_refused_by_plan_each_by_name(homelab_inv, monkeypatch, capsys):
    assert placeholders(homelab_inv) == {
        "group_vars/vms.yml": ["vm_ssh_user"],
        "host_vars/lan-router.yml": ["router_kind", "start", "end", "router_user"],
        "host_vars/vm-1.yml": ["vm_address"],
        "host_vars/vm-2.yml": ["vm_address"],
        "host_vars/vm-gpu.yml": ["vm_address"],
    }
    rc, out = plan(homelab_inv, monkeypatch, capsys)
    assert rc == 1
    for field in ("lan-router: router_kind=", "lan-router: router_dhcp_pool.start=", "lan-router: router_user=",
                  "vm-1: vm_address=", "vm-gpu: vm_address=", "vm-2: vm_ssh_user="):  # fmt: skip
        assert f"{field}'CHANGE-ME': a placeholder" in out, field
    assert "group k3s_server=(not set): k3s has no server" in out  # the k3s roles are the user's to uncomment


def test_filled_in_it_passes_plan_and_adopts_the_vms_as_they_are(homelab_inv, monkeypatch, capsys):
    fill(homelab_inv, ADDRESSES, ROUTER, ssh_user="ubuntu", server="vm-1", agents=("vm-2", "vm-gpu"))
    rc, out = plan(homelab_inv, monkeypatch, capsys)
    assert rc == 0, out
    assert "The lab definition is valid." in out
    # the spec stage vms would send for each VM is the one inventory/homelab-lab resolves: adopted, not changed
    from gpulab import inventory, labdef, vmspec

    mine = vmspec.resolve(labdef.check(*inventory.load(homelab_inv))[0])
    theirs = vmspec.resolve(labdef.check(*inventory.load(HOMELAB_LAB))[0])
    assert {h: p["spec"] for h, p in mine.items()} == {h: p["spec"] for h, p in theirs.items()}


def test_a_placeholder_is_refused_wherever_it_stands(homelab_inv, monkeypatch, capsys):
    """In a list of mappings too (the catalogue's check of CHANGE-ME is not discover's own)."""
    fill(homelab_inv, ADDRESSES, ROUTER, ssh_user="ubuntu", server="vm-1", agents=("vm-2", "vm-gpu"))
    main = homelab_inv / "group_vars" / "all" / "main.yml"
    main.write_text(
        main.read_text() + "workloads_engines:\n  - {name: vllm, image: CHANGE-ME, node: vm-gpu}\n"
    )
    rc, out = plan(homelab_inv, monkeypatch, capsys)
    assert rc == 1
    assert "all: workloads_engines[0].image='CHANGE-ME': a placeholder" in out
    assert "1 problem(s)" in out


def test_a_value_pvesh_did_not_give_is_a_placeholder_plan_names(homelab_sim, tmp_path, monkeypatch, capsys):
    node = Node(homelab_sim, sysfs(tmp_path))
    raw = discover.collect(node.run, "192.168.100.5", "root")
    del raw.api["/nodes/pve/status"]["memory"]
    inv = tmp_path / "mylab"
    discover.write_new(inv, discover.render(discover.analyse(raw)))
    assert "pve_memory_mib" in placeholders(inv)["host_vars/pve.yml"]
    fill(inv, ADDRESSES, ROUTER, ssh_user="ubuntu", server="vm-1", agents=("vm-2", "vm-gpu"), complete=False)
    rc, out = plan(inv, monkeypatch, capsys)
    assert rc == 1 and "1 problem(s)" in out
    assert "pve: pve_memory_mib='CHANGE-ME': a placeholder: a value gpulab discover could not read" in out


def test_the_written_files_are_yamllint_clean(homelab_inv):
    yamllint(homelab_inv)


def yamllint(folder: Path) -> None:
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "yamllint"),
            "-s",
            "-c",
            str(ROOT / ".yamllint"),
            str(folder),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------ a bare node
def test_a_bare_node_gets_the_demo_labs_three_vms_as_a_proposal(reference_sim, tmp_path, monkeypatch, capsys):
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGdpcHVsYWItZGlzY292ZXItdGVzdA user@controller"
    inv = written(Node(reference_sim, sysfs(tmp_path)), tmp_path, public_key=key)
    hosts = load(inv / "hosts.yml")["all"]["children"]
    assert list(hosts["vms"]["hosts"]) == ["vm-1", "vm-2", "vm-gpu"]
    assert list(hosts["k3s_cluster"]["children"]["k3s_server"]["hosts"]) == ["vm-1"]
    assert list(hosts["k3s_cluster"]["children"]["k3s_agent"]["hosts"]) == ["vm-2", "vm-gpu"]
    demo = ROOT / "inventory" / "demo" / "host_vars"
    for host in ("vm-1", "vm-2", "vm-gpu"):
        mine, theirs = load(inv / "host_vars" / f"{host}.yml"), load(demo / f"{host}.yml")
        assert {k: v for k, v in mine.items() if k != "vm_address"} == {
            k: v for k, v in theirs.items() if k != "vm_address"
        }
    vms = load(inv / "group_vars" / "vms.yml")
    assert vms["vm_os_install"] == "cloud_image" and vms["vm_ssh_public_key"] == key
    assert vms["vm_storage"] == "local-zfs"
    assert placeholders(inv)["host_vars/vm-gpu.yml"] == ["vm_address"]
    yamllint(inv)
    fill(inv, ADDRESSES, ROUTER)
    rc, out = plan(inv, monkeypatch, capsys)
    assert rc == 0, out


def test_a_small_node_gets_a_gpu_vm_that_fits(reference_sim, tmp_path):
    node = Node(reference_sim, sysfs(tmp_path))
    raw = discover.collect(node.run, "192.168.100.5", "root")
    raw.api["/nodes/pve/status"]["memory"]["total"] = 16 * 2**30
    found = discover.analyse(raw)
    memory = {vm.host: vm.get("vm_memory_mib") for vm in found.vms}
    assert memory == {"vm-1": 4096, "vm-2": 4096, "vm-gpu": 4096}  # 16 GiB - 4 GiB host - 8 GiB


# ------------------------------------------------------------------------------------ the GPU's group
def test_a_gpu_sharing_its_iommu_group_is_written_with_those_devices_named(homelab_sim, tmp_path):
    node = Node(homelab_sim, sysfs(tmp_path, share_group_with="0000:03:00.0"))
    found = discover.analyse(discover.collect(node.run, "192.168.100.5", "root"))
    (gpu,) = found.gpus
    assert [o.address for o in gpu.others] == ["0000:03:00.0"] and gpu.iommu_group == 13
    text = discover.render(found)["host_vars/pve.yml"]
    comment = " ".join(line.strip("# ") for line in text.splitlines() if line.lstrip().startswith("#"))
    assert (
        "IOMMU group 13 also holds 0000:03:00.0 (8086:15f3 Intel Corporation Ethernet Controller I225-V)"
        in comment
    )
    assert "passthrough would take them too" in comment and "holds only these" not in comment


# ------------------------------------------------------------------------------------ bad input
class FakeSession:
    """What cli._discover gets instead of an SSH session: the node stand-in's commands."""

    def __init__(self, node: Node):
        self.node, self.user, self.host, self.made = node, "root", "192.168.100.5", 0

    def __call__(self, target, port, key, known_hosts):
        self.made += 1
        return SimpleNamespace(run=self.node.run, user=self.user, host=self.host, close=lambda: None)


def run_cli(monkeypatch, capsys, node: Node, target: Path) -> tuple[int, str, str, FakeSession]:
    fake = FakeSession(node)
    monkeypatch.setattr(discover_ssh, "Session", fake)
    rc = cli.main(["discover", "root@192.168.100.5", str(target)])
    out = capsys.readouterr()
    return rc, out.out, out.err, fake


def test_a_host_that_is_not_proxmox_ve_is_refused_with_what_was_found(monkeypatch, capsys, tmp_path):
    node = Node(None, sysfs(tmp_path))
    node.probe.update(pvesh="", etc_pve="0", os="Ubuntu 24.04.3 LTS")
    rc, _, err, _ = run_cli(monkeypatch, capsys, node, tmp_path / "mylab")
    assert rc == 1 and not (tmp_path / "mylab").exists()
    assert "root@192.168.100.5 is not a Proxmox VE node" in err
    assert "pvesh: not found on its PATH; /etc/pve: absent; operating system: Ubuntu 24.04.3 LTS" in err
    assert "Fix: give the address of the Proxmox VE host itself" in err and "nothing was written" in err
    assert not any(c.startswith("pvesh") for c in node.calls)  # it stopped after the probe


def test_a_node_without_iommu_is_refused(homelab_sim, monkeypatch, capsys, tmp_path):
    rc, _, err, _ = run_cli(
        monkeypatch, capsys, Node(homelab_sim, sysfs(tmp_path, iommu=False)), tmp_path / "x"
    )
    assert rc == 1 and not (tmp_path / "x").exists()
    assert "no IOMMU group in /sys/kernel/iommu_groups (the folder is empty): the IOMMU is off" in err
    assert "VT-d" in err and "intel_iommu=on" in err


def test_a_node_without_an_nvidia_gpu_is_refused(homelab_sim, monkeypatch, capsys, tmp_path):
    root = sysfs(tmp_path)
    for fn in (root / "sys" / "bus" / "pci" / "devices").glob("0000:02:00.*"):
        fn.unlink()  # the card taken out
    rc, _, err, _ = run_cli(monkeypatch, capsys, Node(homelab_sim, root), tmp_path / "x")
    assert rc == 1 and not (tmp_path / "x").exists()
    assert "no NVIDIA GPU (vendor 10de, display class 03xx) among its 21 PCI devices" in err
    assert "display adapters found: none" in err


def test_an_existing_folder_is_refused_before_the_node_is_read(homelab_sim, monkeypatch, capsys, tmp_path):
    target = tmp_path / "mylab"
    target.mkdir()
    (target / "hosts.yml").write_text("---\n# mine\n")
    rc, _, err, fake = run_cli(monkeypatch, capsys, Node(homelab_sim, sysfs(tmp_path)), target)
    assert rc == 1 and fake.made == 0
    assert "exists; discover writes a new inventory folder and never overwrites one" in err
    assert (target / "hosts.yml").read_text() == "---\n# mine\n"
    with pytest.raises(FileExistsError):
        discover.write_new(target, {"hosts.yml": "---\n"})
    assert sorted(p.name for p in target.iterdir()) == ["hosts.yml"]


def test_the_cli_writes_the_folder_and_says_what_it_found(homelab_sim, monkeypatch, capsys, tmp_path):
    rc, out, err, _ = run_cli(monkeypatch, capsys, Node(homelab_sim, sysfs(tmp_path)), tmp_path / "mylab")
    assert rc == 0, err
    assert "GPUs: rtx3090 at 0000:02:00 (IOMMU group 13)" in out
    assert "VMs: vm-1 (100), vm-2 (101), vm-gpu (102)" in out
    assert "  host_vars/lan-router.yml: router_kind, start, end, router_user\n" in out
    assert "  host_vars/vm-gpu.yml: vm_address\n" in out and "  group_vars/vms.yml: vm_ssh_user\n" in out
    assert "hosts.yml: the k3s server and agents" in out
    assert sorted(str(p.relative_to(tmp_path / "mylab")) for p in (tmp_path / "mylab").rglob("*.yml*")) == [
        "group_vars/all/main.yml",
        "group_vars/all/vault.yml.example",
        "group_vars/vms.yml",
        "host_vars/lan-router.yml",
        "host_vars/pve.yml",
        "host_vars/vm-1.yml",
        "host_vars/vm-2.yml",
        "host_vars/vm-gpu.yml",
        "hosts.yml",
    ]


# ------------------------------------------------------------------------------------ VM configs
def test_vm_configs_map_to_gpulabs_variables(homelab_sim, tmp_path):
    """Configs of other shapes, as PVE returns them: a PCI mapping, start at boot, a balloon floor,
    cloud-init, a second disk, a Windows VM and a template."""
    node = Node(homelab_sim, sysfs(tmp_path))
    raw = discover.collect(node.run, "192.168.100.5", "root")
    base = "/nodes/pve/qemu"
    raw.api["/cluster/mapping/pci"] = [
        {"id": "bigcard", "map": ["node=pve,path=0000:02:00,id=10de:2204,iommugroup=13"]}
    ]
    raw.api[f"{base}/102/config"]["hostpci0"] = "mapping=bigcard,pcie=1"
    raw.api[f"{base}/102/config"]["onboot"] = 1
    raw.api[f"{base}/100/config"].update(
        balloon=2048,
        ide2="local-zfs:vm-100-cloudinit,media=cdrom",
        ciuser="ops",
        sshkeys="ssh-ed25519%20AAAAC3Nz%20ops%40laptop%0A",
        scsi1="local-zfs:vm-100-disk-1,size=10G",
    )
    raw.api[f"{base}"] += [
        {"vmid": 110, "name": "win11", "status": "stopped"},
        {"vmid": 900, "name": "tpl", "template": 1},
    ]
    raw.api[f"{base}/110/config"] = {"name": "win11", "ostype": "win11", "memory": "8192"}
    raw.api[f"{base}/900/config"] = {"name": "tpl", "template": 1}
    found = discover.analyse(raw)
    assert found.gpus[0].id == "bigcard"  # the mapping's id, which stage vms keeps
    vms = {vm.host: vm for vm in found.vms}
    assert list(vms) == ["vm-1", "vm-2", "vm-gpu"]
    gpu_vm, vm1 = vms["vm-gpu"], vms["vm-1"]
    assert (gpu_vm.get("vm_gpu"), gpu_vm.get("vm_onboot")) == ("bigcard", True)
    assert (vm1.get("vm_balloon_min_mib"), vm1.get("vm_os_install"), vm1.get("vm_ssh_user")) == (
        2048,
        "cloud_image",
        "ops",
    )
    assert vm1.get("vm_ssh_public_key") == "ssh-ed25519 AAAAC3Nz ops@laptop"
    assert any("another disk, scsi1" in n for n in vm1.notes)
    assert any("cloud-init network is unset (ipconfig0)" in n for n in vm1.notes)
    assert [s.split(":")[0] for s in found.skipped_vms] == ["VM 110 (win11)", "VM 900 (tpl)"]
    hosts = discover.render(found)["hosts.yml"]
    assert "# not in the lab: VM 110 (win11): ostype win11, not Linux" in hosts


def test_a_running_vm_with_the_guest_agent_gets_the_address_it_reports(homelab_sim, tmp_path):
    node = Node(homelab_sim, sysfs(tmp_path))
    mac = "BC:24:11:4E:0A:54"
    node.pvesh_answers["/nodes/pve/qemu"] = [
        {**vm, "status": "running"} if vm["vmid"] == 101 else vm
        for vm in homelab_sim.request("GET", "/nodes/pve/qemu").json()["data"]
    ]
    cfg = homelab_sim.request("GET", "/nodes/pve/qemu/101/config").json()["data"]
    node.pvesh_answers["/nodes/pve/qemu/101/config"] = {**cfg, "agent": "1"}
    node.pvesh_answers["/nodes/pve/qemu/101/agent/network-get-interfaces"] = {"result": [
        {"name": "lo", "hardware-address": "00:00:00:00:00:00",
         "ip-addresses": [{"ip-address-type": "ipv4", "ip-address": "127.0.0.1", "prefix": 8}]},
        {"name": "ens18", "hardware-address": mac.lower(),
         "ip-addresses": [{"ip-address-type": "ipv4", "ip-address": "192.168.100.54", "prefix": 24}]},
    ]}  # fmt: skip
    found = discover.analyse(discover.collect(node.run, "192.168.100.5", "root"))
    vms = {vm.host: vm for vm in found.vms}
    assert vms["vm-2"].get("vm_address") == "192.168.100.54"
    assert vms["vm-1"].get("vm_address") == "CHANGE-ME"  # stopped: not asked
    assert sum("agent/network-get-interfaces" in c for c in node.calls) == 1


def test_the_bridge_comes_from_pveshs_network_list_when_it_answers(homelab_sim, tmp_path):
    node = Node(homelab_sim, sysfs(tmp_path))
    node.pvesh_answers["/nodes/pve/network"] = [
        {"iface": "eno1", "type": "eth", "active": 1},
        {"iface": "vmbr1", "type": "bridge", "cidr": "10.10.0.1/24", "address": "10.10.0.1", "netmask": "24"},
        {"iface": "vmbr0", "type": "bridge", "cidr": "192.168.100.5/24", "gateway": "192.168.100.1",
         "bridge_ports": "eno1"},
    ]  # fmt: skip
    found = discover.analyse(discover.collect(node.run, "192.168.100.5", "root"))
    assert (found.bridge, found.subnet, found.network_source) == ("vmbr0", "192.168.100.0/24", "pvesh")
    node.routes = []  # no default route: the bridge's gateway in /etc/network/interfaces, as pvesh lists it
    found = discover.analyse(discover.collect(node.run, "192.168.100.5", "root"))
    assert found.gateway == "192.168.100.1"
    del node.pvesh_answers["/nodes/pve/network"]  # neither: the router's address is the user's to give
    found = discover.analyse(discover.collect(node.run, "192.168.100.5", "root"))
    router = discover.render(found)["host_vars/lan-router.yml"]
    assert found.gateway is None and "router_address: CHANGE-ME" in router
    assert yaml.safe_load(router)["ansible_host"] == "{{ router_address }}"


# ------------------------------------------------------------------------------------ small pieces
@pytest.mark.parametrize(
    ("name", "ident"),
    [("GA102 [GeForce RTX 3090]", "rtx3090"), ("GA102GL [RTX A6000]", "rtxa6000"), ("TU104GL [Tesla T4]", "t4"),
     ("AD102 [GeForce RTX 4090 D]", "rtx4090d"), ("", "gpu"), ("GH100 [H100 SXM5 80GB]", "h100sxm580gb")],
)  # fmt: skip
def test_gpu_ids_come_from_the_cards_name(name, ident):
    assert discover.gpu_name_id(name, set()) == ident
    assert discover.gpu_name_id(name, {ident}) == f"{ident}-2"


@pytest.mark.parametrize(
    ("text", "size_gb"),
    [("60G", 60), ("61440M", 60), ("1T", 1024), ("4M", 1), ("60.5G", 61), ("x", None)],
)
def test_disk_sizes_are_read_as_the_module_option(text, size_gb):
    """A VM's disk size reads back as pve_vm's size_gb (vmoptions.read, whole GiB rounded up), the
    vm_disk_gb that discover writes (vmspec.VARIABLES)."""
    options = vmoptions.read({"scsi0": f"local-zfs:vm-100-disk-0,iothread=1,size={text}"})
    assert options["disks"] == [
        {"slot": "scsi0", "storage": "local-zfs", "size_gb": size_gb, "file": "local-zfs:vm-100-disk-0"}
    ]
    wanted = vmspec.variables(options)
    assert wanted.get("vm_disk_gb") == size_gb and wanted["vm_storage"] == "local-zfs"


def test_the_variables_read_back_are_those_that_give_the_options():
    """vmspec.VARIABLES both ways: a VM resolved from its variables, its options read back, give the same
    variables (the balloon's floor too)."""
    vm = {"vm_cores": 8, "vm_memory_mib": 16384, "vm_machine": "q35", "vm_firmware": "ovmf", "vm_cpu": "host",
          "vm_onboot": False, "vm_storage": "local-zfs", "vm_disk_gb": 200, "vm_bridge": "vmbr0",
          "vm_efi_pre_enrolled_keys": False}  # fmt: skip
    cfg = {"cores": "8", "memory": "16384", "machine": "q35", "bios": "ovmf", "cpu": "host", "onboot": "0",
           "balloon": "4096", "scsi0": "local-zfs:vm-102-disk-1,iothread=1,size=200G",
           "net0": "virtio=BC:24:11:00:00:03,bridge=vmbr0",
           "efidisk0": "local-zfs:vm-102-disk-0,efitype=4m,pre-enrolled-keys=0,size=1M"}  # fmt: skip
    assert vmspec.variables(vmoptions.read(cfg)) == {**vm, "vm_balloon_min_mib": 4096}
    assert vmspec.variables(vmoptions.read({**cfg, "balloon": "0", "machine": "pc-i440fx-9.2"})) == {
        **vm,
        "vm_balloon": False,
        "vm_machine": "i440fx",
    }


def test_an_unknown_host_key_is_refused_with_its_fingerprint_and_how_to_add_it():
    key = paramiko.RSAKey.generate(1024)
    with pytest.raises(discover_ssh.SshError) as exc:
        discover_ssh._Refuse().missing_host_key(None, "192.168.100.5", key)
    msg = str(exc.value)
    assert f"ssh-rsa {discover_ssh.fingerprint(key)}" in msg and "is not in known_hosts" in msg
    assert "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub" in msg and "ssh-keyscan 192.168.100.5" in msg
    assert discover_ssh.split_target("admin@node") == ("admin", "node")
    assert discover_ssh.split_target("node") == ("root", "node")
    with pytest.raises(discover_ssh.SshError, match=r"no SSH key at /nonexistent/key \(-i\)"):
        discover_ssh.Session("root@192.0.2.1", key_file="/nonexistent/key")


def test_the_sysfs_walk_reads_what_the_kernel_shows(tmp_path):
    """The walk (a shell script) over the lab's /sys tree: every function, its ids, boot_vga and group."""
    root = sysfs(tmp_path)
    node = Node(None, root)
    devices, groups, has_dir = discover.parse_sysfs(node.run(discover.SYSFS_SCRIPT)[1])
    assert has_dir and len(groups) == 16 and groups[13] == ["0000:02:00.0", "0000:02:00.1"]
    gpu = devices["0000:02:00.0"]
    assert (gpu.vendor, gpu.device, gpu.pci_class, gpu.boot_vga, gpu.group) == (
        "10de",
        "2204",
        "030000",
        True,
        13,
    )
    assert devices["0000:02:00.1"].boot_vga is None  # only display functions have boot_vga
    shutil.rmtree(root / "sys" / "kernel" / "iommu_groups")
    _, groups, has_dir = discover.parse_sysfs(node.run(discover.SYSFS_SCRIPT)[1])
    assert groups == {} and not has_dir


@pytest.fixture(scope="module")
def btrfs_sim(tmp_path_factory):
    yield from fixture_sim(tmp_path_factory, "btrfs")


def test_a_btrfs_node_gets_local_btrfs_and_a_snippet_storage_to_fill(btrfs_sim, tmp_path):
    """A BTRFS install: `local` disabled, local-btrfs without snippets (fixtures/btrfs.yml)."""
    found = discover.analyse(discover.collect(Node(btrfs_sim, sysfs(tmp_path)).run, "192.168.100.5", "root"))
    files = discover.render(found)
    main = yaml.safe_load(files["group_vars/all/main.yml"])
    assert main["gpulab_os_image"]["storage"] == "local-btrfs"
    assert main["gpulab_os_image"]["url"].startswith(
        "https://cloud-images.ubuntu.com/releases/noble/release-"
    )
    assert main["gpulab_snippet_storage"] == "CHANGE-ME"
    assert (
        "run `pvesm set local-btrfs --content iso,vztmpl,backup,images,rootdir,import,snippets` on the node"
        in " ".join(line.strip("# ") for line in files["group_vars/all/main.yml"].splitlines())
    )

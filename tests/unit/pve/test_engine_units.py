"""Pure parts of the engine: connection settings, VM spec building, mapping entries, download rules."""

from __future__ import annotations

import re

import pytest

from gpulab.pve import download, mapping, vm, vmconfig
from gpulab.pve.client import PveConnection, _encode
from gpulab.tasks import pve_vm as pve_vm_task


@pytest.mark.parametrize(
    ("kwargs", "fix"),
    [
        ({"api_url": "pve:8006", "token_id": "a@pve!t", "token_secret": "s"}, "is not a URL"),
        ({"api_url": "https://pve:8006", "token_id": "a@pve!t"}, "both api_token_id and api_token_secret"),
        ({"api_url": "https://pve:8006", "token_id": "root@pam", "token_secret": "s"}, "USER@REALM!TOKENID"),
        ({"api_url": "https://pve:8006", "user": "root@pam"}, "api_user + api_password"),
        (
            {"api_url": "https://pve:8006", "user": "root@pam", "password": "x", "fingerprint": "AB:CD"},
            "SHA-256",
        ),
    ],
)
def test_connection_settings_are_checked_with_the_fix(kwargs, fix):
    with pytest.raises(ValueError, match=fix.replace("+", r"\+")):
        PveConnection(**kwargs).check()


def test_connection_base_url_and_user():
    conn = PveConnection(api_url="https://pve:8006/api2/json/", token_id="root@pam!gpulab", token_secret="s")
    conn.check()
    assert conn.base_url == "https://pve:8006/api2/json"
    assert conn.userid == "root@pam!gpulab" and conn.uses_token


def test_form_values_are_what_pve_accepts():
    assert _encode({"a": True, "b": False, "c": None, "d": "x", "map": ["1", "2"]}) == {
        "a": 1,
        "b": 0,
        "d": "x",
        "map": ["1", "2"],
    }


def test_build_config_for_the_reference_gpu_vm():
    cfg, families = vm.build_config(
        name="vm-gpu",
        cores=8,
        memory=16384,
        balloon=0,
        machine="q35",
        bios="ovmf",
        cpu="host",
        onboot=False,
        efidisk={"storage": "local-zfs", "pre_enrolled_keys": False},
        disks=[{"slot": "scsi0", "storage": "local-zfs", "size_gb": 200, "iothread": True}],
        nets=[{"bridge": "vmbr0", "macaddr": "bc:24:11:00:00:01"}],
        hostpci=[{"mapping": "rtx3090", "pcie": True}],
        cloudinit={"storage": "local-zfs", "user": "ubuntu", "ssh_keys": ["ssh-ed25519 AAAA me@lab"]},
        serial_console=True,
        boot_order=["scsi0"],
    )
    assert families == ("net", "hostpci")
    assert cfg["efidisk0"] == "local-zfs:1,efitype=4m,pre-enrolled-keys=0"
    assert cfg["scsi0"] == "local-zfs:200,iothread=1"
    assert cfg["net0"] == "virtio,bridge=vmbr0,macaddr=BC:24:11:00:00:01"
    assert cfg["hostpci0"] == "mapping=rtx3090,pcie=1"
    assert cfg["ide2"] == "local-zfs:cloudinit" and cfg["sshkeys"] == "ssh-ed25519%20AAAA%20me%40lab"
    assert cfg["onboot"] == "0" and cfg["balloon"] == "0" and cfg["boot"] == "order=scsi0"
    assert cfg["serial0"] == "socket" and cfg["vga"] == "serial0"


def test_build_config_i440fx_is_pvess_pc_and_conflicts_are_refused():
    cfg, _ = vm.build_config(name="vm-1", machine="i440fx")
    assert cfg["machine"] == "pc"
    with pytest.raises(vm.VmError, match="give mapping, host, or both"):
        vm.build_config(name="x", hostpci=[{"pcie": True}])
    with pytest.raises(vm.VmError, match="both want ide2"):
        vm.build_config(name="x", cdrom="local:iso/a.iso", cloudinit={"storage": "local-zfs"})


def test_own_families_remove_extra_nics_and_devices_only():
    spec = vm.VmSpec("pve", 100, "vm-1", {"net0": "virtio,bridge=vmbr0"}, ("net", "hostpci"))
    current = {
        "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0",
        "net1": "e1000,bridge=vmbr1",
        "hostpci0": "0000:02:00",
    }
    assert vm._family_deletes(spec, current) == {"net1": None, "hostpci0": None}
    change = vmconfig.diff(current, {**spec.config, **vm._family_deletes(spec, current)})
    assert sorted(change.delete) == ["hostpci0", "net1"] and change.set == {}


@pytest.mark.parametrize(("user", "token"), [(None, "root@pam!gpulab"), ("admin@pve", None)])
def test_a_raw_device_without_a_root_password_login_is_refused_with_the_way_out(user, token):
    mod = pve_vm_task
    conn = PveConnection(
        api_url="https://pve:8006",
        user=user,
        password="x" if user else None,
        token_id=token,
        token_secret="s" if token else None,
    )
    with pytest.raises(ValueError, match=rf"{re.escape(conn.userid)}.*pve_pci_mapping"):
        mod.refuse_raw_hostpci([{"host": "0000:02:00"}], conn)
    mod.refuse_raw_hostpci([{"mapping": "rtx3090"}], conn)  # a mapping is fine for any login
    root = PveConnection(api_url="https://pve:8006", user="root@pam", password="x")
    mod.refuse_raw_hostpci([{"host": "0000:02:00"}], root)


def test_map_entries_are_written_and_compared_as_pve_keeps_them():
    entry = mapping.map_entry(
        {
            "node": "pve",
            "path": "0000:02:00",
            "id": "0x10DE:0x2204",
            "iommugroup": "13",
            "subsystem_id": "1462:3881",
        }
    )
    assert entry == "node=pve,path=0000:02:00,id=10de:2204,iommugroup=13,subsystem-id=1462:3881"
    assert (
        mapping.normalise_map("subsystem-id=1462:3881,iommugroup=13,id=10DE:2204,path=0000:02:00,node=pve")
        == entry
    )
    with pytest.raises(mapping.MappingError, match="vendor:device"):
        mapping.map_entry({"node": "pve", "path": "0000:02:00", "id": "2204"})


@pytest.mark.parametrize(
    ("name", "normalised"),
    [("noble.qcow2", "noble.qcow2"), ("/tmp/x/ubuntu 24.iso", "ubuntu_24.iso"), ("a\\b\\c.img", "c.img")],
)
def test_download_filenames_as_pve_normalises_them(name, normalised):
    assert download.normalise_filename(name) == normalised


def test_download_progress_is_the_last_percentage():
    assert download.progress_of(["0M of 585M (0.00%)", "292M of 585M (49.91%)", "checksum verified"]) == 49.91
    assert download.progress_of(["downloading"]) is None


@pytest.mark.parametrize(
    ("log", "fix"),
    [
        (["TASK ERROR: PCI device mapping not found for 'rtx3090'"], "no PCI resource mapping 'rtx3090'"),
        (["TASK ERROR: VM 102 already running"], "started by someone else"),
        (["TASK ERROR: VM is locked (backup)"], "qm unlock 102"),
        (["TASK ERROR: PCI device '0000:02:00.0' already in use by VMID '240'"], "passed through to VM 240"),
        (
            [
                "kvm: -device vfio-pci,host=0000:02:00.0: ... VFIO_MAP_DMA failed: Cannot allocate memory",
                "TASK ERROR: start failed: QEMU exited with code 1",
            ],
            "free memory",
        ),
        (["TASK ERROR: something new"], "pvesh get /nodes/pve/tasks/UPID:pve:1:2:3:qmstart:102:u:/log"),
    ],
)
def test_a_failed_start_names_the_task_log_lines_and_the_fix(log, fix):
    from gpulab.pve.client import PveTaskError

    upid = "UPID:pve:1:2:3:qmstart:102:u:"
    status = log[-1].removeprefix("TASK ERROR: ")
    exc = PveTaskError(f"task failed: {status}", "start VM 102", upid, ["", *log])
    msg = str(vm.start_failure(exc, 102, "vm-gpu", "pve"))
    assert msg.startswith("starting VM 102 (vm-gpu) on node pve failed, PVE's task log ends: ")
    assert " / ".join(log) in msg and fix in msg, msg


class _AgentClient:
    """A PVE client whose guest agent answers file-read from `files` after `not_up` refusals."""

    def __init__(self, files: dict[str, str], not_up: int = 0, refuse: int | None = None):
        self.files, self.not_up, self.refuse, self.calls = files, not_up, refuse, []

    def get(self, path, **params):
        from gpulab.pve.client import PveError

        self.calls.append(params["file"])
        if self.refuse:
            raise PveError("Permission check failed (/vms/100, VM.GuestAgent.FileRead)", status=self.refuse)
        if self.not_up:
            self.not_up -= 1
            raise PveError("QEMU guest agent is not running", status=500)
        if params["file"] not in self.files:
            raise PveError(
                f"VM 100 qga command 'guest-file-open' failed - failed to open file '{params['file']}' "
                "(mode: 'r'): No such file or directory",
                status=500,
            )
        return {"content": self.files[params["file"]], "bytes-read": len(self.files[params["file"]])}


ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKyMLHFbXnsOH0FZ9ngw/zQa9cTJzHp5y5V+Yq6BvQvm"


def test_host_keys_are_read_through_the_agent_once_it_is_up_types_it_lacks_left_out():
    client = _AgentClient({vm.HOST_KEY_FILES[0]: f"{ED25519} root@vm-1\n"}, not_up=2)
    keys = vm.read_host_keys(client, "pve", 100, timeout=5, poll=0.01)
    assert keys == [ED25519]  # the comment left out; no ecdsa or rsa file: no line for them
    assert client.calls.count(vm.HOST_KEY_FILES[0]) == 3  # asked again while the agent was not up


def test_host_keys_a_refusal_or_a_guest_without_keys_or_a_wrong_file_is_an_error_at_once():
    with pytest.raises(vm.VmError, match=r"VM\.GuestAgent\.FileRead"):
        vm.read_host_keys(_AgentClient({}, refuse=403), "pve", 100, timeout=5, poll=0.01)
    with pytest.raises(vm.VmError, match="has no SSH host key the guest agent can read"):
        vm.read_host_keys(_AgentClient({}), "pve", 100, timeout=5, poll=0.01)
    with pytest.raises(vm.VmError, match="does not hold an SSH public host key"):
        vm.read_host_keys(_AgentClient({vm.HOST_KEY_FILES[0]: "-----BEGIN"}), "pve", 100, timeout=5)
    with pytest.raises(vm.VmError, match=r"within 0s .*QEMU guest agent is not running"):
        vm.read_host_keys(_AgentClient({}, not_up=99), "pve", 100, timeout=0, poll=0.01)

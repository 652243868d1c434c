"""The qemu room (labsim.pve_qemu), a VM's life: create, config, pending, digest, locks, the hostpci rules
of a config write (root@pam and the rest), power and the start's checks, resize, destroy."""

from __future__ import annotations

import ipaddress
import re
import time

import pytest
from unit.labsim.pve_sim_client import MAP, create_vm, download_iso

from labsim.fixture import load_fixture, network_settings
from labsim.pve_tasks import UPID_RE


def test_create_allocates_disks_and_mac_and_locks_while_running(api, lab):
    upid = api.data(
        "POST",
        "/nodes/pve/qemu",
        vmid=200,
        name="vm-1",
        memory="4096",
        cores=4,
        scsi0="local-zfs:60,iothread=1,discard=on",
        net0="virtio,bridge=vmbr0",
        efidisk0="local-zfs:1,efitype=4m,pre-enrolled-keys=0",
        bios="ovmf",
    )
    assert UPID_RE.match(upid)
    assert upid.split(":")[5:8] == ["qmcreate", "200", "gpulab@pve!ansible"]
    r = api.put("/nodes/pve/qemu/200/config", name="other")
    assert r.status_code == 500
    assert r.json()["message"].strip() == "VM is locked (create)"
    assert api.wait(upid)["exitstatus"] == "OK"
    cfg = api.data("GET", "/nodes/pve/qemu/200/config")
    assert cfg["scsi0"] == "local-zfs:vm-200-disk-1,discard=on,iothread=1,size=60G"
    assert cfg["efidisk0"].startswith("local-zfs:vm-200-disk-0,efitype=4m,pre-enrolled-keys=0,size=")
    assert re.fullmatch(r"virtio=BC:24:11:[0-9A-F]{2}:[0-9A-F]{2}:[0-9A-F]{2},bridge=vmbr0", cfg["net0"])
    assert cfg["cores"] == 4 and cfg["memory"] == "4096"
    assert re.fullmatch(r"[0-9a-f]{40}", cfg["digest"])
    vols = {v["volid"] for v in api.data("GET", "/nodes/pve/storage/local-zfs/content")}
    assert {"local-zfs:vm-200-disk-0", "local-zfs:vm-200-disk-1"} <= vols


def test_existing_vmid_is_refused(api):
    create_vm(api, 201)
    r = api.post("/nodes/pve/qemu", vmid=201)
    assert r.status_code == 500
    assert r.json()["message"].strip() == "unable to create VM 201 - VM 201 already exists on node 'pve'"


def test_drive_rules(api):
    r = api.post("/nodes/pve/qemu", vmid=202, scsi0="60")  # the schema's volume-id format refuses a bare size
    assert r.json()["errors"] == {
        "scsi0": "invalid format - format error\nscsi0.file: unable to parse volume ID '60'\n"
    }
    r = api.post("/nodes/pve/qemu", vmid=202, scsi0="local-zfs:5,import-from=local:import/x.qcow2")
    assert r.json()["errors"]["scsi0"].startswith("'import-from' requires special syntax")
    r = api.post("/nodes/pve/qemu", vmid=202, scsi0="local:5")
    assert r.status_code == 500 and "does not support content-type 'images'" in r.json()["message"]
    r = api.post("/nodes/pve/qemu", vmid=202, ide2="local:iso/none.iso,media=cdrom")
    assert (
        r.status_code == 500 and r.json()["message"].strip() == "volume 'local:iso/none.iso' does not exist"
    )


def test_config_post_is_async_put_is_sync_and_stale_digest_is_refused(api):
    cfg = create_vm(api, 210)
    upid = api.data("POST", "/nodes/pve/qemu/210/config", cores=3, digest=cfg["digest"])
    assert upid.split(":")[5] == "qmconfig"
    assert api.wait(upid)["exitstatus"] == "OK"
    r = api.put("/nodes/pve/qemu/210/config", cores=5, digest=cfg["digest"])
    assert r.status_code == 500
    assert (
        r.json()["message"].strip()
        == "detected modified configuration - file changed by other user? Try again."
    )
    r = api.put("/nodes/pve/qemu/210/config", cores=5)
    assert r.status_code == 200 and r.json()["data"] is None
    new = api.data("GET", "/nodes/pve/qemu/210/config")
    assert new["cores"] == 5 and new["digest"] != cfg["digest"]


def test_delete_turns_disk_into_unused_and_deleting_unused_destroys_it(api):
    create_vm(api, 211)
    api.data("PUT", "/nodes/pve/qemu/211/config", delete="scsi0")
    cfg = api.data("GET", "/nodes/pve/qemu/211/config")
    assert "scsi0" not in cfg and cfg["unused0"] == "local-zfs:vm-211-disk-0"
    api.data("PUT", "/nodes/pve/qemu/211/config", delete="unused0")
    vols = {v["volid"] for v in api.data("GET", "/nodes/pve/storage/local-zfs/content")}
    assert "local-zfs:vm-211-disk-0" not in vols
    r = api.put("/nodes/pve/qemu/211/config", cores=2, delete="cores")
    assert r.status_code == 400 and "delete" in r.json()["errors"]


def test_running_vm_keeps_cold_changes_pending_until_restart(api):
    api.data(
        "POST",
        "/cluster/mapping/pci",
        id="rtx3090",
        map="node=pve,path=0000:02:00,id=10de:2204,iommugroup=13,subsystem-id=1462:3881",
    )
    create_vm(api, 220, machine="q35")
    assert api.run("POST", "/nodes/pve/qemu/220/status/start")["exitstatus"] == "OK"
    api.run("POST", "/nodes/pve/qemu/220/config", cores=6, name="renamed", hostpci0="mapping=rtx3090,pcie=1")
    current = api.data("GET", "/nodes/pve/qemu/220/config", current=1)
    merged = api.data("GET", "/nodes/pve/qemu/220/config")
    assert current["name"] == "renamed" and current["cores"] == 2 and "hostpci0" not in current
    assert merged["cores"] == 6 and merged["hostpci0"] == "mapping=rtx3090,pcie=1"
    pending = {p["key"]: p for p in api.data("GET", "/nodes/pve/qemu/220/pending")}
    assert pending["cores"]["value"] == 2 and pending["cores"]["pending"] == 6
    assert "pending" not in pending["name"]
    api.run("POST", "/nodes/pve/qemu/220/status/stop")
    api.run("POST", "/nodes/pve/qemu/220/status/start")
    current = api.data("GET", "/nodes/pve/qemu/220/config", current=1)
    assert current["cores"] == 6 and current["hostpci0"] == "mapping=rtx3090,pcie=1"
    api.run("POST", "/nodes/pve/qemu/220/status/stop")


def test_power_cycle_status_and_agent(api, lab):
    create_vm(api, 230)
    r = api.get("/nodes/pve/qemu/230/agent/network-get-interfaces")
    assert r.status_code == 500 and r.json()["message"].strip() == "VM 230 is not running"
    r = api.post("/nodes/pve/qemu/230/status/shutdown")
    assert r.status_code == 500 and r.json()["message"].strip() == "VM 230 not running"
    api.run("POST", "/nodes/pve/qemu/230/status/start")
    assert api.data("GET", "/nodes/pve/qemu/230/status/current")["status"] == "running"
    st = api.run("POST", "/nodes/pve/qemu/230/status/start")  # PVE's task refuses it, the call does not
    assert st["exitstatus"] == "VM 230 already running"
    assert api.data("GET", "/nodes/pve/qemu/230/status/current")["status"] == "running"
    r = api.delete("/nodes/pve/qemu/230")
    assert r.status_code == 500 and "is running - destroy failed" in r.json()["message"]
    deadline = time.monotonic() + 5
    while True:
        r = api.get("/nodes/pve/qemu/230/agent/network-get-interfaces")
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        assert r.json()["message"].strip() == "QEMU guest agent is not running"
        time.sleep(0.05)
    ifaces = r.json()["data"]["result"]
    mac = (
        re.search(r"=([0-9A-F:]{17})", api.data("GET", "/nodes/pve/qemu/230/config")["net0"]).group(1).lower()
    )
    nic = next(i for i in ifaces if i["hardware-address"] == mac)
    addr = next(a["ip-address"] for a in nic["ip-addresses"] if a["ip-address-type"] == "ipv4")
    net = network_settings(load_fixture(None))
    assert (
        ipaddress.ip_address(net["pool_first"])
        <= ipaddress.ip_address(addr)
        <= ipaddress.ip_address(net["pool_last"])
    )
    assert api.data("GET", "/nodes/pve/qemu/230/agent/network-get-interfaces") == r.json()["data"]
    api.run("POST", "/nodes/pve/qemu/230/status/shutdown")
    assert api.data("GET", "/nodes/pve/qemu/230/status/current")["status"] == "stopped"
    st = api.run("DELETE", "/nodes/pve/qemu/230")
    assert st["exitstatus"] == "OK"
    r = api.get("/nodes/pve/qemu/230/config")
    assert r.status_code == 500 and "does not exist" in r.json()["message"]


def test_agent_needs_agent_option(api):
    create_vm(api, 231, agent="0")
    api.run("POST", "/nodes/pve/qemu/231/status/start")
    r = api.get("/nodes/pve/qemu/231/agent/network-get-interfaces")
    assert r.status_code == 500 and r.json()["message"].strip() == "No QEMU guest agent configured"
    api.run("POST", "/nodes/pve/qemu/231/status/stop")


def test_pcie_needs_q35_at_start_and_gpu_is_exclusive(root):
    root.run("POST", "/nodes/pve/qemu", vmid=240, memory="1024", hostpci0="0000:02:00,pcie=1")
    st = root.run("POST", "/nodes/pve/qemu/240/status/start")
    assert st["exitstatus"] == "q35 machine model is not enabled"
    root.data("PUT", "/nodes/pve/qemu/240/config", machine="q35")
    assert root.run("POST", "/nodes/pve/qemu/240/status/start")["exitstatus"] == "OK"
    root.run("POST", "/nodes/pve/qemu", vmid=241, memory="1024", machine="q35", hostpci0="0000:02:00.0")
    st = root.run("POST", "/nodes/pve/qemu/241/status/start")
    assert st["exitstatus"] == "PCI device '0000:02:00.0' already in use by VMID '240'"
    root.run("POST", "/nodes/pve/qemu/240/status/stop")


def test_memory_of_the_host_runs_out(root):
    root.run("POST", "/nodes/pve/qemu", vmid=250, memory="24000")
    root.run("POST", "/nodes/pve/qemu", vmid=251, memory="16384")
    assert root.run("POST", "/nodes/pve/qemu/250/status/start")["exitstatus"] == "OK"
    st = root.run("POST", "/nodes/pve/qemu/251/status/start")
    assert st["exitstatus"] == "start failed: QEMU exited with code 1"
    mem = root.data("GET", "/nodes/pve/status")["memory"]
    assert mem["used"] >= 24000 * 2**20
    root.run("POST", "/nodes/pve/qemu/250/status/stop")


def test_resize_grows_only(api):
    create_vm(api, 260)
    assert api.run("PUT", "/nodes/pve/qemu/260/resize", disk="scsi0", size="+2G")["exitstatus"] == "OK"
    assert ",size=10G" in api.data("GET", "/nodes/pve/qemu/260/config")["scsi0"]
    r = api.put("/nodes/pve/qemu/260/resize", disk="scsi0", size="4G")
    assert r.status_code == 500 and r.json()["message"].strip() == "shrinking disks is not supported"
    r = api.put("/nodes/pve/qemu/260/resize", disk="scsi5", size="+1G")
    assert r.status_code == 500 and r.json()["message"].strip() == "disk 'scsi5' does not exist"


def test_background_delay_answers_null_when_the_task_is_done(api):
    create_vm(api, 280)
    r = api.post("/nodes/pve/qemu/280/config", cores=4, background_delay=5)
    assert r.status_code == 200 and r.json()["data"] is None
    assert api.data("GET", "/nodes/pve/qemu/280/config")["cores"] == 4


class _FailingHooks:
    """Stand-in for the network lab's hooks whose VM host cannot start."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = []

    def vm_started(self, node, vmid, config):
        self.calls.append(("started", vmid))
        raise RuntimeError("no namespace for you")

    def vm_stopped(self, node, vmid):
        self.calls.append(("stopped", vmid))
        raise RuntimeError("already gone")

    def vm_destroyed(self, node, vmid):
        self.calls.append(("destroyed", vmid))

    def guest_interfaces(self, node, vmid, config):
        raise RuntimeError("guest is silent")


def test_hook_failures_end_the_start_task_and_leave_the_vm_stopped(lab, api):
    create_vm(api, 290)
    original = lab.server.lab.hooks
    lab.server.lab.hooks = hooks = _FailingHooks(original)
    try:
        st = api.run("POST", "/nodes/pve/qemu/290/status/start")
        assert st["exitstatus"] == "start failed: lab host for VM 290 did not come up: no namespace for you"
        assert api.data("GET", "/nodes/pve/qemu/290/status/current")["status"] == "stopped"
        lab.server.lab.hooks = original
        api.run("POST", "/nodes/pve/qemu/290/status/start")
        lab.server.lab.hooks = hooks
        time.sleep(0.25)  # past agent_delay
        r = api.get("/nodes/pve/qemu/290/agent/network-get-interfaces")
        assert r.status_code == 500 and r.json()["message"].strip() == "QEMU guest agent is not running"
        assert api.run("POST", "/nodes/pve/qemu/290/status/stop")["exitstatus"] == "OK"
        assert api.run("DELETE", "/nodes/pve/qemu/290")["exitstatus"] == "OK"
        assert hooks.calls == [("started", 290), ("stopped", 290), ("destroyed", 290)]
    finally:
        lab.server.lab.hooks = original


def test_cloudinit_drive_and_options(api):
    cfg = create_vm(
        api,
        295,
        ide2="local-zfs:cloudinit",
        ciuser="ubuntu",
        cipassword="s3cret",
        sshkeys="ssh-ed25519%20AAAAC3NzaC1lZDI1NTE5AAAAIB%20me%40lab%0A",
        ipconfig0="ip=dhcp",
    )
    assert cfg["ide2"] == "local-zfs:vm-295-cloudinit,media=cdrom"
    assert cfg["cipassword"] == "**********" and cfg["ciuser"] == "ubuntu"
    assert cfg["sshkeys"] == "ssh-ed25519%20AAAAC3NzaC1lZDI1NTE5AAAAIB%20me%40lab%0A"
    vols = {v["volid"] for v in api.data("GET", "/nodes/pve/storage/local-zfs/content", vmid=295)}
    assert "local-zfs:vm-295-cloudinit" in vols
    r = api.put("/nodes/pve/qemu/295/config", sshkeys="ssh-ed25519 AAAA me@lab")
    assert (
        r.status_code == 400
        and r.json()["errors"]["sshkeys"] == "value 'ssh-ed25519 AAAA me@lab' is not urlencoded"
    )
    api.data("PUT", "/nodes/pve/qemu/295/config", delete="ide2")
    assert "local-zfs:vm-295-cloudinit" not in {
        v["volid"] for v in api.data("GET", "/nodes/pve/storage/local-zfs/content")
    }
    assert "unused0" not in api.data("GET", "/nodes/pve/qemu/295/config"), (
        "a cloud-init drive is removed, not kept"
    )


def test_running_vm_takes_fast_plug_options_and_cdrom_at_once_but_not_agent(api):
    download_iso(api)
    create_vm(api, 296, agent="0", ide2="none,media=cdrom")
    api.run("POST", "/nodes/pve/qemu/296/status/start")
    api.run(
        "POST",
        "/nodes/pve/qemu/296/config",
        agent="enabled=1",
        name="live-name",
        ide2="local:iso/u.iso,media=cdrom",
    )
    current = api.data("GET", "/nodes/pve/qemu/296/config", current=1)
    assert current["name"] == "live-name"
    assert current["ide2"].startswith("local:iso/u.iso,media=cdrom,size=")
    assert current["agent"] == "0", "the agent option waits for the next start"
    api.run("POST", "/nodes/pve/qemu/296/status/stop")


def test_config_keys_need_their_own_privilege(lab, api):
    create_vm(api, 297)
    limited = lab.token_api("nomap@pve!tk", "nomap-secret")
    r = limited.put("/nodes/pve/qemu/297/config", net1="virtio,bridge=vmbr0")
    assert r.status_code == 403
    assert r.json()["message"].strip() == "Permission check failed (/vms/297, VM.Config.Network)"
    r = limited.put("/nodes/pve/qemu/297/config", ciuser="ubuntu")
    assert r.json()["message"].strip() == "Permission check failed (/vms/297, VM.Config.Cloudinit)"
    assert limited.put("/nodes/pve/qemu/297/config", cores=3).status_code == 200


def test_skiplock_is_root_only(api, root):
    create_vm(api, 298)
    r = api.post("/nodes/pve/qemu/298/status/start", skiplock=1)
    assert r.status_code == 400 and r.json()["errors"] == {"skiplock": "Only root may use this option."}
    assert root.run("POST", "/nodes/pve/qemu/298/status/start", skiplock=1)["exitstatus"] == "OK"
    root.run("POST", "/nodes/pve/qemu/298/status/stop")


# ------------------------------------------------------------------------ the hostpci rules of a config write


@pytest.mark.parametrize("who", ["project_token", "root_token"])
def test_raw_hostpci_is_refused_for_every_token_even_roots(lab, who):
    api = lab.token_api() if who == "project_token" else lab.token_api("root@pam!full", "root-token-secret")
    r = api.post("/nodes/pve/qemu", vmid=570, hostpci0="0000:02:00,pcie=1")
    assert r.status_code == 500
    assert r.json()["message"].strip() == "only root can set 'hostpci0' config for non-mapped devices"


def test_raw_hostpci_works_for_root_password_ticket(root):
    st = root.run("POST", "/nodes/pve/qemu", vmid=571, machine="q35", hostpci0="0000:02:00,pcie=1")
    assert st["exitstatus"] == "OK"
    assert root.data("GET", "/nodes/pve/qemu/571/config")["hostpci0"] == "0000:02:00,pcie=1"


def test_changing_a_raw_hostpci_needs_root_too(lab, root, api):
    root.run("POST", "/nodes/pve/qemu", vmid=572, machine="q35", hostpci0="0000:02:00,pcie=1")
    r = api.post("/nodes/pve/qemu/572/config", delete="hostpci0")
    assert r.status_code == 500
    assert "only root can set 'hostpci0'" in r.json()["message"]


def test_mapped_hostpci_works_with_the_project_token_and_needs_mapping_use(lab, api):
    assert api.post("/cluster/mapping/pci", id="card", map=MAP).status_code == 200
    st = api.run("POST", "/nodes/pve/qemu", vmid=573, machine="q35", hostpci0="mapping=card,pcie=1")
    assert st["exitstatus"] == "OK"
    r = lab.token_api("nomap@pve!tk", "nomap-secret").post(
        "/nodes/pve/qemu", vmid=574, hostpci0="mapping=card"
    )
    assert r.status_code == 403
    assert r.json()["message"].strip() == "Permission check failed (/mapping/pci/card, Mapping.Use)"


def test_pve_config_hostpci_perm(lab, root, api):
    """qemu-server's check_hostpci_perm: nothing for root@pam; for others a raw host (with a mapping too) is
    root's, neither host nor mapping is refused, and a romfile is a parameter error."""
    st = root.run(
        "POST", "/nodes/pve/qemu", vmid=575, hostpci0="0000:02:00,mapping=rtx3090", hostpci1="pcie=1"
    )
    assert st["exitstatus"] == "OK"
    r = api.post("/nodes/pve/qemu", vmid=576, hostpci0="0000:02:00,mapping=rtx3090")
    assert r.status_code == 500
    assert r.json()["message"].strip() == "only root can set 'hostpci0' config for non-mapped devices"
    r = api.post("/nodes/pve/qemu", vmid=576, hostpci0="pcie=1")
    assert r.status_code == 500 and r.json()["message"].strip() == "either 'host' or 'mapping' must be set."
    r = api.post("/nodes/pve/qemu", vmid=576, hostpci0="mapping=rtx3090,romfile=vbios.bin")
    assert r.status_code == 400
    assert r.json()["errors"] == {"hostpci0": "only root@pam can set 'romfile' option"}


# -------------------------------------------------------------------- what the start checks (UPSTREAM.md)


def _task_log(api, upid: str) -> list[str]:
    return [line["t"] for line in api.data("GET", f"/nodes/pve/tasks/{upid}/log")]


def test_pve_config_mapping_missing(api):
    """A config write takes a hostpci whose mapping does not exist: PVE checks only Mapping.Use on it."""
    create_vm(api, 360, machine="q35", memory="1024", hostpci0="mapping=no-such-card,pcie=1")
    assert api.data("GET", "/nodes/pve/qemu/360/config")["hostpci0"] == "mapping=no-such-card,pcie=1"
    st = api.run("POST", "/nodes/pve/qemu/360/config", hostpci1="mapping=other-card")
    assert st["exitstatus"] == "OK"


def test_pve_start_mapping_missing(api):
    """The start task fails on a mapping that does not exist (or has no entry for the node); the call
    answers a UPID, the task ends with the error as its exit status and its log's last line."""
    create_vm(api, 361, machine="q35", memory="1024", hostpci0="mapping=no-such-card,pcie=1")
    upid = api.data("POST", "/nodes/pve/qemu/361/status/start")
    assert upid.split(":")[5:7] == ["qmstart", "361"]
    st = api.wait(upid)
    assert st["exitstatus"] == "PCI device mapping not found for 'no-such-card'"
    assert _task_log(api, upid)[-1] == "TASK ERROR: PCI device mapping not found for 'no-such-card'"
    assert api.data("GET", "/nodes/pve/qemu/361/status/current")["status"] == "stopped"


def test_pve_start_already_running(api):
    """Starting a running VM: a UPID, then a task ending in "VM N already running"; the VM keeps running."""
    create_vm(api, 362, memory="1024")
    assert api.run("POST", "/nodes/pve/qemu/362/status/start")["exitstatus"] == "OK"
    upid = api.data("POST", "/nodes/pve/qemu/362/status/start")
    assert api.wait(upid)["exitstatus"] == "VM 362 already running"
    assert _task_log(api, upid) == ["TASK ERROR: VM 362 already running"]
    assert api.data("GET", "/nodes/pve/qemu/362/status/current")["status"] == "running"
    api.run("POST", "/nodes/pve/qemu/362/status/stop")


def test_pve_start_host_and_mapping(root):
    """root@pam may write host and mapping together; the start refuses them."""
    root.run("POST", "/nodes/pve/qemu", vmid=363, memory="1024", hostpci0="0000:02:00,mapping=rtx3090")
    assert root.data("GET", "/nodes/pve/qemu/363/config")["hostpci0"] == "0000:02:00,mapping=rtx3090"
    st = root.run("POST", "/nodes/pve/qemu/363/status/start")
    assert st["exitstatus"] == "Cannot set both 'host' and 'mapping'."
    root.data("PUT", "/nodes/pve/qemu/363/config", hostpci0="pcie=1")
    st = root.run("POST", "/nodes/pve/qemu/363/status/start")
    assert st["exitstatus"] == "Either 'host' or 'mapping' must be set."


def test_pve_start_locked(api):
    """A start while the VM is being created answers a UPID; its task ends in the lock's error."""
    create = api.data(
        "POST", "/nodes/pve/qemu", vmid=364, memory="1024", scsi0="local-zfs:1", net0="virtio,bridge=vmbr0"
    )
    upid = api.data("POST", "/nodes/pve/qemu/364/status/start")
    assert api.wait(upid)["exitstatus"] == "VM is locked (create)"
    assert api.wait(create)["exitstatus"] == "OK"
    assert api.data("GET", "/nodes/pve/qemu/364/status/current")["status"] == "stopped"


@pytest.fixture(scope="module")
def btrfs_api(tmp_path_factory):
    """fixtures/btrfs.yml (`local` disabled) in a lab of its own, as root@pam."""
    from unit.labsim.conftest import InProcessPveSim, start_lab, stop_lab

    from labsim.fixture import resolve_fixture

    root = tmp_path_factory.mktemp("btrfs")
    server, desc, thread = start_lab(root / "state", resolve_fixture("btrfs"))
    yield InProcessPveSim(server, desc, root / "state").root_api()
    stop_lab(server, thread)


def test_pve_start_snippet_storage_disabled(btrfs_api):
    """A cloud-init VM whose vendor snippet is on a disabled storage: the config is written (qemu-server checks
    no storage there), the start task fails with "storage 'local' is disabled" and the VM stays stopped; the
    same snippet on an enabled storage starts."""
    api = btrfs_api
    api.run(
        "POST",
        "/nodes/pve/qemu",
        vmid=370,
        memory="1024",
        scsi0="local-btrfs:4",
        ide2="local-btrfs:cloudinit",
        cicustom="vendor=local:snippets/gpulab-vendor.yaml",
    )
    st = api.run("POST", "/nodes/pve/qemu/370/status/start")
    assert st["exitstatus"] == "storage 'local' is disabled"
    assert api.data("GET", "/nodes/pve/qemu/370/status/current")["status"] == "stopped"
    api.data("POST", "/nodes/pve/qemu/370/config", cicustom="vendor=local-btrfs:snippets/gpulab-vendor.yaml")
    assert api.run("POST", "/nodes/pve/qemu/370/status/start")["exitstatus"] == "OK"
    api.run("POST", "/nodes/pve/qemu/370/status/stop")

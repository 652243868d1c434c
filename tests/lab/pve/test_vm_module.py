"""pve_vm against the strict PVE simulator."""

from __future__ import annotations

import json

from unit.pve.conftest import download_iso, gpu_vm_args, prepare_gpu_lab, run_module, small_vm_args


def test_check_mode_on_a_fresh_lab_shows_the_vm_and_writes_nothing(lab):
    mark = lab.mark()
    res = run_module("pve_vm", gpu_vm_args(lab, state="started"), check=True, diff=True)
    assert res["changed"] and res["created"], res
    assert res["actions"] == ["create", "start"]
    assert lab.writes(mark) == []
    after = res["diff"]["after"]
    assert res["diff"]["before"] == {}
    assert after["machine"] == "q35" and after["bios"] == "ovmf" and after["cpu"] == "host"
    assert after["hostpci0"] == "mapping=rtx3090,pcie=1"
    assert after["efidisk0"].startswith("local-zfs:new") and "efitype=4m" in after["efidisk0"]
    assert "size=200G" in after["scsi0"]
    assert res["requests"] == {"reads": 1, "writes": 0}


def test_create_is_one_call_then_a_second_run_reads_twice_and_writes_nothing(lab):
    prepare_gpu_lab(lab)
    mark = lab.mark()
    # this one in a fresh interpreter, as Ansible runs it
    res = run_module("pve_vm", gpu_vm_args(lab, state="started"), diff=True, subprocess_run=True)
    assert not res.get("failed"), res
    assert res["changed"] and res["created"] and res["status"] == "running"
    writes = [f"{w['method']} {w['path'].split('/api2/json')[1]}" for w in lab.writes(mark)]
    assert writes == [
        "POST /nodes/pve/qemu",
        "PUT /nodes/pve/qemu/102/resize",
        "POST /nodes/pve/qemu/102/status/start",
    ]
    assert lab.rejected(mark) == []
    cfg = res["config"]
    assert cfg["machine"] == "q35" and cfg["bios"] == "ovmf" and cfg["cpu"] == "host"
    assert cfg["cores"] == "8" and cfg["memory"] == "16384" and cfg["balloon"] == "0"
    assert cfg["hostpci0"] == "mapping=rtx3090,pcie=1"
    assert cfg["scsi0"].startswith("local-zfs:vm-102-disk-") and cfg["scsi0"].endswith("size=200G")
    assert res["mac"] and res["mac"] == res["mac"].lower()

    mark = lab.mark()
    again = run_module("pve_vm", gpu_vm_args(lab, state="started"), diff=True)
    assert not again.get("failed"), again
    assert again["changed"] is False
    assert again["actions"] == []
    assert lab.writes(mark) == []
    assert len(lab.requests(mark)) == 2
    assert again["requests"] == {"reads": 2, "writes": 0}
    assert again["diff"]["before"] == again["diff"]["after"]
    # `current` is the config as GET .../config gives it (the lab table reuses it instead of reading again).
    raw = {k: v for k, v in lab.client().get("nodes/pve/qemu/102/config").items() if k != "digest"}
    assert again["current"] == raw
    assert res["current"] == raw


def test_current_config_is_null_when_check_mode_plans_a_change(lab):
    prepare_gpu_lab(lab)
    run_module("pve_vm", gpu_vm_args(lab, state="started"))
    res = run_module("pve_vm", gpu_vm_args(lab, state="started", memory=8192), check=True)
    assert res["changed"] and res["current"] is None
    unchanged = run_module("pve_vm", gpu_vm_args(lab, state="started"), check=True)
    assert not unchanged["changed"] and unchanged["current"]["memory"] == "16384"


def test_efidisk_keys_off_and_raw_config_as_pve_stores_it(lab):
    prepare_gpu_lab(lab)
    run_module("pve_vm", gpu_vm_args(lab))
    raw = lab.client().get("nodes/pve/qemu/102/config")
    assert "pre-enrolled-keys=0" in raw["efidisk0"] and "efitype=4m" in raw["efidisk0"]
    assert raw["hostpci0"] == "mapping=rtx3090,pcie=1"
    assert str(raw.get("onboot", 0)) == "0"


def test_running_vm_hardware_change_is_pending_until_restart(lab):
    prepare_gpu_lab(lab)
    run_module("pve_vm", gpu_vm_args(lab, state="started"))
    res = run_module("pve_vm", gpu_vm_args(lab, state="started", cores=6), diff=True)
    assert res["changed"] and res["set"] == {"cores": "6"}
    assert res["restart_needed"] and "cores" in res["pending"]
    res = run_module("pve_vm", gpu_vm_args(lab, state="started", cores=6, restart=True))
    assert res["changed"] is False or res["restarted"], res
    pending = lab.client().get("nodes/pve/qemu/102/pending")
    assert res["restarted"] and not [p for p in pending if "pending" in p], (res, pending)


def test_predicted_restart_in_check_mode_and_no_write(lab):
    prepare_gpu_lab(lab)
    run_module("pve_vm", gpu_vm_args(lab, state="started"))
    mark = lab.mark()
    res = run_module("pve_vm", gpu_vm_args(lab, state="started", memory=20480), check=True)
    assert res["changed"] and res["restart_needed"] and res["pending"] == ["memory"]
    assert lab.writes(mark) == []


def test_removed_gpu_goes_through_delete_with_digest(lab):
    prepare_gpu_lab(lab)
    run_module("pve_vm", gpu_vm_args(lab))
    mark = lab.mark()
    res = run_module("pve_vm", gpu_vm_args(lab, hostpci=[]))
    assert res["delete"] == ["hostpci0"] and res["set"] == {}
    (write,) = lab.writes(mark)
    assert write["params"]["delete"] == "hostpci0"
    assert len(write["params"]["digest"]) == 40


def test_disk_grows_but_never_shrinks(lab):
    run_module("pve_vm", small_vm_args(lab))
    res = run_module(
        "pve_vm", small_vm_args(lab, disks=[{"storage": "local-zfs", "size_gb": 80, "iothread": True}])
    )
    assert res["resize"] == {"scsi0": "80G"} and "size=80G" in res["config"]["scsi0"]
    mark = lab.mark()
    res = run_module(
        "pve_vm", small_vm_args(lab, disks=[{"storage": "local-zfs", "size_gb": 40, "iothread": True}])
    )
    assert res["failed"] and "never shrink" in res["msg"] and "80G" in res["msg"]
    assert lab.writes(mark) == []


def test_state_stopped_and_absent(lab):
    run_module("pve_vm", small_vm_args(lab, state="started"))
    res = run_module("pve_vm", small_vm_args(lab, state="stopped"))
    assert res["changed"] and res["status"] == "stopped" and res["actions"] == ["shutdown"]
    assert run_module("pve_vm", small_vm_args(lab, state="stopped"))["changed"] is False
    res = run_module("pve_vm", small_vm_args(lab, state="absent"), diff=True)
    assert res["changed"] and res["diff"]["after"] == {}
    assert lab.client().get("cluster/resources", type="vm") == []
    assert run_module("pve_vm", small_vm_args(lab, state="absent"))["changed"] is False


def test_another_vm_with_the_id_is_not_taken_over(lab):
    run_module("pve_vm", small_vm_args(lab))
    mark = lab.mark()
    res = run_module("pve_vm", small_vm_args(lab, name="vm-other"))
    assert res["failed"] and "refusing to take over" in res["msg"]
    assert lab.writes(mark) == []


def test_raw_device_needs_root_password_login(lab):
    prepare_gpu_lab(lab)
    args = gpu_vm_args(lab, hostpci=[{"host": "0000:02:00", "pcie": True}])
    res = run_module("pve_vm", args)
    assert res["failed"] and "root@pam" in res["msg"] and "mapping" in res["msg"]
    # root@pam with a password: the raw address is attached
    args = {k: v for k, v in gpu_vm_args(lab, hostpci=[{"host": "0000:02:00", "pcie": True}]).items()
            if not k.startswith("api_token")}  # fmt: skip
    res = run_module("pve_vm", {**args, **lab.root_conn()})
    assert not res.get("failed"), res
    assert res["config"]["hostpci0"] == "0000:02:00,pcie=1"


def test_401_names_the_credentials(lab):
    res = run_module("pve_vm", small_vm_args(lab, api_token_secret="00000000-0000-0000-0000-000000000000"))
    assert res["failed"] and "401" in res["msg"] and "token" in res["msg"]


def test_403_names_the_missing_privilege(lab):
    from unit.pve.conftest import AUDITOR

    args = small_vm_args(
        lab, api_token_id=f"{AUDITOR['userid']}!{AUDITOR['tokenid']}", api_token_secret=AUDITOR["secret"]
    )
    res = run_module("pve_vm", args)
    assert res["failed"] and "403" in res["msg"]
    assert "VM.Allocate" in res["msg"], res["msg"]


def test_500s_are_retried_then_reported_with_the_call(lab):
    lab.inject(fail_next=2, fail_status=500, fail_message="pveproxy hiccup")
    mark = lab.mark()
    res = run_module("pve_vm", small_vm_args(lab))
    assert not res.get("failed"), res
    assert [r["status"] for r in lab.requests(mark)][:3] == [500, 500, 200]
    lab.inject(fail_next=10, fail_status=500, fail_message="pveproxy down")
    res = run_module("pve_vm", small_vm_args(lab))
    assert res["failed"] and "GET /cluster/resources" in res["msg"] and "pveproxy down" in res["msg"]
    assert "3 attempts" in res["msg"]
    lab.inject(fail_next=None)


def test_connection_reset_is_retried(lab):
    lab.inject(fail_next=1, fail_status="reset")
    res = run_module("pve_vm", small_vm_args(lab))
    assert not res.get("failed"), res
    assert res["created"]


def test_task_failure_reports_pves_message(lab):
    lab.inject(task_error_next=1, task_error_message="zfs error: out of space")
    res = run_module("pve_vm", small_vm_args(lab))
    assert res["failed"] and "out of space" in res["msg"] and "create VM 100" in res["msg"]


def test_a_start_with_a_missing_mapping_ends_the_run_with_the_task_log_and_the_fix(lab):
    """PVE takes the config and fails the start task; the module quotes the task log's line and the fix."""
    args = small_vm_args(
        lab, machine="q35", hostpci=[{"mapping": "no-such-card", "pcie": True}], state="started"
    )
    res = run_module("pve_vm", args)
    assert res["failed"], res
    msg = res["msg"]
    assert "starting VM 100 (vm-1) on node pve failed" in msg, msg
    assert "TASK ERROR: PCI device mapping not found for 'no-such-card'" in msg, msg
    assert "no PCI resource mapping 'no-such-card' with an entry for node pve" in msg, msg
    assert "pve_pci_mapping" in msg and "pve_gpus" in msg, msg
    vm = lab.client().get("nodes/pve/qemu/100/status/current")
    assert vm["status"] == "stopped"


def test_a_vm_started_by_someone_else_meanwhile_ends_the_run_with_the_fix(lab, monkeypatch):
    """The module found the VM stopped; someone starts it before the module's start, whose task then fails
    "already running": the run ends with that line and says to run again."""
    from gpulab.pve.vm import VmManager

    run_module("pve_vm", small_vm_args(lab))
    real_lookup = VmManager._lookup

    def lookup_then_someone_starts_it(self):
        entry = real_lookup(self)
        if entry is not None and entry.get("status") == "stopped":
            self.client.wait_task("pve", self.client.post("nodes/pve/qemu/100/status/start"), 30)
        return entry

    monkeypatch.setattr(VmManager, "_lookup", lookup_then_someone_starts_it)
    res = run_module("pve_vm", small_vm_args(lab, state="started"))
    assert res["failed"], res
    assert "TASK ERROR: VM 100 already running" in res["msg"], res["msg"]
    assert "started by someone else" in res["msg"] and "run again" in res["msg"], res["msg"]
    monkeypatch.undo()
    assert lab.client().get("nodes/pve/qemu/100/status/current")["status"] == "running"
    # run again: the module finds it running and does not start it
    mark = lab.mark()
    res = run_module("pve_vm", small_vm_args(lab, state="started"))
    assert not res.get("failed") and res["changed"] is False and res["status"] == "running", res
    assert lab.writes(mark) == []


def test_locked_vm_is_waited_for_or_reported(own_lab):
    lab = own_lab(qmcreate=2.0)
    client = lab.client()
    upid = client.post("nodes/pve/qemu", vmid=100, name="vm-1", cores=4, memory=4096)
    args = {**lab.conn(), "node": "pve", "vmid": 100, "name": "vm-1", "cores": 4, "memory": 4096}
    res = run_module("pve_vm", {**args, "lock_timeout": 0})
    assert res["failed"] and "locked (create)" in res["msg"] and "qm unlock" in res["msg"]
    res = run_module("pve_vm", args)
    assert not res.get("failed"), res
    assert res["changed"] is False
    client.wait_task("pve", upid, 30)


def test_wait_for_address_reports_the_agents_address(lab):
    res = run_module("pve_vm", small_vm_args(lab, state="started", wait_for_address=True, address_timeout=30))
    assert not res.get("failed"), res
    assert res["address"].count(".") == 3 and res["mac"]


def test_read_host_keys_gives_the_guests_ssh_host_keys_through_the_agent(lab):
    args = small_vm_args(lab, vmid=106, name="vm-6", state="started", address_timeout=30)
    res = run_module("pve_vm", {**args, "read_host_keys": True})
    assert not res.get("failed"), res
    (key,) = res["host_keys"]  # the simulator's guest has an ed25519 key only
    assert key.startswith("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5") and len(key.split()) == 2
    assert "host_keys" not in run_module("pve_vm", args)  # read only when asked


def test_known_host_keys_are_read_again_only_when_the_run_boots_the_vm(lab):
    """A re-run on a running VM whose key the controller trusts sends no guest agent request (the no-op
    stays at its PVE reads); a VM this run starts has its keys read, known or not."""
    args = small_vm_args(lab, vmid=107, name="vm-7", state="started", address_timeout=30)
    known = {**args, "read_host_keys": True, "host_keys_known": True}
    first = run_module("pve_vm", known)
    assert first["host_keys"] and "start" in first["actions"], first  # booted by this run: read
    mark = lab.mark()
    again = run_module("pve_vm", known)
    assert "host_keys" not in again and again["changed"] is False, again
    assert not [r for r in lab.requests(mark) if "/agent/" in r["path"]]
    assert run_module("pve_vm", {**known, "host_keys_known": False})["host_keys"] == first["host_keys"]


def test_iso_install_attaches_the_cdrom_and_boots_disk_then_cdrom(lab):
    volid = download_iso(lab)
    args = small_vm_args(lab, cdrom=volid, boot_order=["scsi0", "ide2"], state="started")
    res = run_module("pve_vm", args)
    assert not res.get("failed"), res
    assert res["config"]["ide2"].startswith("local:iso/ubuntu-24.04.3-live-server-amd64.iso")
    assert res["config"]["boot"] == "order=scsi0;ide2"
    mark = lab.mark()
    assert run_module("pve_vm", args)["changed"] is False
    assert lab.writes(mark) == []
    # ejecting is a change of ide2 only
    res = run_module(
        "pve_vm", small_vm_args(lab, cdrom="none", boot_order=["scsi0", "ide2"], state="started")
    )
    assert res["set"] == {"ide2": "none,media=cdrom"}


def test_check_mode_on_a_running_vm_still_reports_its_address(lab):
    run_module("pve_vm", small_vm_args(lab, state="started"))
    mark = lab.mark()
    res = run_module("pve_vm", small_vm_args(lab, state="started", wait_for_address=True), check=True)
    assert res["changed"] is False and res["address"]
    assert lab.writes(mark) == []
    res = run_module(
        "pve_vm",
        small_vm_args(lab, vmid=105, name="vm-5", state="started", wait_for_address=True),
        check=True,
    )
    assert res["created"] and "address" not in res


def test_cloud_init_password_is_set_once_and_never_echoed(lab):
    args = small_vm_args(
        lab, cloudinit={"storage": "local-zfs", "user": "ubuntu", "password": "Sup3r-secret"}
    )
    res = run_module("pve_vm", args, diff=True)
    assert not res.get("failed"), res
    assert "Sup3r-secret" not in json.dumps(res)
    assert res["set"]["cipassword"] == "(secret)"
    assert run_module("pve_vm", args)["changed"] is False


def test_check_mode_diff_shows_the_start_of_a_stopped_vm(lab):
    run_module("pve_vm", small_vm_args(lab, state="present"))
    mark = lab.mark()
    res = run_module("pve_vm", small_vm_args(lab, state="started"), check=True, diff=True)
    assert res["changed"] and res["actions"] == ["start"] and lab.writes(mark) == []
    before, after = res["diff"]["before"], res["diff"]["after"]
    assert before.pop("(power state)") == "stopped" and after.pop("(power state)") == "running"
    assert before == after  # the config itself stays as it is

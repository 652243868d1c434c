"""PVE faults on stage vms, each ending in a clear message and a second run that completes with nothing lost
or duplicated: API 500s and connection resets (retried, then a clear error), a task ending in error, a
locked VM. The tests share one lab and run in order."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import yaml

from labsim import pve_faults
from labsim.fixture import reference_fixture_path

from .helpers import (
    DEMO,
    RunningLab,
    api,
    lab_down,
    lab_up,
    need_root,
    playbook_env,
    run_local_play,
    run_playbook,
    wait_task,
)

pytestmark = [pytest.mark.root, pytest.mark.slow]

CREATE = r"^POST /api2/json/nodes/[^/]+/qemu$"
DOWNLOAD = r"^POST /api2/json/nodes/[^/]+/storage/[^/]+/download-url$"
MAPPING = r"^POST /api2/json/cluster/mapping/pci$"
DEMO_VMS = {100: "vm-1", 101: "vm-2", 102: "vm-gpu"}
# VM creation lasts long enough here for a test to see its lock: the locked-VM test creates a VM through
# the API and starts ansible-playbook at once; the module's first look came 1.2 s after the create on an
# idle machine and 2.5 s after it on a loaded one, and it must come while the create still runs.
CREATE_S = 8.0


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningLab]:
    need_root()
    base = tmp_path_factory.mktemp("faults")
    fixture = yaml.safe_load(reference_fixture_path().read_text())
    fixture["timings"]["qmcreate"] = CREATE_S
    (base / "fixture.yml").write_text(yaml.safe_dump(fixture))
    state = base / "state"
    state.mkdir()
    try:
        running = lab_up(state, base / "fixture.yml")
        # the node as stage host leaves it (vfio-pci owns the card): stage vms may start the GPU VM
        host = run_playbook(running, DEMO, "--tags", "host", timeout=400)
        assert host.returncode == 0, (host.stdout + host.stderr)[-3000:]
        yield running
    finally:
        pve_faults.clear(state)
        lab_down(state)


def _vms_stage(lab: RunningLab) -> tuple[int, str]:
    proc = run_playbook(lab, DEMO, "--tags", "vms", timeout=400)
    return proc.returncode, proc.stdout + proc.stderr


def _fatal_msgs(output: str) -> list[str]:
    msgs = []
    for line in output.splitlines():
        if line.startswith("fatal:") and "=> " in line:
            msgs.append(str(json.loads(line.split("=> ", 1)[1]).get("msg", "")))
    return msgs


def _vms(lab: RunningLab) -> dict[int, dict[str, Any]]:
    return {int(v["vmid"]): v for v in api(lab, "GET", "/cluster/resources", type="vm")}


def _wanted(name: str) -> dict[str, Any]:
    """The demo inventory's VM variables of one VM (its own host_vars file)."""
    return yaml.safe_load((DEMO / "host_vars" / f"{name}.yml").read_text())


def _assert_config_as_wanted(vmid: int, config: dict[str, Any]) -> None:
    """The VM's config carries what the demo inventory asks for (shape, disk, machine, GPU)."""
    want = _wanted(DEMO_VMS[vmid])
    assert want["vm_id"] == vmid
    assert config["name"] == DEMO_VMS[vmid], config
    assert str(config["cores"]) == str(want["vm_cores"]), config
    assert str(config["memory"]) == str(want["vm_memory_mib"]), config
    assert f"size={want['vm_disk_gb']}G" in config["scsi0"].split(","), config
    assert (config.get("machine") == "q35") == (want["vm_machine"] == "q35"), config
    assert (config.get("bios") == "ovmf") == (want["vm_firmware"] == "ovmf"), config
    assert ("efidisk0" in config) == (want["vm_firmware"] == "ovmf"), config
    if want.get("vm_gpu"):
        assert f"mapping={want['vm_gpu']}" in config["hostpci0"].split(","), config
    else:
        assert not any(k.startswith("hostpci") for k in config), config
    if want.get("vm_balloon") is False:
        assert str(config.get("balloon")) == "0", config


def _volumes(lab: RunningLab, storage: str) -> list[dict[str, Any]]:
    return api(lab, "GET", f"/nodes/{lab.info['node']}/storage/{storage}/content")


def _assert_demo_vms_once(lab: RunningLab, extra: frozenset[int] = frozenset()) -> None:
    """Each demo VM exactly once, running, with the inventory's config; one mapping, one cloud image, and no
    disk that no VM uses (nothing half-made left behind, nothing made twice)."""
    vms = _vms(lab)
    assert {k: v["name"] for k, v in vms.items() if k not in extra} == DEMO_VMS
    assert set(vms) == set(DEMO_VMS) | extra
    assert all(vms[k]["status"] == "running" for k in DEMO_VMS), vms
    mappings = api(lab, "GET", "/cluster/mapping/pci")
    assert [m["id"] for m in mappings] == ["rtx3090"]
    images = [v["volid"] for v in _volumes(lab, "local") if v.get("content") == "import"]
    assert len(images) == 1, images
    node = lab.info["node"]
    referenced: set[str] = set()
    for vmid in sorted(vms):
        config = api(lab, "GET", f"/nodes/{node}/qemu/{vmid}/config")
        for value in config.values():
            volid = str(value).split(",", 1)[0]
            if volid.startswith("local-zfs:"):
                referenced.add(volid)
        if vmid not in DEMO_VMS:
            continue
        disks = [
            k
            for k, v in config.items()
            if re.fullmatch(r"(scsi|virtio|sata|ide)\d+", k) and "cloudinit" not in str(v)
        ]
        assert disks == ["scsi0"], config
        assert not any(k.startswith("unused") for k in config), config
        assert config.get("lock") is None
        _assert_config_as_wanted(vmid, config)
    disks_on_storage = sorted(v["volid"] for v in _volumes(lab, "local-zfs"))
    assert disks_on_storage == sorted(referenced), "disks that no VM uses (or missing)"


def _calls(lab: RunningLab, pattern: str, since: int = 0) -> list[dict[str, Any]]:
    return [r for r in lab.requests()[since:] if re.match(pattern, f"{r['method']} {r['path']}")]


def _creates(lab: RunningLab, since: int) -> int:
    return len(_calls(lab, CREATE, since))


def _writes_to(lab: RunningLab, vmid: int, since: int) -> list[str]:
    """Writes (not reads) addressed to one VM after `since` log lines."""
    return [
        f"{r['method']} {r['path']}"
        for r in lab.writes(since)
        if re.match(rf"^/api2/json/nodes/[^/]+/qemu/{vmid}(/|$)", r["path"])
    ]


def test_a_api_500s_and_resets_persisting_then_passing(lab: RunningLab) -> None:
    start = len(lab.requests())
    pve_faults.inject(lab.state, fail_next=1000, fail_status=500, fail_match=CREATE)
    rc, out = _vms_stage(lab)
    assert rc == 2, out[-3000:]
    msgs = " ".join(_fatal_msgs(out))
    assert "500" in msgs and "/qemu" in msgs, msgs
    assert _vms(lab) == {}
    # Retried with a growing pause between attempts, then given up with the number of attempts.
    tries = _calls(lab, CREATE, start)
    assert len(tries) > 1 and {r["status"] for r in tries} == {500}, tries
    assert f"still failing after {len(tries)} attempts" in msgs, msgs
    gaps = [b["time"] - a["time"] for a, b in pairwise(tries)]
    assert gaps[-1] > gaps[0], f"no backoff between attempts: {gaps}"

    since = len(lab.requests())
    pve_faults.inject(lab.state, fail_next=1000, fail_status="reset", fail_match=CREATE)
    rc, out = _vms_stage(lab)
    assert rc == 2, out[-3000:]
    msgs = " ".join(_fatal_msgs(out))
    assert "/qemu" in msgs and re.search(r"reset|connection|unreachable|could not", msgs, re.I), msgs
    assert f"no answer after {_creates(lab, since)} attempts" in msgs, msgs
    assert _creates(lab, since) > 1
    assert _vms(lab) == {}
    assert _volumes(lab, "local-zfs") == []

    # Two failures per VM create stay within the retries: the run completes.
    since = len(lab.requests())
    pve_faults.inject(lab.state, fail_next=2, fail_status="reset", fail_match=CREATE)
    rc, out = _vms_stage(lab)
    assert rc == 0, out[-3000:]
    assert _creates(lab, since) == len(DEMO_VMS) + 2
    assert sorted(
        int(r["params"]["vmid"]) for r in _calls(lab, CREATE, since) if r["status"] == 200
    ) == sorted(DEMO_VMS)
    # The image was downloaded and the mapping made once over the three runs, not again on each.
    assert len(_calls(lab, DOWNLOAD, start)) == 1
    assert len(_calls(lab, MAPPING, start)) == 1
    _assert_demo_vms_once(lab)


def test_b_task_error_then_second_run(lab: RunningLab) -> None:
    node = lab.info["node"]
    status = wait_task(lab, api(lab, "POST", f"/nodes/{node}/qemu/101/status/stop"))
    assert status["exitstatus"] == "OK"
    since = len(lab.requests())
    pve_faults.inject(lab.state, task_error_next=1, task_error_message="start failed: injected QEMU error")
    rc, out = _vms_stage(lab)
    assert rc == 2, out[-3000:]
    msgs = " ".join(_fatal_msgs(out))
    assert "start failed: injected QEMU error" in msgs, msgs
    assert "101" in msgs or "vm-2" in msgs, msgs
    # As on PVE, a start that ended in error leaves the VM stopped: the second run has to start it.
    assert _vms(lab)[101]["status"] == "stopped"
    pve_faults.clear(lab.state)
    rc, out = _vms_stage(lab)
    assert rc == 0, out[-3000:]
    assert _creates(lab, since) == 0
    assert _vms(lab)[101]["status"] == "running"
    _assert_demo_vms_once(lab)


def test_b2_create_task_error_then_second_run(lab: RunningLab) -> None:
    """A create task that ends in error (PVE removes the half-made VM): the run names the error and the VM;
    the second run creates that VM once and leaves the others alone."""
    node = lab.info["node"]
    assert wait_task(lab, api(lab, "POST", f"/nodes/{node}/qemu/101/status/stop"))["exitstatus"] == "OK"
    assert wait_task(lab, api(lab, "DELETE", f"/nodes/{node}/qemu/101"))["exitstatus"] == "OK"
    since = len(lab.requests())
    pve_faults.inject(
        lab.state, task_error_next=1, task_error_message="unable to create VM 101 - injected zfs error"
    )
    rc, out = _vms_stage(lab)
    assert rc == 2, out[-3000:]
    msgs = " ".join(_fatal_msgs(out))
    assert "unable to create VM 101 - injected zfs error" in msgs, msgs
    assert 101 not in _vms(lab)
    assert not [v for v in _volumes(lab, "local-zfs") if v.get("vmid") == 101]
    assert _creates(lab, since) == 1
    pve_faults.clear(lab.state)

    rc, out = _vms_stage(lab)
    assert rc == 0, out[-3000:]
    assert [int(r["params"]["vmid"]) for r in _calls(lab, CREATE, since)] == [101, 101]
    assert _writes_to(lab, 100, since) == [] and _writes_to(lab, 102, since) == []
    assert _calls(lab, DOWNLOAD, since) == [] and _calls(lab, MAPPING, since) == []
    _assert_demo_vms_once(lab)


def _scratch_play(lab: RunningLab, tmp_path: Path, lock_timeout: int) -> subprocess.CompletedProcess[str]:
    tasks = [
        {
            "name": "Scratch VM",
            "gpulab.homelab.pve_vm": {
                "api_url": lab.info["pve_url"],
                "api_token_id": lab.info["token_id"],
                "api_token_secret": "{{ (lookup('ansible.builtin.file', '"
                + str(lab.state / "lab.json")
                + "') | from_json).token_secret }}",
                "api_fingerprint": lab.info["fingerprint"],
                "node": lab.info["node"],
                "vmid": 150,
                "name": "scratch",
                "state": "present",
                "cores": 1,
                "memory": 512,
                "lock_timeout": lock_timeout,
            },
        }
    ]
    return run_local_play(
        tmp_path / f"scratch-{lock_timeout}.yml", "A VM somebody else is creating", tasks, playbook_env(lab)
    )


def test_c_locked_vm_refused_then_waited_for(lab: RunningLab, tmp_path: Path) -> None:
    node = lab.info["node"]
    upid = api(lab, "POST", f"/nodes/{node}/qemu", vmid=150, name="scratch", memory=512, cores=1)
    since = len(lab.requests())
    proc = _scratch_play(lab, tmp_path, lock_timeout=1)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    msgs = " ".join(_fatal_msgs(out))
    assert "VM 150 is locked (create)" in msgs and "qm unlock 150" in msgs, msgs

    # The second run waits for the lock (if the create still runs) and completes; nothing doubled.
    proc = _scratch_play(lab, tmp_path, lock_timeout=30)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert wait_task(lab, upid)["exitstatus"] == "OK"
    vms = _vms(lab)
    assert vms[150]["name"] == "scratch" and not vms[150].get("lock")
    assert _creates(lab, since) == 0, "a second create of the locked VM"
    config = api(lab, "GET", f"/nodes/{node}/qemu/150/config")
    assert (str(config["cores"]), str(config["memory"])) == ("1", "512"), config
    _assert_demo_vms_once(lab, extra=frozenset({150}))
    assert wait_task(lab, api(lab, "DELETE", f"/nodes/{node}/qemu/150"))["exitstatus"] == "OK"
    _assert_demo_vms_once(lab)

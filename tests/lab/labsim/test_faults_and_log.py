"""Fault injection (state-dir file and control endpoint) and the request log."""

from __future__ import annotations

import time

import pytest
import requests

from labsim import pve_faults


@pytest.fixture(autouse=True)
def no_faults(lab):
    pve_faults.clear(lab.state_dir)
    yield
    pve_faults.clear(lab.state_dir)


def test_fail_next_n_requests(lab, api):
    pve_faults.inject(lab.state_dir, fail_next=2, fail_status=503, fail_message="maintenance")
    assert [api.get("/version").status_code for _ in range(3)] == [503, 503, 200]
    assert pve_faults.Faults(lab.state_dir).snapshot()["fail_next"] == 0


def test_fail_only_matching_requests(lab, api):
    pve_faults.inject(lab.state_dir, fail_next=1, fail_match=r"^GET /api2/json/nodes$")
    assert api.get("/version").status_code == 200
    r = api.get("/nodes")
    assert r.status_code == 500 and "injected failure" in r.json()["message"]
    assert api.get("/nodes").status_code == 200


def test_connection_reset(lab, api):
    pve_faults.inject(lab.state_dir, fail_next=1, fail_status="reset")
    with pytest.raises(requests.exceptions.ConnectionError):
        api.get("/version")
    assert api.get("/version").status_code == 200


def test_delay_next(lab, api):
    pve_faults.inject(lab.state_dir, delay_s=0.3, delay_next=1)
    t0 = time.monotonic()
    api.get("/version")
    slow = time.monotonic() - t0
    t0 = time.monotonic()
    api.get("/version")
    fast = time.monotonic() - t0
    assert slow >= 0.3 > fast


def test_next_task_ends_in_error(lab, api):
    pve_faults.inject(lab.state_dir, task_error_next=1, task_error_message="disk on fire")
    st = api.run("POST", "/nodes/pve/qemu", vmid=400, memory="512")
    assert st["exitstatus"] == "disk on fire"
    log = [line["t"] for line in api.data("GET", f"/nodes/pve/tasks/{st['upid']}/log")]
    assert log[-1] == "TASK ERROR: disk on fire"
    assert api.get("/nodes/pve/qemu/400/config").status_code == 500, "a failed create leaves no VM behind"
    assert api.run("POST", "/nodes/pve/qemu", vmid=400, memory="512")["exitstatus"] == "OK"


def test_a_start_ending_in_error_leaves_the_vm_stopped(lab, api):
    assert api.run("POST", "/nodes/pve/qemu", vmid=401, memory="512")["exitstatus"] == "OK"
    pve_faults.inject(
        lab.state_dir, task_error_next=1, task_error_message="start failed: QEMU exited with code 1"
    )
    st = api.run("POST", "/nodes/pve/qemu/401/status/start")
    assert st["exitstatus"] == "start failed: QEMU exited with code 1"
    assert api.data("GET", "/nodes/pve/qemu/401/status/current")["status"] == "stopped"
    assert api.run("POST", "/nodes/pve/qemu/401/status/start")["exitstatus"] == "OK"
    assert api.data("GET", "/nodes/pve/qemu/401/status/current")["status"] == "running"


def test_control_endpoint_is_root_only(lab, root, api):
    r = requests.put(
        lab.url + "/_lab/faults",
        data={"fail_next": "1"},
        headers=dict(api.session.headers),
        verify=False,
        timeout=5,
    )
    assert r.status_code == 403
    r = root.session.put(
        lab.url + "/_lab/faults", data={"fail_next": "1", "fail_status": "502"}, verify=False
    )
    assert r.status_code == 200 and r.json()["data"] == {"fail_next": 1, "fail_status": 502}
    assert api.get("/version").status_code == 502
    assert api.get("/version").status_code == 200


def test_request_log_masks_secrets(lab, api):
    requests.post(
        lab.url + "/api2/json/access/ticket",
        data={"username": "root@pam", "password": lab.desc["password"]},
        verify=False,
        timeout=5,
    )
    api.get("/cluster/resources", type="vm")
    time.sleep(0.05)
    log = lab.requests_log()
    login = [r for r in log if r["path"] == "/api2/json/access/ticket"][-1]
    assert login["params"]["password"] == "********" and login["status"] == 200
    assert lab.desc["password"] not in (lab.state_dir / "pve-requests.jsonl").read_text()
    last = [r for r in log if r["path"] == "/api2/json/cluster/resources"][-1]
    assert (
        last["method"] == "GET" and last["params"] == {"type": "vm"} and last["user"] == "gpulab@pve!ansible"
    )
    assert isinstance(last["time"], float) and last["duration"] >= 0

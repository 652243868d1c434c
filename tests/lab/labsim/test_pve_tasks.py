"""The tasks room (labsim.pve_tasks): UPIDs in PVE's format, status running -> stopped, the log's pages and
total, and who may read a task."""

from __future__ import annotations

from unit.labsim.pve_sim_client import NOBLE_SHA256, download, task_log

from labsim.pve_tasks import UPID_RE, parse_upid


def test_upid_format_and_status_fields(api):
    upid = download(api, filename="first.qcow2", checksum=NOBLE_SHA256, **{"checksum-algorithm": "sha256"})
    assert UPID_RE.match(upid) and upid.endswith(":")
    parts = upid.split(":")
    assert len(parts[2]) == 8 and len(parts[3]) in (8, 9) and len(parts[4]) == 8
    assert parts[5:8] == ["download", "first.qcow2", "gpulab@pve!ansible"]
    first = api.data("GET", f"/nodes/pve/tasks/{upid}/status")
    assert first["status"] == "running" and "exitstatus" not in first
    final = api.wait(upid)
    fields = parse_upid(upid)
    assert {k: final[k] for k in fields} == fields
    assert final["exitstatus"] == "OK"


def test_task_log_pages_and_total(api):
    upid = download(api, filename="paged.qcow2")
    api.wait(upid)
    r = api.get(f"/nodes/pve/tasks/{upid}/log", start=1, limit=2)
    body = r.json()
    assert [line["n"] for line in body["data"]] == [2, 3]
    lines = task_log(api, upid)
    assert body["total"] == len(lines) > 3
    assert lines[-1] == "TASK OK"
    assert any("%" in line for line in lines), "the transfer logs its progress"


def test_task_status_of_someone_elses_task_needs_sys_audit(lab, api):
    upid = download(api, filename="own.qcow2")
    api.wait(upid)
    other = lab.token_api("nomap@pve!tk", "nomap-secret")
    r = other.get(f"/nodes/pve/tasks/{upid}/status")
    assert r.status_code == 403
    r = api.get("/nodes/pve/tasks/garbage/status")
    assert r.status_code == 400 and "unable to parse worker upid" in r.json()["message"]
    listed = api.data("GET", "/nodes/pve/tasks", typefilter="download")
    assert upid in {t["upid"] for t in listed}

"""Tasks (UPID, status, log), download-url checksum semantics, storage, hardware/pci and PCI mappings."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from pve_sim_client import create_vm

from gpulab.pve import download as download_engine
from labsim.pve_tasks import UPID_RE, parse_upid

SAMPLES = Path(__file__).resolve().parents[3] / "shared" / "reference" / "samples"
NOBLE = "https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img"
NOBLE_SHA256 = "d1940f7d69d343355e183dff1e08a59852d32e7309baa7a4bad8365b11b005ac"
MAP = "node=pve,path=0000:02:00,id=10de:2204,iommugroup=13,subsystem-id=1462:3881"


def download(api, **params):
    base = {"content": "import", "filename": "noble-server-cloudimg-amd64.qcow2", "url": NOBLE}
    return api.data("POST", "/nodes/pve/storage/local/download-url", **{**base, **params})


def task_log(api, upid):
    return [line["t"] for line in api.data("GET", f"/nodes/pve/tasks/{upid}/log", limit=0)]


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


def test_download_log_is_what_wget_dot_giga_writes_in_a_pve_task(api):
    """pve-common's download_file_from_url: its own lines around `wget --progress=dot:giga`'s, whose rows
    (32 MiB each: offset in KiB, a dot per MiB, percentage, rate, time left) the engine reads back."""
    upid = download(api, filename="rows.qcow2", checksum=NOBLE_SHA256, **{"checksum-algorithm": "sha256"})
    api.wait(upid)
    lines = task_log(api, upid)
    dest = "/var/lib/vz/import/rows.qcow2"
    assert lines[0] == f"downloading {NOBLE} to {dest}"
    assert lines[1].startswith("--") and lines[1].endswith(f"--  {NOBLE}")
    assert "Length: 614203392 (586M) [application/octet-stream]" in lines
    rows = [line for line in lines if re.match(r"^ *\d+K( [. ]{8}){4} *\d+% +[\d.]+[KMG ]", line)]
    # 614203392 bytes: 18 full rows of 32 MiB, then the last one with 9 dots (9.75 MiB)
    assert len(rows) == 19
    assert rows[0].startswith("     0K ........ ........ ........ ........  5% ")
    assert rows[1].startswith(" 32768K ") and rows[-1].startswith("589824K ........ .  ")
    assert re.search(r" 100% +[\d.]+[KMG]=[\d.]+s$", rows[-1])
    saved = next(line for line in lines if " saved [" in line)
    assert saved.endswith(
        f"- '{dest}.tmp_dwnl.{saved.rsplit('.', 1)[1].split(chr(39))[0]}' saved [614203392/614203392]"
    )
    assert lines[-3:] == [
        "calculating checksum...OK, checksum verified",
        f"download of '{NOBLE}' to '{dest}' finished",
        "TASK OK",
    ]
    assert (
        download_engine.transfer_of(lines)["bytes"]
        == download_engine.transfer_of(lines)["total"]
        == 614203392
    )
    half = download_engine.transfer_of(lines[: lines.index(rows[9]) + 1])
    assert half["bytes"] == 10 * 32 * 2**20 and half["total"] == 614203392 and half["rate"] > 0


def test_download_checksum_semantics(api):
    ok = api.wait(download(api, checksum=NOBLE_SHA256, **{"checksum-algorithm": "sha256"}))
    assert ok["exitstatus"] == "OK"
    again = download(api, checksum=NOBLE_SHA256.upper(), **{"checksum-algorithm": "sha256"})
    assert api.wait(again)["exitstatus"] == "OK"
    # pve-common prints "calculating checksum of existing file..." and the verdict on one line
    assert task_log(api, again)[1:] == [
        "calculating checksum of existing file...OK, got correct file already, no need to download",
        "TASK OK",
    ]
    nocheck = api.wait(download(api))
    assert nocheck["exitstatus"] == (
        "refusing to override existing file '/var/lib/vz/import/noble-server-cloudimg-amd64.qcow2'"
    )
    wrong = api.wait(download(api, checksum="0" * 64, **{"checksum-algorithm": "sha256"}))
    assert wrong["exitstatus"] == f"checksum mismatch: got '{NOBLE_SHA256}' != expect '{'0' * 64}', aborting"
    vols = [v for v in api.data("GET", "/nodes/pve/storage/local/content", content="import")]
    assert [v["volid"] for v in vols].count("local:import/noble-server-cloudimg-amd64.qcow2") == 1


def test_fresh_download_with_wrong_checksum_fails_and_stores_nothing(api):
    st = api.wait(download(api, filename="bad.qcow2", checksum="ab" * 32, **{"checksum-algorithm": "sha256"}))
    assert st["exitstatus"].startswith("checksum mismatch: got '")
    volids = {v["volid"] for v in api.data("GET", "/nodes/pve/storage/local/content")}
    assert "local:import/bad.qcow2" not in volids


def test_other_algorithms_are_consistent_with_query(api):
    sha512 = hashlib.new("sha512", f"gpulab-lab-content:{NOBLE}".encode()).hexdigest()
    st = api.wait(download(api, filename="n512.qcow2", checksum=sha512, **{"checksum-algorithm": "sha512"}))
    assert st["exitstatus"] == "OK"


def test_unknown_url_fails_like_an_unreachable_host(api):
    st = api.wait(download(api, url="https://nowhere.invalid/x.qcow2", filename="x.qcow2"))
    assert (
        st["exitstatus"]
        == "download failed: 500 Can't connect to nowhere.invalid:443 (Name or service not known)"
    )
    r = api.get("/nodes/pve/query-url-metadata", url="https://nowhere.invalid/x.iso")
    assert r.status_code == 500


def test_query_url_metadata(api):
    meta = api.data("GET", "/nodes/pve/query-url-metadata", url=NOBLE)
    assert meta == {
        "filename": "noble-server-cloudimg-amd64.img",
        "mimetype": "application/octet-stream",
        "size": 614203392,
    }


def test_download_refusals(api):
    r = api.post("/nodes/pve/storage/local/download-url", url=NOBLE, content="import", filename="noble.img")
    assert r.status_code == 400 and r.json()["errors"] == {"filename": "invalid filename or wrong extension"}
    r = api.post("/nodes/pve/storage/local/download-url", url=NOBLE, content="iso", filename="x.qcow2")
    assert r.json()["errors"] == {"filename": "wrong file extension"}
    r = api.post("/nodes/pve/storage/local-zfs/download-url", url=NOBLE, content="iso", filename="x.iso")
    assert r.status_code == 500 and "not a file based storage" in r.json()["message"]
    r = api.post(
        "/nodes/pve/storage/local/download-url", url=NOBLE, content="vztmpl", filename="a/b c.tar.gz"
    )
    assert r.status_code == 200
    assert api.wait(r.json()["data"])["id"] == "b_c.tar.gz"  # the file name is normalised


def test_import_from_a_downloaded_image(api):
    api.wait(download(api, filename="img.qcow2"))
    create_vm(api, 300, scsi0="local-zfs:0,import-from=local:import/img.qcow2")
    cfg = api.data("GET", "/nodes/pve/qemu/300/config")
    assert cfg["scsi0"] == "local-zfs:vm-300-disk-0,size=3584M"


def test_hardware_pci_matches_the_reference_samples(api):
    default = api.data("GET", "/nodes/pve/hardware/pci")
    everything = api.data("GET", "/nodes/pve/hardware/pci", **{"pci-class-blacklist": ""})
    if (SAMPLES / "pve-api-hardware-pci-default.json").exists():
        assert default == json.loads((SAMPLES / "pve-api-hardware-pci-default.json").read_text())
        assert everything == json.loads((SAMPLES / "pve-api-hardware-pci-all.json").read_text())
    assert len(everything) == 23 and len({d["iommugroup"] for d in everything}) == 16
    gpu = [d for d in everything if d["iommugroup"] == 13]
    assert [d["id"] for d in gpu] == ["0000:02:00.0", "0000:02:00.1"]
    terse = api.data("GET", "/nodes/pve/hardware/pci", verbose=0)
    assert all(set(d) <= {"id", "class", "vendor", "device", "iommugroup", "mdev"} for d in terse)


def test_mapping_crud_digest_and_checks(api):
    api.data("POST", "/cluster/mapping/pci", id="gpu", map=MAP, description="the RTX 3090")
    r = api.post("/cluster/mapping/pci", id="gpu", map=MAP)
    assert r.status_code == 500
    item = api.data("GET", "/cluster/mapping/pci/gpu")
    assert item["map"] == [MAP] and item["description"] == "the RTX 3090"
    listed = api.data("GET", "/cluster/mapping/pci", **{"check-node": "pve"})
    assert next(m for m in listed if m["id"] == "gpu")["checks"] == []
    r = api.put("/cluster/mapping/pci/gpu", description="x", digest="0" * 40)
    assert r.status_code == 500
    wrong = MAP.replace("iommugroup=13", "iommugroup=12")
    api.data("PUT", "/cluster/mapping/pci/gpu", map=wrong, digest=item["digest"], delete="description")
    item = api.data("GET", "/cluster/mapping/pci/gpu")
    assert item["map"] == [wrong] and "description" not in item
    checks = next(
        m for m in api.data("GET", "/cluster/mapping/pci", **{"check-node": "pve"}) if m["id"] == "gpu"
    )["checks"]
    assert checks == [
        {
            "severity": "error",
            "message": "Invalid configuration: 'iommugroup' does not match for 'gpu' (12 != 13)\n",
        }
    ]
    create_vm(api, 310, machine="q35", memory="1024", hostpci0="mapping=gpu,pcie=1")
    st = api.run("POST", "/nodes/pve/qemu/310/status/start")
    assert st["exitstatus"].startswith(
        "PCI device mapping invalid (hardware probably changed): Invalid configuration"
    )
    api.data("DELETE", "/cluster/mapping/pci/gpu")
    assert api.get("/cluster/mapping/pci/gpu").status_code == 500


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

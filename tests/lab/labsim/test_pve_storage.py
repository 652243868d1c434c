"""The storage room (labsim.pve_storage): download-url's log and checksum semantics, query-url-metadata, a
storage's content, import-from of a downloaded image."""

from __future__ import annotations

import hashlib
import re

from unit.labsim.pve_sim_client import NOBLE, NOBLE_SHA256, create_vm, download, task_log

from gpulab.pve import download as download_engine


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

"""The PVE API simulator's task outcomes, locks, download-url and hardware/pci against PVE's source: one test per
behaviour listed in library/labsim/UPSTREAM.md (## PVE tasks), named after its id. The start task's rows are
kept with the start's own tests."""

from __future__ import annotations

import base64
import re
import time

import pytest
from unit.labsim.conftest import InProcessPveSim, start_lab, stop_lab
from unit.labsim.pve_sim_client import UBUNTU_ISO, create_vm, download_iso, vm_params, write_fast_fixture

NOBLE = "https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img"
NOBLE_SHA256 = "d1940f7d69d343355e183dff1e08a59852d32e7309baa7a4bad8365b11b005ac"
#: pve-common's UPID: node, then pid, pstart and start time as 8 upper-case hex digits, type, id, user, ':'
UPID = re.compile(
    r"^UPID:pve:[0-9A-F]{8}:[0-9A-F]{8,9}:[0-9A-F]{8}:download:(?P<id>[^:]*):gpulab@pve!ansible:$"
)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The tests' lab with a create task long enough to meet its lock (one second)."""
    root = tmp_path_factory.mktemp("lab")
    fixture = write_fast_fixture(root / "fixture.yml", timings={"qmcreate": 1.0})
    server, desc, thread = start_lab(root / "state", fixture)
    yield InProcessPveSim(server, desc, root / "state")
    stop_lab(server, thread)


def download(api, filename, **params):
    return api.data(
        "POST",
        "/nodes/pve/storage/local/download-url",
        content="import",
        filename=filename,
        url=NOBLE,
        **params,
    )


def log_of(api, upid):
    return [line["t"] for line in api.data("GET", f"/nodes/pve/tasks/{upid}/log", limit=0)]


def test_pve_task_upid(api):
    upid = download(api, "upid.qcow2")
    m = UPID.match(upid)
    assert m and m["id"] == "upid.qcow2", upid
    api.wait(upid)


def test_pve_task_status(api):
    upid = download(api, "status.qcow2")
    first = api.data("GET", f"/nodes/pve/tasks/{upid}/status")
    assert first["status"] == "running" and "exitstatus" not in first
    final = api.wait(upid)
    assert (final["status"], final["exitstatus"]) == ("stopped", "OK")
    # a failed task's exit status is its error text
    failed = api.wait(download(api, "status.qcow2"))
    assert failed["exitstatus"] == "refusing to override existing file '/var/lib/vz/import/status.qcow2'"


def test_pve_task_log_end(api):
    ok = download(api, "end.qcow2")
    api.wait(ok)
    assert log_of(api, ok)[-1] == "TASK OK"
    failed = download(api, "end.qcow2")
    api.wait(failed)
    assert (
        log_of(api, failed)[-1]
        == "TASK ERROR: refusing to override existing file '/var/lib/vz/import/end.qcow2'"
    )


def test_pve_lock_create(api):
    # while its create task runs the VM is locked: a config change then fails (HTTP 500) naming the lock
    upid = api.data(
        "POST",
        "/nodes/pve/qemu",
        vmid=310,
        name="vm310",
        memory="2048",
        scsi0="local-zfs:8",
        scsihw="virtio-scsi-single",
    )
    r = api.put("/nodes/pve/qemu/310/config", description="x")
    assert r.status_code == 500 and r.json()["message"].rstrip() == "VM is locked (create)", r.text
    assert api.data("GET", "/nodes/pve/qemu/310/config")["lock"] == "create"
    assert api.wait(upid)["exitstatus"] == "OK"
    assert "lock" not in api.data("GET", "/nodes/pve/qemu/310/config")  # the task's end removes the lock


def test_pve_download_url_existing_checksum(api):
    sha = {"checksum": NOBLE_SHA256, "checksum-algorithm": "sha256"}
    api.wait(download(api, "have.qcow2", **sha))
    again = download(api, "have.qcow2", **sha)
    assert api.wait(again)["exitstatus"] == "OK"
    assert log_of(api, again) == [
        f"downloading {NOBLE} to /var/lib/vz/import/have.qcow2",
        "calculating checksum of existing file...OK, got correct file already, no need to download",
        "TASK OK",
    ]


def test_pve_download_url_existing_no_checksum(api):
    api.wait(download(api, "twice.qcow2"))
    st = api.wait(download(api, "twice.qcow2"))
    assert st["exitstatus"] == "refusing to override existing file '/var/lib/vz/import/twice.qcow2'"


def test_pve_download_url_checksum_mismatch(api):
    # a fresh download whose checksum differs fails and keeps nothing
    st = api.wait(download(api, "bad.qcow2", checksum="0" * 64, **{"checksum-algorithm": "sha256"}))
    assert st["exitstatus"] == f"checksum mismatch: got '{NOBLE_SHA256}' != expect '{'0' * 64}'"
    assert "local:import/bad.qcow2" not in {
        v["volid"] for v in api.data("GET", "/nodes/pve/storage/local/content")
    }
    # an existing file whose checksum differs is not downloaded again: the task aborts
    api.wait(download(api, "kept.qcow2"))
    st = api.wait(download(api, "kept.qcow2", checksum="0" * 64, **{"checksum-algorithm": "sha256"}))
    assert st["exitstatus"].endswith(f" != expect '{'0' * 64}', aborting")


def test_pve_hardware_pci_class_blacklist(api):
    default = api.data("GET", "/nodes/pve/hardware/pci")
    everything = api.data("GET", "/nodes/pve/hardware/pci", **{"pci-class-blacklist": ""})
    # the default list hides memory controllers (05), bridges (06) and processors (0b)
    hidden = {d["class"][:4] for d in everything} - {d["class"][:4] for d in default}
    assert hidden and hidden <= {"0x05", "0x06", "0x0b"}
    assert not [d for d in default if d["class"].startswith(("0x05", "0x06", "0x0b"))]
    only_audio_off = api.data("GET", "/nodes/pve/hardware/pci", **{"pci-class-blacklist": "04"})
    assert not [d for d in only_audio_off if d["class"].startswith("0x04")]
    assert [d for d in only_audio_off if d["class"].startswith("0x06")]


def test_pve_hardware_pci_verbose(api):
    verbose = api.data("GET", "/nodes/pve/hardware/pci")
    gpu = next(d for d in verbose if d["id"] == "0000:02:00.0")
    assert gpu["vendor_name"].startswith("NVIDIA") and gpu["iommugroup"] == 13
    terse = api.data("GET", "/nodes/pve/hardware/pci", verbose=0)
    assert terse and all(set(d) <= {"id", "class", "vendor", "device", "iommugroup", "mdev"} for d in terse)


def test_pve_vzdump_wrong_content(api):
    from unit.labsim.pve_sim_client import create_vm, task_log

    create_vm(api, 320)
    upid = api.data(
        "POST", "/nodes/pve/vzdump", vmid="320", storage="local-zfs", mode="stop", compress="zstd"
    )
    assert upid.split(":")[5:7] == ["vzdump", "320"]
    st = api.wait(upid)
    assert st["exitstatus"] == (
        "could not get storage information for 'local-zfs': can't use storage 'local-zfs' for backups - "
        "wrong content type"
    )
    assert task_log(api, upid)[-1].startswith("TASK ERROR: could not get storage information")
    content = api.data("GET", "/nodes/pve/storage/local-zfs/content")
    assert not [v for v in content if v["content"] == "backup"]


def test_pve_vzdump_archive_kept(api):
    from unit.labsim.pve_sim_client import create_vm, task_log

    create_vm(api, 321)
    upid = api.data("POST", "/nodes/pve/vzdump", vmid="321", storage="local", mode="stop", compress="zstd")
    assert api.wait(upid)["exitstatus"] == "OK"
    log = task_log(api, upid)
    archive = next(line for line in log if "creating vzdump archive" in line)
    assert re.search(r"'/var/lib/vz/dump/vzdump-qemu-321-\d{4}_\d\d_\d\d-\d\d_\d\d_\d\d\.vma\.zst'", archive)
    assert log[-1] == "TASK OK"
    backups = [v for v in api.data("GET", "/nodes/pve/storage/local/content") if v["content"] == "backup"]
    assert [v["volid"].split("/")[-1] in archive for v in backups] == [True]
    api.wait(api.data("DELETE", "/nodes/pve/qemu/321", purge=1))
    after = [v for v in api.data("GET", "/nodes/pve/storage/local/content") if v["content"] == "backup"]
    assert after == backups  # the destroy took the VM's disks, never its backup
    # the call itself wants Datastore.AllocateSpace on the storage; an auditor's token has none
    auditor = api.__class__(
        api.base.removesuffix("/api2/json"), {"Authorization": "PVEAPIToken=auditor@pve!ro=ro-secret"}
    )
    r = auditor.post("/nodes/pve/vzdump", vmid="321", storage="local")
    assert r.status_code == 403 and "Datastore.AllocateSpace" in r.text


@pytest.fixture(scope="module")
def storage_labs(tmp_path_factory):
    """fixtures/pve8-storage.yml and fixtures/btrfs.yml, each in a lab of its own: name -> its token's Api."""
    from labsim.fixture import resolve_fixture

    labs, out = [], {}
    for name in ("pve8-storage", "btrfs"):
        root = tmp_path_factory.mktemp(name)
        server, desc, thread = start_lab(root / "state", resolve_fixture(name))
        labs.append((server, thread))
        out[name] = InProcessPveSim(server, desc, root / "state").token_api()
    yield out
    for server, thread in labs:
        stop_lab(server, thread)


def test_pve_download_url_content_type(storage_labs):
    api = storage_labs["pve8-storage"]
    r = api.request(
        "POST", "/nodes/pve/storage/local/download-url", content="import", filename="n.qcow2", url=NOBLE
    )
    assert r.status_code == 500
    assert r.json()["message"] == "storage 'local' is not configured for content-type 'import'\n"
    assert api.data("GET", "/nodes/pve/storage/local/content") == []
    # the content it has is fine
    assert download_iso(api)["exitstatus"] == "OK"


def test_pve_storage_disabled(storage_labs):
    api = storage_labs["btrfs"]
    listed = {s["storage"]: s for s in api.data("GET", "/nodes/pve/storage")}
    assert (listed["local"]["enabled"], listed["local"]["active"]) == (0, 0)
    assert listed["local"]["content"] == "iso,vztmpl,backup"
    assert (listed["local-btrfs"]["enabled"], listed["local-btrfs"]["active"]) == (1, 1)
    # a content filter (or enabled=1) leaves the disabled storage out
    assert [s["storage"] for s in api.data("GET", "/nodes/pve/storage", content="iso")] == ["local-btrfs"]
    assert [s["storage"] for s in api.data("GET", "/nodes/pve/storage", enabled=1)] == ["local-btrfs"]
    r = api.request(
        "POST",
        "/nodes/pve/storage/local/download-url",
        content="iso",
        filename="u.iso",
        url=UBUNTU_ISO,
    )
    assert r.status_code == 500 and r.json()["message"] == "storage 'local' is disabled\n"
    st = api.wait(
        api.data(
            "POST",
            "/nodes/pve/storage/local-btrfs/download-url",
            content="import",
            filename="n.qcow2",
            url=NOBLE,
        )
    )
    assert st["exitstatus"] == "OK"


def test_pve_agent_file_read(api):
    """agent/file-read (qemu-server's API2/Qemu/Agent.pm): the agent checks of assert_agent_available in
    their order, then the file as the agent reads it ({content, bytes-read}, truncated when count stops
    short), a file the guest cannot open as the agent's file-open error."""
    path = "/etc/ssh/ssh_host_ed25519_key.pub"
    api.run("POST", "/nodes/pve/qemu", **vm_params(340))  # no agent line at all
    r = api.get("/nodes/pve/qemu/340/agent/file-read", file=path)
    assert r.status_code == 500 and r.json()["message"].strip() == "No QEMU guest agent configured"
    create_vm(api, 341, agent="0")  # an agent line, off: no agent answers once it runs
    r = api.get("/nodes/pve/qemu/341/agent/file-read", file=path)
    assert r.status_code == 500 and r.json()["message"].strip() == "VM 341 is not running"
    api.run("POST", "/nodes/pve/qemu/341/status/start")
    time.sleep(0.3)
    r = api.get("/nodes/pve/qemu/341/agent/file-read", file=path)
    assert r.status_code == 500 and r.json()["message"].strip() == "QEMU guest agent is not running"
    api.run("POST", "/nodes/pve/qemu/341/status/stop")
    r = api.get("/nodes/pve/qemu/341/agent/file-read")  # file is required
    assert r.status_code == 400 and "file" in r.json()["errors"]

    create_vm(api, 342)
    api.run("POST", "/nodes/pve/qemu/342/status/start")
    first = api.get("/nodes/pve/qemu/342/agent/file-read", file=path)  # the agent is not up at once
    assert first.status_code == 500 and first.json()["message"].strip() == "QEMU guest agent is not running"
    time.sleep(0.3)
    data = api.data("GET", "/nodes/pve/qemu/342/agent/file-read", file=path)
    keytype, blob = data["content"].split()[:2]
    assert keytype == "ssh-ed25519" and base64.b64decode(blob)[4:15] == b"ssh-ed25519"
    assert data["bytes-read"] == len(data["content"]) and "truncated" not in data
    part = api.data("GET", "/nodes/pve/qemu/342/agent/file-read", file=path, count=11)
    assert part["content"] == "ssh-ed25519" and part["truncated"] == 1
    raw = api.data("GET", "/nodes/pve/qemu/342/agent/file-read", file=path, decode=0, offset=12)
    assert base64.b64decode(raw["content"]).decode() == data["content"][12:]
    r = api.get("/nodes/pve/qemu/342/agent/file-read", file="/etc/ssh/ssh_host_rsa_key.pub")
    assert r.status_code == 500
    assert r.json()["message"].strip() == (
        "VM 342 qga command 'guest-file-open' failed - failed to open file '/etc/ssh/ssh_host_rsa_key.pub' "
        "(mode: 'r'): No such file or directory"
    )
    api.run("POST", "/nodes/pve/qemu/342/status/stop")

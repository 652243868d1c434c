"""`gpulab lab up|status|down` as a background process, and state persisting across restarts."""

from __future__ import annotations

import json
import stat
import time

import pytest
from unit.labsim.pve_sim_client import Api, write_fast_fixture

from labsim import cli

REQUIRED = {"pve_url", "node", "token_id", "token_secret", "user", "password", "fingerprint", "state_dir"}


def run_cli(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv(cli.API_ONLY_ENV, "1")  # the simulator's tests never start real lab hosts
    fixture = write_fast_fixture(tmp_path / "fixture.yml")
    yield tmp_path / "state", fixture
    cli.down(tmp_path / "state")


def test_up_status_down_and_persistence(state, capsys):
    state_dir, fixture = state
    rc, out, err = run_cli(capsys, "up", "--state", str(state_dir), "--fixture", str(fixture))
    assert rc == 0, err
    desc = json.loads(out)
    assert set(desc) >= REQUIRED
    assert desc["state_dir"] == str(state_dir.resolve())
    assert desc["user"] == "root@pam" and desc["token_id"] == "gpulab@pve!ansible"
    lab_json = state_dir / "lab.json"
    assert stat.S_IMODE(lab_json.stat().st_mode) == 0o600
    assert json.loads(lab_json.read_text()) == desc

    rc, out, _ = run_cli(capsys, "status", "--state", str(state_dir))
    assert rc == 0 and json.loads(out) == desc
    rc, out, _ = run_cli(capsys, "up", "--state", str(state_dir))
    assert rc == 0 and json.loads(out)["pid"] == desc["pid"], "up on a running lab reuses it"

    api = Api(
        desc["pve_url"], headers={"Authorization": f"PVEAPIToken={desc['token_id']}={desc['token_secret']}"}
    )
    st = api.run(
        "POST", "/nodes/pve/qemu", vmid=100, name="vm-1", scsi0="local-zfs:4", net0="virtio,bridge=vmbr0"
    )
    api.data("POST", "/cluster/mapping/pci", id="gpu", map="node=pve,path=0000:02:00,id=10de:2204")
    api.data(
        "POST", "/nodes/pve/qemu/100/config", cores=3
    )  # left pending? no: stopped VM, applied by the task
    api.run("POST", "/nodes/pve/qemu/100/status/start")
    api.run("POST", "/nodes/pve/qemu/100/config", memory="1024")  # running: memory stays pending
    before = api.data("GET", "/nodes/pve/qemu/100/config")

    rc, _, _ = run_cli(capsys, "down", "--state", str(state_dir))
    assert rc == 0
    assert not (state_dir / "server.pid").exists()
    rc, _, _ = run_cli(capsys, "status", "--state", str(state_dir))
    assert rc == 1
    rc, _, err = run_cli(capsys, "down", "--state", str(state_dir))
    assert rc == 0 and "nothing was running" in err

    rc, out, _ = run_cli(capsys, "up", "--state", str(state_dir), "--fixture", str(fixture))
    again = json.loads(out)
    assert again["pid"] != desc["pid"]
    for key in ("token_secret", "password", "fingerprint", "pve_url"):
        assert again[key] == desc[key], key
    assert api.data("GET", "/nodes/pve/qemu/100/config") == before
    pending = {p["key"]: p for p in api.data("GET", "/nodes/pve/qemu/100/pending")}
    assert pending["memory"]["pending"] == "1024"
    assert api.data("GET", "/cluster/mapping/pci/gpu")["map"] == ["node=pve,path=0000:02:00,id=10de:2204"]
    assert api.data("GET", f"/nodes/pve/tasks/{st['upid']}/status")["exitstatus"] == "OK"
    assert "local-zfs:vm-100-disk-0" in {
        v["volid"] for v in api.data("GET", "/nodes/pve/storage/local-zfs/content")
    }
    # The server stopped while the VM ran: it is still running for the API (the guest never stopped).
    assert api.data("GET", "/nodes/pve/qemu/100/status/current")["status"] == "running"


def test_down_stops_a_server_whose_lab_json_is_gone(state, capsys):
    state_dir, fixture = state
    rc, out, _ = run_cli(capsys, "up", "--state", str(state_dir), "--fixture", str(fixture))
    pid = json.loads(out)["pid"]
    (state_dir / "lab.json").unlink()
    rc, _, _ = run_cli(capsys, "down", "--state", str(state_dir))
    assert rc == 0
    deadline = time.monotonic() + 5
    while cli._pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not cli._pid_alive(pid), "the server is still running"


def test_bad_fixture_is_reported(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(cli.API_ONLY_ENV, "1")
    bad = tmp_path / "bad.yml"
    bad.write_text("name: empty\n")
    rc, _, err = run_cli(capsys, "up", "--state", str(tmp_path / "s"), "--fixture", str(bad))
    assert rc == 1 and "did not start" in err
    assert "defines no nodes" in (tmp_path / "s" / "server.log").read_text()


def _servers_of(state_dir):
    """PIDs of PVE simulator processes serving ``state_dir``."""
    import os
    from pathlib import Path

    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"labsim.pve_api_server" in argv and str(state_dir.resolve()).encode() in argv:
            found.append(int(cmdline.parent.name))
    return [p for p in found if p != os.getpid()]


@pytest.mark.root
def test_up_refuses_missing_programs_before_it_starts_anything(tmp_path, monkeypatch, capsys):
    import os

    if os.geteuid() != 0:
        pytest.skip("needs root: without it the lab's hosts (and their checks) are skipped")
    from labsim import network_lab

    monkeypatch.delenv(cli.API_ONLY_ENV, raising=False)
    monkeypatch.setattr(network_lab, "TOOLS", {**network_lab.TOOLS, "gpulab-no-such-sshd": "gpulab-sshd-pkg"})
    state_dir = tmp_path / "state"
    rc, _, err = run_cli(
        capsys, "up", "--state", str(state_dir), "--fixture", str(write_fast_fixture(tmp_path / "f.yml"))
    )
    assert rc == 1
    assert (
        "gpulab-no-such-sshd (apt package gpulab-sshd-pkg)" in err
        and "apt-get install gpulab-sshd-pkg" in err
    )
    assert _servers_of(state_dir) == [] and not (state_dir / "server.pid").exists()
    assert not (state_dir / "lab.json").exists()


@pytest.mark.root
def test_a_failed_up_stops_the_simulator_it_started(tmp_path, monkeypatch, capsys):
    import os

    if os.geteuid() != 0:
        pytest.skip("needs root: without it the lab's hosts are skipped")
    from labsim import network_lab

    monkeypatch.delenv(cli.API_ONLY_ENV, raising=False)
    monkeypatch.setattr(network_lab, "prepare", lambda _fixture: None)
    seen = []

    def failing_up(state_dir, _fixture):
        seen.extend(_servers_of(state_dir))  # the simulator runs by now
        raise network_lab.LabNetError("lab host node0 did not boot: injected")

    monkeypatch.setattr(network_lab, "up", failing_up)
    state_dir = tmp_path / "state"
    rc, _, err = run_cli(
        capsys, "up", "--state", str(state_dir), "--fixture", str(write_fast_fixture(tmp_path / "f.yml"))
    )
    assert rc == 1 and "injected" in err
    assert len(seen) == 1
    deadline = time.monotonic() + 10
    while _servers_of(state_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _servers_of(state_dir) == [] and not (state_dir / "server.pid").exists()


@pytest.mark.parametrize(
    ("name", "local"), [("pve8-storage", (1, "iso,vztmpl,backup")), ("btrfs", (0, "iso,vztmpl,backup"))]
)
def test_up_takes_the_storage_fixtures_by_name(name, local, tmp_path, monkeypatch, capsys):
    """`gpulab lab up --fixture pve8-storage|btrfs`: the node's storages as those installs leave them, and the
    lab's internet (internet_proxy) answering the controller."""
    import http.client
    import urllib.parse

    monkeypatch.setenv(cli.API_ONLY_ENV, "1")
    state_dir = tmp_path / "state"
    try:
        rc, out, err = run_cli(capsys, "up", "--state", str(state_dir), "--fixture", name)
        assert rc == 0, err
        desc = json.loads(out)
        assert desc["fixture"].endswith(f"/fixtures/{name}.yml")
        api = Api(
            desc["pve_url"],
            headers={"Authorization": f"PVEAPIToken={desc['token_id']}={desc['token_secret']}"},
        )
        storages = {s["storage"]: s for s in api.data("GET", "/nodes/pve/storage")}
        assert (storages["local"]["enabled"], storages["local"]["content"]) == local
        # the controller asks the proxy in absolute form, and gets the dated folder's SHA256SUMS
        where = urllib.parse.urlsplit(desc["internet_proxy"])
        conn = http.client.HTTPConnection(where.hostname, where.port, timeout=10)
        conn.request("GET", "https://cloud-images.ubuntu.com/releases/noble/release-20260926/SHA256SUMS")
        answer = conn.getresponse()
        assert answer.status == 200
        assert answer.read().decode() == (
            "6a81c37564db9b1ee84e141922625e1d7c5b389b99bb3c572e0243607d5bb4d2 *ubuntu-24.04-server-cloudimg-amd64.img\n"
        )
        conn.close()
    finally:
        cli.down(state_dir)

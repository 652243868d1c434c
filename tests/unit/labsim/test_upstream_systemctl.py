"""The systemctl stand-in (labsim.net.systemctl_standin) against systemd 255 (Ubuntu 24.04): one test per
behaviour listed in library/labsim/UPSTREAM.md (## systemctl), named after its id. The stand-in runs in this
process with its unit folders, state and logs under the test's folder."""

from __future__ import annotations

import time

import pytest

from labsim.net import systemctl_standin as sc


@pytest.fixture
def units(tmp_path, monkeypatch):
    """write(name, text) places a unit file; run(*args) -> (rc, stdout, stderr) of a systemctl call."""
    etc = tmp_path / "etc" / "systemd" / "system"
    etc.mkdir(parents=True)
    monkeypatch.setattr(sc, "UNIT_DIRS", (str(etc),))
    monkeypatch.setattr(sc, "STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(sc, "LOG", str(tmp_path / "standins.log"))
    monkeypatch.setattr(sc, "LOG_DIR", str(tmp_path / "log"))

    def write(name, text):
        (etc / name).write_text(text)

    return write


@pytest.fixture
def run(capsys):
    def call(*args):
        rc = sc.main(list(args))
        out = capsys.readouterr()
        return rc, out.out, out.err

    return call


def test_systemctl_is_active(units, run):
    units("idle.service", "[Service]\nType=oneshot\n")
    assert run("is-active", "idle") == (3, "inactive\n", "")
    assert run("start", "idle")[0] == 0
    assert run("is-active", "idle.service") == (0, "active\n", "")
    # a unit without a unit file reads inactive, exit 4 (LSB "status unknown")
    assert run("is-active", "nosuch.service") == (4, "inactive\n", "")
    # several units: 0 when any is active
    assert run("is-active", "nosuch", "idle") == (0, "inactive\nactive\n", "")


def test_systemctl_is_enabled(units, run):
    units("idle.service", "[Service]\nType=oneshot\n[Install]\nWantedBy=multi-user.target\n")
    assert run("is-enabled", "idle") == (1, "disabled\n", "")
    assert run("enable", "idle")[0] == 0
    assert run("is-enabled", "idle") == (0, "enabled\n", "")
    assert run("is-enabled", "nosuch") == (4, "not-found\n", "")
    # a unit file without [Install] settings cannot be enabled: it is static, which counts as enabled
    units("static.service", "[Service]\nType=oneshot\n")
    assert run("is-enabled", "static") == (0, "static\n", "")


def test_systemctl_start_not_found(units, run):
    rc, out, err = run("start", "nosuch")
    assert (rc, out, err) == (5, "", "Failed to start nosuch.service: Unit nosuch.service not found.\n")


def test_systemctl_unit_name(units, run):
    # a name without a type suffix is a service; a path names its unit file's name
    assert sc.unit_name("k3s") == "k3s.service"
    assert sc.unit_name("k3s-agent.service") == "k3s-agent.service"
    assert sc.unit_name("/etc/systemd/system/k3s.service") == "k3s.service"
    assert sc.unit_name("multi-user.target") == "multi-user.target"


def test_systemctl_environment_file(tmp_path, units, run):
    (tmp_path / "k3s.env").write_text("# comment\nK3S_TOKEN='secret'\nK3S_URL=\"https://10.0.0.1:6443\"\n")
    seen = tmp_path / "seen.env"
    units(
        "k3s.service",
        "[Service]\n"
        f"EnvironmentFile=-{tmp_path}/%N.env\n"
        f"EnvironmentFile=-{tmp_path}/missing.env\n"
        f"ExecStart=/bin/sh -c 'env > {seen}; exec sleep 30'\n",
    )
    assert run("start", "k3s")[0] == 0
    for _ in range(100):
        if seen.exists() and seen.read_text().endswith("\n"):
            break
        time.sleep(0.05)
    env = dict(line.split("=", 1) for line in seen.read_text().splitlines())
    assert env["K3S_TOKEN"] == "secret" and env["K3S_URL"] == "https://10.0.0.1:6443"
    assert env["PATH"] == sc.PATH and "HOME" not in env  # a unit gets no login environment
    assert run("stop", "k3s")[0] == 0
    assert run("is-active", "k3s") == (3, "inactive\n", "")


def test_systemctl_show(units, run):
    units("idle.service", "[Service]\nType=oneshot\n")
    rc, out, _ = run("show", "idle")
    props = dict(line.split("=", 1) for line in out.splitlines())
    assert rc == 0 and props | {"MainPID": "0"} == {
        "Id": "idle.service",
        "Names": "idle.service",
        "LoadState": "loaded",
        "ActiveState": "inactive",
        "SubState": "dead",
        "UnitFileState": "static",
        "MainPID": "0",
    }
    rc, out, _ = run("show", "nosuch")
    props = dict(line.split("=", 1) for line in out.splitlines())
    assert rc == 0 and (props["LoadState"], props["ActiveState"], props["UnitFileState"]) == (
        "not-found",
        "inactive",
        "",
    )

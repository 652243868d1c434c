"""units run the way Ansible runs it, against a fake systemctl first on the PATH that keeps each unit's
state in files and logs every call: one call starts and enables what is not, and nothing else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MODULE = Path(__file__).resolve().parents[1] / "plugins" / "modules" / "units.py"

FAKE = """#!/bin/sh
# fake systemctl: STATE/<unit>.active and STATE/<unit>.enabled exist when it is; STATE/known lists the units
echo "$*" >> {state}/calls
[ "$2" = --quiet ] && unit=$3 || unit=$2
grep -qx "$unit" {state}/known || {{ echo "Unit $unit.service not found." >&2; exit 5; }}
case $1 in
  is-active) test -e {state}/$unit.active || exit 3 ;;
  is-enabled) test -e {state}/$unit.enabled || exit 1 ;;
  start) touch {state}/$unit.active ;;
  enable) touch {state}/$unit.enabled ;;
  *) exit 2 ;;
esac
"""


@pytest.fixture
def systemctl(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "known").write_text("qemu-guest-agent\nsystemd-timesyncd\n")
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "systemctl"
    fake.write_text(FAKE.format(state=state))
    fake.chmod(0o755)
    return state


def run(state, units, check=False):
    payload = {"ANSIBLE_MODULE_ARGS": {"units": units, "_ansible_check_mode": check}}
    env = {**os.environ, "PATH": f"{state.parent / 'bin'}:{os.environ['PATH']}"}
    proc = subprocess.run(
        [sys.executable, str(MODULE), json.dumps(payload)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    return json.loads(proc.stdout)


def calls(state):
    path = state / "calls"
    return path.read_text().splitlines() if path.exists() else []


UNITS = [{"name": "qemu-guest-agent"}, {"name": "systemd-timesyncd", "enabled": True}]


def test_starts_and_enables_what_is_not_then_nothing(systemctl):
    check = run(systemctl, UNITS, check=True)
    assert check["changed"] and check["started"] == ["qemu-guest-agent", "systemd-timesyncd"]
    assert check["enabled"] == ["systemd-timesyncd"]
    assert not [
        c for c in calls(systemctl) if c.split()[0] in ("start", "enable")
    ]  # check mode changed nothing

    first = run(systemctl, UNITS)
    assert first["changed"] and first["started"] == ["qemu-guest-agent", "systemd-timesyncd"]
    assert (systemctl / "systemd-timesyncd.enabled").exists()
    assert not (systemctl / "qemu-guest-agent.enabled").exists()  # enabled: false leaves the boot setting

    before = len(calls(systemctl))
    again = run(systemctl, UNITS)
    assert again == {**again, "changed": False, "started": [], "enabled": []}
    assert [c.split()[0] for c in calls(systemctl)[before:]] == ["is-active", "is-active", "is-enabled"]


def test_a_unit_that_cannot_start_fails_with_systemctls_message(systemctl):
    result = run(systemctl, [{"name": "qemu-guest-agent"}, {"name": "nosuch"}])
    assert (
        result["failed"]
        and "systemctl start nosuch failed (rc=5): Unit nosuch.service not found." in result["msg"]
    )
    assert result["started"] == ["qemu-guest-agent"] and result["changed"] is True


def test_a_unit_whose_required_path_is_missing_waits_and_is_no_change(systemctl, tmp_path):
    # The guest agent of a VM without the agent channel: its virtio port is not there, so systemd would
    # never keep it running. It is left alone every run (idempotent), and started once the port shows up.
    port = tmp_path / "org.qemu.guest_agent.0"
    units = [
        {"name": "qemu-guest-agent", "requires_path": str(port)},
        {"name": "systemd-timesyncd", "enabled": True},
    ]
    first = run(systemctl, units)
    assert (
        first["changed"]
        and first["started"] == ["systemd-timesyncd"]
        and first["waiting"] == ["qemu-guest-agent"]
    )
    again = run(systemctl, units)
    assert again["changed"] is False and again["waiting"] == ["qemu-guest-agent"]
    assert "start qemu-guest-agent" not in calls(systemctl)
    port.touch()
    found = run(systemctl, units)
    assert found["changed"] and found["started"] == ["qemu-guest-agent"] and found["waiting"] == []

"""Every mistake of tests/unit/labdef's BAD list, made in a copy of the demo inventory, stops site.yml in
preflight with its message, before any write to the PVE API or to a lab host."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from .helpers import RunningLab, inventory_copy, load_bad_cases, run_playbook, set_vars

pytestmark = [pytest.mark.root, pytest.mark.slow]
BAD = load_bad_cases()

# The BAD list is written for 192.168.100.0/24; the lab has a /24 of its own.
REFERENCE_PREFIX = "192.168.100"


def _relabel(value: Any, prefix: str) -> Any:
    if isinstance(value, str):
        return value.replace(REFERENCE_PREFIX + ".", prefix + ".")
    if isinstance(value, dict):
        return {k: _relabel(v, prefix) for k, v in value.items()}
    if isinstance(value, list):
        return [_relabel(v, prefix) for v in value]
    return value


def adapt(case: tuple[str, str, dict[str, Any], str], prefix: str) -> tuple[str, dict[str, Any], str]:
    """The case as it applies to the demo inventory: same check, the demo's names and addresses."""
    case_id, host, changes, expected = case
    changes = _relabel(changes, prefix)
    expected = _relabel(expected, prefix).replace("isp-router", "lab-router")
    if case_id == "router-password":
        # The demo router is dnsmasq (SSH keys, no password): make it a password router without one.
        changes = {"router_kind": "huawei_ont", "router_password": KeyError}
    if case_id == "no-ssh-key":
        # The demo sets the key for all VMs in group_vars/vms.yml: empty it on vm-1 instead.
        changes = {"vm_ssh_public_key": ""}
    return host, changes, expected


def _run_case(
    lab: RunningLab, base: Path, case: tuple[str, str, dict[str, Any], str]
) -> tuple[str, int, str, str]:
    host, changes, expected = adapt(case, lab.prefix)
    inv = inventory_copy(base / case[0])
    set_vars(inv, host, changes)
    proc = run_playbook(lab, inv, timeout=300)
    return case[0], proc.returncode, proc.stdout + proc.stderr, expected


def _stopped_in_preflight(output: str) -> bool:
    """Only the preflight play ran, and the recap shows no change on any host."""
    plays = re.findall(r"^PLAY \[(.*?)\] \*", output, re.M)
    recap = output.split("PLAY RECAP", 1)[-1]
    counts = re.findall(r"^\S+\s+: ok=\d+\s+changed=(\d+)", recap, re.M)
    return (
        bool(plays)
        and all(p.startswith("Preflight") for p in plays)
        and bool(counts)
        and set(counts) == {"0"}
    )


def test_every_mistake_stops_in_preflight_before_any_write(lab: RunningLab, tmp_path: Path) -> None:
    log_before = len(lab.requests())
    upper_before = lab.upper_snapshot()
    # Two cores: three playbooks at a time keeps them busy (each is mostly ansible's start-up).
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda c: _run_case(lab, tmp_path, c), BAD))
    failures = []
    for case_id, rc, output, expected in results:
        if rc != 2:
            failures.append(f"{case_id}: exit {rc}, expected 2\n{output[-2000:]}")
        elif expected not in output:
            failures.append(f"{case_id}: {expected!r} not in the output\n{output[-2000:]}")
        elif "nothing was changed" not in output or ". Fix: " not in output:
            failures.append(f"{case_id}: no preflight refusal with a fix\n{output[-2000:]}")
        elif not _stopped_in_preflight(output):
            failures.append(f"{case_id}: a play after preflight ran, or a host changed\n{output[-2000:]}")
    assert not failures, "\n\n".join(failures)
    assert lab.writes(log_before) == []
    assert lab.upper_snapshot() == upper_before
    assert len(results) == len(BAD) >= 40

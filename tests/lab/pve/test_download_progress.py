"""A play's pve_download task against the simulated PVE: one task that prints, at a steady pace, the
bytes so far, the total and the rate that PVE's task log shows (its wget lines), and no retry lines; the
recap reads the same with the default callback and with its YAML result format."""

from __future__ import annotations

import re
import sys

import pytest
import yaml
from ansible_runs import ansible_playbook, playbook_env

ISO_URL = "https://releases.ubuntu.com/24.04/ubuntu-24.04.3-live-server-amd64.iso"
ISO_SHA256 = "e93681f3cab37e29bdf53bf2231ffc4de4bcc9d90ad8dc5bb62d18a2355052a0"
ISO_SIZE = 3213064192
LINE = re.compile(
    r"^localhost: downloading local:iso/(?P<file>\S+): (?P<done>[\d.]+) (?P<unit>MiB|GiB) of 3\.0 GiB "
    r"\((?P<pct>\d+)%\) at (?P<rate>[\d.]+) (MiB|GiB)/s, (?P<at>\d+) s of 60 s$",
    re.M,
)


def _book(tmp_path, lab, filename):
    conn = lab.conn(node="pve", storage="local", url=ISO_URL, filename=filename, checksum=ISO_SHA256)
    task = {
        "name": f"Download {filename}",
        "gpulab.homelab.pve_download": {**conn, "timeout": 60, "poll_interval": 1},
    }
    book = tmp_path / f"{filename}.yml"
    book.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [task]}]))
    inv = tmp_path / "hosts.ini"
    inv.write_text(f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    return inv, book


@pytest.mark.parametrize(
    "callback",
    [
        {"ANSIBLE_STDOUT_CALLBACK": "default", "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"},
        {"ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default", "ANSIBLE_CALLBACK_RESULT_FORMAT": "yaml"},
    ],
    ids=["default", "default-yaml"],
)
def test_a_download_says_how_far_it_has_got_then_a_rerun_says_nothing(own_lab, tmp_path, callback):
    # the ISO takes 3.5 s in this lab: a line a second
    lab = own_lab(download_max_s=3.5, download_progress_s=0.1)
    inv, book = _book(tmp_path, lab, "ubuntu-24.04.3-live-server-amd64.iso")
    proc = ansible_playbook("-i", inv, book, "-v", env=playbook_env(**callback))
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-2000:]
    assert "FAILED - RETRYING" not in out and "retries left" not in out
    lines = list(LINE.finditer(out))
    assert len(lines) >= 2, out
    at = [int(m["at"]) for m in lines]
    # one a second, steady; the first within 5 s (each look is a module start, slower on a loaded machine)
    assert at == list(range(at[0], at[0] + len(at))) and at[0] <= 5, at
    pct = [int(m["pct"]) for m in lines]
    assert pct == sorted(pct) and pct[0] < 100, pct
    # what the task log said: a rate near the lab's (3.0 GiB in 3.5 s), bytes in 32 MiB rows
    assert all(700 <= float(m["rate"]) <= 1000 for m in lines), [m["rate"] for m in lines]
    assert re.search(
        r"^localhost: downloaded local:iso/ubuntu-24.04.3-live-server-amd64.iso: 3.0 GiB in \d s$", out, re.M
    )
    assert re.search(r"^localhost\s+: ok=1\s+changed=1\s+unreachable=0\s+failed=0", out, re.M), out[-800:]
    # the lines come before the task's result, which is the end's state
    assert re.search(
        r"msg\W+local:iso/ubuntu-24.04.3-live-server-amd64.iso downloaded and verified \(3.0 GiB\s+in ", out
    )
    assert out.index(lines[-1].group(0)) < out.rindex("changed: [localhost]")

    again = ansible_playbook("-i", inv, book, env=playbook_env(**callback))
    assert again.returncode == 0, again.stdout[-3000:]
    assert not LINE.search(again.stdout) and "downloaded " not in again.stdout
    assert re.search(r"^localhost\s+: ok=1\s+changed=0\s+unreachable=0\s+failed=0", again.stdout, re.M)


def test_a_download_that_outlives_its_timeout_fails_naming_it_and_how_long(own_lab, tmp_path):
    lab = own_lab(download_max_s=6.0, download_progress_s=0.1)
    inv, book = _book(tmp_path, lab, "slow.iso")
    text = book.read_text().replace("timeout: 60", "timeout: 2")
    book.write_text(text)
    proc = ansible_playbook("-i", inv, book, env=playbook_env(ANSIBLE_CALLBACK_RESULT_FORMAT="json"))
    assert proc.returncode != 0
    assert "FAILED - RETRYING" not in proc.stdout, proc.stdout
    assert re.search(
        r"gave up waiting for the download of local:iso/slow.iso after [2-4] s \(timeout 2 s; [\d.]+ [MG]iB of 3.0 GiB",
        proc.stdout,
    ), proc.stdout
    assert "PVE goes on downloading (task UPID:pve:" in proc.stdout, proc.stdout


def test_waiting_for_a_vms_address_says_so_at_a_steady_pace(own_lab, tmp_path):
    """pve_vm with wait_for_address: the guest agent answers 11 s after the start in this lab, so the
    first line (at 10 s) comes while the module waits; a rerun finds the address at once and says nothing."""
    from unit.pve.conftest import small_vm_args

    lab = own_lab(agent_delay=11)
    args = small_vm_args(lab, state="started", wait_for_address=True, address_timeout=30)
    task = {"name": "Create and start vm-1", "gpulab.homelab.pve_vm": args, "register": "vm"}
    book = tmp_path / "vm.yml"
    book.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [task]}]))
    inv = tmp_path / "hosts.ini"
    inv.write_text(f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    env = playbook_env(ANSIBLE_STDOUT_CALLBACK="default")
    proc = ansible_playbook("-i", inv, book, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:]
    line = "localhost: waiting for VM 100 (vm-1) to be ready and get its address: 10 s of 30 s"
    assert line in proc.stdout.splitlines(), proc.stdout
    assert "FAILED - RETRYING" not in proc.stdout
    assert re.search(r"^localhost\s+: ok=1\s+changed=1\s+unreachable=0\s+failed=0", proc.stdout, re.M)
    again = ansible_playbook("-i", inv, book, env=env)
    assert again.returncode == 0 and "waiting for VM 100" not in again.stdout

"""wait in a play on the controller: progress lines at a steady pace and no retry lines, a wait that
is over at its first look costs one look and no line, a timeout names what was waited for and how long,
a skipped look ends the wait, and a module that waits itself gets its lines while it blocks."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import yaml
from ansible_runs import ansible_playbook, playbook_env


def _run(tmp_path, task, *args, check_name="probe"):
    book = tmp_path / "book.yml"
    show = {"name": "show", "ansible.builtin.debug": {"msg": "{{ " + check_name + " | to_json }}"}}
    book.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [task, show]}]))
    inv = tmp_path / "hosts.ini"
    inv.write_text(f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    env = playbook_env(ANSIBLE_STDOUT_CALLBACK="default", ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    return ansible_playbook("-i", inv, book, *args, env=env)


def _wait_for_file(flag, timeout=10, **extra):
    return {
        "name": "wait for the flag",
        "gpulab.homelab.wait": {
            "what": f"the flag {flag}",
            "timeout": timeout,
            "interval": 1,
            "progress_interval": 1,
            "module": "ansible.builtin.command",
            "module_args": {"cmd": f"cat {flag}"},
            "until": ["probe.rc == 0", "probe.stdout == 'ok'"],
            **extra,
        },
        "register": "probe",
        "changed_when": False,
        "failed_when": False,
    }


def _result(proc):
    m = re.search(r'"msg": "(\{.*\})"', proc.stdout)
    assert m, proc.stdout
    import json

    return json.loads(json.loads(f'"{m.group(1)}"'))


def test_a_condition_that_holds_at_the_first_look_returns_at_once(tmp_path):
    flag = tmp_path / "flag"
    flag.write_text("ok")
    # a look on a busy machine can take a second: the first line would come at 10 s
    proc = _run(tmp_path, _wait_for_file(flag, progress_interval=10))
    assert proc.returncode == 0, proc.stdout
    res = _result(proc)
    assert res["looks"] == 1 and not res["timed_out"] and res["stdout"] == "ok"
    assert "waiting for" not in proc.stdout and "RETRYING" not in proc.stdout


def test_lines_at_a_steady_pace_until_the_condition_holds(tmp_path):
    flag, looked = tmp_path / "flag", tmp_path / "looked"
    # the flag comes 4 s after the wait's first look, however long ansible-playbook takes to start (a busy
    # machine: the make targets run two pytest workers)
    writer = subprocess.Popen(
        ["sh", "-c", f"until [ -e {looked} ]; do sleep 0.1; done; sleep 4; echo ok > {flag}"]
    )
    look = {"cmd": f"sh -c 'touch {looked}; cat {flag}'"}
    try:
        proc = _run(tmp_path, _wait_for_file(flag, timeout=30, module_args=look))
    finally:
        writer.kill()  # (done by now, unless the wait never looked)
        writer.wait()
    assert proc.returncode == 0, proc.stdout
    res = _result(proc)
    assert res["stdout"] == "ok" and not res["timed_out"] and res["looks"] >= 2
    seconds = [
        int(s)
        for s in re.findall(rf"^localhost: waiting for the flag {flag}: (\d+) s of 30 s$", proc.stdout, re.M)
    ]
    assert len(seconds) >= 2 and seconds == list(range(seconds[0], seconds[0] + len(seconds))), proc.stdout
    assert "FAILED - RETRYING" not in proc.stdout and "retries left" not in proc.stdout
    assert re.search(r"^localhost\s+: ok=2\s+changed=0\s+unreachable=0\s+failed=0", proc.stdout, re.M)


def test_a_timeout_fails_naming_what_and_how_long(tmp_path):
    task = _wait_for_file(tmp_path / "never", timeout=2)
    del task["failed_when"]
    proc = _run(tmp_path, task)
    assert proc.returncode != 0
    # on a busy machine a look can take a second or more: the wait ends at the first look past its timeout
    found = re.search(
        rf"gave up waiting for the flag {tmp_path / 'never'} after (\d+) s \(timeout 2 s, \d+ looks, one every 1 s\)",
        proc.stdout,
    )
    assert found and 2 <= int(found.group(1)) <= 10, proc.stdout
    assert "FAILED - RETRYING" not in proc.stdout


def test_check_mode_skips_the_look_and_ends_the_wait_at_once(tmp_path):
    task = _wait_for_file(tmp_path / "never", timeout=30)
    start = time.monotonic()
    proc = _run(tmp_path, task, "--check")
    assert proc.returncode == 0, proc.stdout
    assert time.monotonic() - start < 20
    res = _result(proc)
    assert res["skipped"] and res["looks"] == 1 and not res["timed_out"]


def test_a_module_that_waits_itself_gets_its_lines_while_it_blocks(tmp_path):
    task = {
        "name": "a blocking look",
        "gpulab.homelab.wait": {
            "what": "a slow command",
            "timeout": 20,
            "progress_interval": 1,
            "module": "ansible.builtin.shell",
            "module_args": {"cmd": "sleep 3.3; echo done"},
        },
        "register": "probe",
        "changed_when": False,
    }
    proc = _run(tmp_path, task)
    assert proc.returncode == 0, proc.stdout
    assert _result(proc)["stdout"] == "done" and _result(proc)["looks"] == 1
    lines = re.findall(r"^localhost: waiting for a slow command: (\d+) s of 20 s$", proc.stdout, re.M)
    assert lines[:3] == ["1", "2", "3"], proc.stdout


def _unanswered_host(tmp_path, stderr: str, retry: int = 600, host_vars: str = "ansible_host=192.0.2.7"):
    """A play on a host reached over ssh, its ssh a stand-in that fails as OpenSSH does (exit 255, `stderr`)."""
    fake = tmp_path / "ssh"
    fake.write_text(f"#!/bin/sh\necho '{stderr}' >&2\nexit 255\n")
    fake.chmod(0o755)
    task = {
        "name": "wait for the guest",
        "gpulab.homelab.wait": {
            "what": "vm-x to answer over SSH",
            "timeout": 600,
            "interval": 1,
            "progress_interval": 1,
            "retry_unreachable": retry,
            "module": "ansible.builtin.command",
            "module_args": {"cmd": "true"},
        },
        "register": "probe",
    }
    book = tmp_path / "book.yml"
    book.write_text(yaml.safe_dump([{"hosts": "vm-x", "gather_facts": False, "tasks": [task]}]))
    inv = tmp_path / "hosts.ini"
    inv.write_text(f"vm-x {host_vars} ansible_ssh_executable={fake} ansible_ssh_retries=0\n")
    env = playbook_env(ANSIBLE_STDOUT_CALLBACK="default", ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    started = time.monotonic()
    return ansible_playbook("-i", inv, book, env=env, timeout=120), time.monotonic() - started


def test_a_host_key_that_known_hosts_lacks_stops_the_wait_at_once_with_the_fix(tmp_path):
    proc, took = _unanswered_host(tmp_path, "Host key verification failed.")
    assert proc.returncode != 0 and "UNREACHABLE" in proc.stdout, proc.stdout
    assert "vm-x (192.0.2.7) answers, but its SSH host key is not in known_hosts" in proc.stdout, proc.stdout
    assert "ssh-keyscan -H 192.0.2.7 >> ~/.ssh/known_hosts" in proc.stdout
    assert "waiting for vm-x" not in proc.stdout and took < 60  # not tried again for retry_unreachable


def test_the_host_key_fix_names_the_address_ssh_was_given_not_its_template(tmp_path):
    # ansible_host as the inventories have it for a VM: a template of vm_address
    proc, _ = _unanswered_host(
        tmp_path,
        "Host key verification failed.",
        host_vars="vm_address=192.0.2.9 ansible_host='{{ vm_address }}'",
    )
    assert "vm-x (192.0.2.9) answers, but its SSH host key is not in known_hosts" in proc.stdout, proc.stdout
    assert "ssh-keyscan -H 192.0.2.9 >> ~/.ssh/known_hosts" in proc.stdout and "{{" not in proc.stdout


def test_a_host_that_does_not_answer_is_tried_again_until_retry_unreachable(tmp_path):
    proc, took = _unanswered_host(
        tmp_path, "ssh: connect to host 192.0.2.7 port 22: No route to host", retry=3
    )
    assert proc.returncode != 0 and "UNREACHABLE" in proc.stdout, proc.stdout
    assert "vm-x did not answer while waiting for vm-x to answer over SSH" in proc.stdout, proc.stdout
    assert "No route to host" in proc.stdout, proc.stdout
    assert "vm-x: waiting for vm-x to answer over SSH" in proc.stdout and took >= 3

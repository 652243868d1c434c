"""One run at a time (gpulab.runlock and the node module gpulab_run_lock): the lock file is taken by one run only,
a run whose process is gone is found gone (a reused PID too), and the refusal names the holder's PID,
controller and start."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ansible_modules import MODULES, command

from gpulab import runlock


def lock(path, holder, **args):
    payload = json.dumps({"ANSIBLE_MODULE_ARGS": {"path": str(path), "holder": holder, **args}})
    proc = subprocess.run(
        command(MODULES / "gpulab_run_lock.py", payload), capture_output=True, text=True, timeout=60
    )
    return json.loads(proc.stdout)


def test_one_run_holds_the_lock_another_is_refused_and_a_gone_one_is_replaced(tmp_path):
    path = tmp_path / "run" / "gpulab-run.json"
    first, second = {"id": "a/1/1", "pid": 1}, {"id": "b/2/2", "pid": 2}
    assert lock(path, first)["acquired"] and json.loads(path.read_text()) == first
    assert lock(path, first)["acquired"]  # its own lock again: still held
    refused = lock(path, second)
    assert not refused["acquired"] and refused["holder"] == first and refused["changed"] is False
    assert not lock(path, second, replace="someone/else/0")["acquired"]
    took = lock(path, second, replace=first["id"])
    assert took["acquired"] and took["replaced"] == first and json.loads(path.read_text()) == second
    assert not lock(path, first, state="released")["released"] and path.exists()  # not its lock
    assert lock(path, second, state="released")["released"] and not path.exists()


def test_check_mode_writes_nothing(tmp_path):
    path = tmp_path / "gpulab-run.json"
    payload = json.dumps(
        {"ANSIBLE_MODULE_ARGS": {"path": str(path), "holder": {"id": "a"}, "_ansible_check_mode": True}}
    )
    out = json.loads(subprocess.run(command(MODULES / "gpulab_run_lock.py", payload), capture_output=True, text=True,
                                    timeout=60).stdout)  # fmt: skip
    assert out["acquired"] and not path.exists()


def test_a_run_is_gone_when_its_process_ended_or_its_pid_was_reused():
    me = runlock.this_run(os.getpid())
    assert runlock.gone(me) is False
    assert me["started"].endswith(" UTC") and me["id"] == f"{me['controller']}/{os.getpid()}/{me['pstart']}"
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert runlock.gone({**me, "pid": child.pid, "pstart": None}) is True
    assert runlock.gone({**me, "pstart": me["pstart"] + 1}) is True  # the PID now names another process
    assert runlock.gone({**me, "controller": "another-laptop"}) is None


def test_the_refusal_names_the_holder_and_how_to_go_on():
    me = runlock.this_run(os.getpid(), "inventory/demo")
    text = runlock.refusal(me, "pve")
    assert f"PID {os.getpid()} on controller {me['controller']}" in text and me["started"] in text
    assert "/var/lib/gpulab/run-lock.json on node pve" in text and "before any change" in text
    elsewhere = runlock.refusal({**me, "controller": "another-laptop"}, "pve")
    assert "-e gpulab_run_lock_break=true" in elsewhere and "gpulab_run_lock_break" not in text

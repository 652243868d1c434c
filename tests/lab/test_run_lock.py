"""One run at a time (gpulab.runlock and the node module run_lock): the lock file is taken by one run only,
a run whose process is gone is found gone (a reused PID too), and the refusal names the holder's PID,
controller and start."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_modules import MODULES, command
from ansible_runs import ROOT, ansible_playbook

from gpulab import runlock


def lock(path, holder, **args):
    payload = json.dumps({"ANSIBLE_MODULE_ARGS": {"path": str(path), "holder": holder, **args}})
    proc = subprocess.run(
        command(MODULES / "run_lock.py", payload), capture_output=True, text=True, timeout=60
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
    out = json.loads(subprocess.run(command(MODULES / "run_lock.py", payload), capture_output=True, text=True,
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


# --- the playbooks: site.yml takes the lock once; a stage playbook run alone takes it too -------------------------
STAGES = [
    "access",
    "guests",
    "hami",
    "host",
    "k3s",
    "monitoring",
    "network",
    "site",  # playbooks/site.yml, every stage (the checkout's site.yml imports it)
    "teardown",
    "upgrade",
    "vms",
    "workloads",
]
READ_ONLY = {"preflight", "verify", "k3s_speaker", "run_lock", "run_lock_release"}  # they change nothing


def lab(tmp_path):
    """An inventory whose first Proxmox node is this machine (local connection), and the lock file's path."""
    inv = tmp_path / "hosts.ini"
    inv.write_text(f"[proxmox]\npve ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    return inv, tmp_path / "run-lock.json"


# every stage's own tags: skipped, a run does only the lock plays (tagged run-lock and always only) and no
# stage's roles (whose argument checks, tagged always too, need the whole lab)
ONLY_THE_LOCK = ("--skip-tags", "preflight,host,vms,network,guests,k3s,hami,hami-proof,workloads,monitoring,"
                 "verify,teardown,upgrade,access")  # fmt: skip


def playbook(name, inv, path, *args):
    return ansible_playbook(name, "-i", inv, "-e", f"gpulab_run_lock_path={path}", "-v", *args, timeout=180)


def test_every_stage_playbook_imports_preflight_first_and_gives_the_lock_back_last():
    """Preflight takes the lock (its last play imports run_lock.yml) for the playbook that names itself in
    gpulab_run_by; that playbook's last play gives it back. No playbook passes a lock setting to another."""
    import yaml

    found = sorted(p.stem for p in Path(ROOT, "playbooks").glob("*.yml"))
    assert (
        sorted(set(found) - READ_ONLY) == STAGES
    )  # a new stage playbook must be sorted into one or the other
    assert not Path(
        ROOT, "playbooks", "tasks"
    ).exists()  # playbooks/ holds playbooks only: steps live in roles
    preflight = yaml.safe_load(Path(ROOT, "playbooks", "preflight.yml").read_text())
    assert preflight[-1].get("ansible.builtin.import_playbook") == "run_lock.yml"
    for stage in STAGES:
        text = Path(ROOT, "playbooks", f"{stage}.yml").read_text()
        assert "gpulab_run_lock_in_site" not in text and "gpulab_run_lock_by" not in text, stage
        plays = yaml.safe_load(text)
        # access.yml makes the API token preflight would need: its controller-side checks (nothing reaches the
        # node), then the lock itself
        first = "run_lock.yml" if stage == "access" else "preflight.yml"
        while plays[0].get("ansible.builtin.import_playbook") != first:
            checks = [
                t.get("gpulab.homelab.pve_access", {}).get("preconditions_only")
                for t in plays.pop(0)["tasks"]
            ]
            assert stage == "access" and all(checks), stage
        assert plays[0]["vars"]["gpulab_run_by"] == f"{stage}.yml", stage
        assert plays[-1].get("ansible.builtin.import_playbook") == "run_lock_release.yml", stage
        assert plays[-1]["vars"] == {"gpulab_run_by": f"{stage}.yml"}, stage
    # site.yml passes its stages one setting: that they are part of its run (their preflight and lock plays
    # then match no host); nothing of the lock itself
    site = yaml.safe_load(Path(ROOT, "playbooks", "site.yml").read_text())
    assert all(play["vars"] == {"gpulab_stage_of": "site.yml"} for play in site[1:-1]), site


@pytest.mark.parametrize("stage", ["vms", "network", "teardown"])
def test_a_stage_run_alone_while_another_run_holds_the_lock_stops_before_any_change(tmp_path, stage):
    inv, path = lab(tmp_path)
    holder = runlock.this_run(os.getpid())  # this test's process: alive, on this controller
    path.write_text(json.dumps(holder))
    # preflight's lab checks left out (this inventory is no lab): its last play, the lock, still runs
    run = playbook(f"playbooks/{stage}.yml", inv, path, "--skip-tags", "preflight")
    assert run.returncode != 0, run.stdout
    assert f"PID {os.getpid()} on controller {holder['controller']}" in run.stdout, run.stdout
    plays = [line for line in run.stdout.splitlines() if line.startswith("PLAY [")]
    assert plays[-1].startswith("PLAY [Run lock | take the lab's run lock"), plays  # none after
    assert all(p.startswith("PLAY [Preflight |") for p in plays[:-1]), plays  # none before but preflight
    assert json.loads(path.read_text()) == holder  # still the other run's


def recap(run, host="pve"):
    """The PLAY RECAP's counts for `host`: {"ok": 3, "skipped": 24, ...}."""
    line = next(x for x in run.stdout.splitlines() if x.startswith(f"{host} ") and "ok=" in x)
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


def assert_took_once_and_gave_back(run, path):
    """The run passed, took the lock in one task, released it once, and left no lock file behind."""
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("TASK [Take the run lock") == 1 and run.stdout.count("acquired: true") == 1, (
        run.stdout
    )
    assert run.stdout.count("released: true") == 1 and not path.exists(), run.stdout


def test_a_stage_run_alone_takes_the_lock_and_gives_it_back(tmp_path):
    inv, path = lab(tmp_path)
    run = playbook("playbooks/network.yml", inv, path, *ONLY_THE_LOCK)
    assert_took_once_and_gave_back(run, path)
    assert recap(run) == {**recap(run), "ok": 3, "skipped": 0, "failed": 0}, run.stdout


def plays_shown(run):
    """Each PLAY of a run's output: (its name, the lines up to the next play)."""
    blocks = re.split(r"^PLAY \[(.*)\] \**$", run.stdout, flags=re.M)
    return list(zip(blocks[1::2], blocks[2::2], strict=True))


def test_site_takes_the_lock_once_and_its_stages_do_not_touch_the_node_again(tmp_path):
    inv, path = lab(tmp_path)
    run = playbook("site.yml", inv, path, *ONLY_THE_LOCK)
    assert_took_once_and_gave_back(run, path)
    # every stage site.yml imports imports preflight (and its lock play) and the release; site.yml imports
    # each with gpulab_stage_of, so those plays match no host: no task of theirs runs, not even a skip
    imported = re.findall(r"import_playbook: (\w+)\.yml", Path(ROOT, "playbooks", "site.yml").read_text())
    stages = [name for name in imported if name in STAGES]
    plays = plays_shown(run)
    lock_plays = [body for name, body in plays if name.startswith("Run lock | take the lab's run lock")]
    # site's, each stage's, verify's
    assert len(stages) >= 8 and len(lock_plays) == len(stages) + 2, run.stdout
    released = [body for name, body in plays if name.startswith("Run lock | give it back")]
    preflights = [body for name, body in plays if name.startswith("Preflight |")]
    for body in lock_plays[1:] + released[:-1] + preflights[1:]:  # all but site.yml's own
        assert body.strip() == "skipping: no hosts matched", run.stdout
    assert "TASK [Take the run lock" in lock_plays[0], run.stdout
    assert "TASK [Release the run lock" in released[-1], run.stdout
    assert recap(run) == {**recap(run), "ok": 3, "failed": 0}, run.stdout


def test_a_playbook_of_ones_own_importing_two_stages_takes_the_lock_once(tmp_path):
    """Without gpulab_stage_of the second stage finds preflight done and the lock taken (facts of this run) and
    ends those plays at once."""
    inv, path = lab(tmp_path)
    mine = tmp_path / "mine.yml"
    mine.write_text(f"- ansible.builtin.import_playbook: {ROOT}/playbooks/vms.yml\n" * 2)
    run = playbook(str(mine), inv, path, *ONLY_THE_LOCK)
    assert_took_once_and_gave_back(run, path)
    taking = "Run lock | take the lab's run lock"
    lock_plays = [body for name, body in plays_shown(run) if name.startswith(taking)]
    assert len(lock_plays) == 2 and "TASK [Take the run lock" in lock_plays[0], run.stdout
    # the run's fact ended the second, not the host pattern
    assert "no hosts matched" not in lock_plays[1], run.stdout


def test_a_lab_without_a_node_to_log_in_to_can_leave_the_lock_out(tmp_path):
    inv, path = lab(tmp_path)
    holder = runlock.this_run(os.getpid())
    path.write_text(json.dumps(holder))
    run = playbook("playbooks/vms.yml", inv, path, "-e", "gpulab_run_lock_enabled=false", *ONLY_THE_LOCK)
    assert run.returncode == 0 and "TASK [Take the run lock" not in run.stdout, run.stdout + run.stderr
    assert recap(run)["ok"] == 0 and json.loads(path.read_text()) == holder  # never read, never released

"""The PVE modules' connection from the inventory (plugins/plugin_utils/pve_connection.py): each api_*
option a task leaves out comes from the pve_api_* variables of the task's node; what the task gives wins."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml
from ansible_runs import BIN

from gpulab.pve import connection

from .conftest import ROOT, PveSimProcess, gpu_vm_args, prepare_gpu_lab, run_module

INVENTORY = {
    "pve_api_url": "https://pve.example:8006",
    "pve_api_token_id": "gpulab@pve!ansible",
    "pve_api_token_secret": "inventory-secret",
    "pve_api_fingerprint": "AB:CD",
    "pve_api_validate_certs": True,
    "pve_api_user": "",  # empty: unset
}


def test_fill_takes_what_the_task_leaves_out():
    assert connection.fill_from_inventory({"node": "pve"}, INVENTORY) == {
        "node": "pve",
        "api_url": "https://pve.example:8006",
        "api_token_id": "gpulab@pve!ansible",
        "api_token_secret": "inventory-secret",
        "api_fingerprint": "AB:CD",
        "api_validate_certs": True,
    }


def test_fill_keeps_what_the_task_gives_null_included():
    out = connection.fill_from_inventory(
        {"api_url": "https://other:8006", "api_fingerprint": None}, INVENTORY
    )
    assert out["api_url"] == "https://other:8006" and out["api_fingerprint"] is None
    assert out["api_token_secret"] == "inventory-secret"


def test_fill_keeps_the_tasks_login_and_certificate_check_whole():
    task = {"api_user": "root@pam", "api_password": "pw", "api_ca_file": "/etc/pve-root-ca.pem"}
    out = connection.fill_from_inventory(task, INVENTORY)
    assert out == {**task, "api_url": "https://pve.example:8006", "api_validate_certs": True}
    # the other way round: a token given by the task excludes the inventory's user and password
    inventory = {
        "pve_api_url": "https://pve.example:8006",
        "pve_api_user": "root@pam",
        "pve_api_password": "pw",
    }
    out = connection.fill_from_inventory({"api_token_id": "a@pve!t", "api_token_secret": "s"}, inventory)
    assert "api_user" not in out and "api_password" not in out


def _play(lab: PveSimProcess, tmp_path, hosts: dict, tasks: list) -> tuple[subprocess.CompletedProcess, list]:
    """Runs the tasks on localhost with -vvv and this inventory; returns the process and the task records."""
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"proxmox": {"hosts": hosts}}}}))
    play = [
        {
            "name": "PVE modules with the inventory's connection",
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}"},
            "tasks": tasks,
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    record = tmp_path / "record.jsonl"
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_CALLBACK_PLUGINS=str(ROOT / "tests" / "pve" / "callbacks"),
        ANSIBLE_CALLBACKS_ENABLED="gpulab_record",
        ANSIBLE_NOCOLOR="1",
        GPULAB_RECORD=str(record),
        ROOT_PASSWORD=lab.desc["password"],
    )
    for name in [k for k in env if k.startswith("PVE_API_")]:
        del env[name]  # the modules' environment fallbacks must not stand in for the inventory
    cmd = [str(BIN / "ansible-playbook"), "-vvv", "-i", str(tmp_path / "hosts.yml")]
    proc = subprocess.run(
        [*cmd, str(tmp_path / "play.yml")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    records = [json.loads(x) for x in record.read_text().splitlines()] if record.exists() else []
    return proc, [r for r in records if "task" in r]


@pytest.mark.slow
def test_tasks_pass_only_their_own_options(lab, tmp_path):
    # the simulator's token connection as the inventory's pve_api_* variables
    settings = {f"pve_{name}": value for name, value in lab.conn(api_retries=0).items()}
    hosts = {
        # first in group proxmox: a second node whose API address answers nothing
        "node-b": {"pve_node": "other", **settings, "pve_api_url": "https://127.0.0.1:9"},
        "pve": {"pve_node": "pve", **settings},
    }
    info = {"gather": ["version"]}
    tasks = [
        {"name": "Node pve", "gpulab.homelab.pve_info": {"node": "pve", **info}},
        {"name": "Node other, the task's URL", "gpulab.homelab.pve_info": {"node": "other", "api_url": lab.desc["pve_url"], **info}},
        {
            "name": "Node pve, the task's password login",
            "gpulab.homelab.pve_info": {"node": "pve", "api_user": "root@pam", "api_password": "{{ lookup('env', 'ROOT_PASSWORD') }}", **info},
        },
        {
            "name": "The mapping of node pve (its entries' node)",
            "gpulab.homelab.pve_pci_mapping": {"id": "rtx3090", "entries": [{"node": "pve", "path": "0000:02:00", "id": "10de:2204"}]},
            "check_mode": True,
        },
        {"name": "Node other", "gpulab.homelab.pve_info": {"node": "other", **info}},
    ]  # fmt: skip
    mark = lab.mark()
    proc, records = _play(lab, tmp_path, hosts, tasks)
    output = proc.stdout + proc.stderr
    assert [(r["task"], r["status"]) for r in records] == [
        ("Node pve", "ok"),
        ("Node other, the task's URL", "ok"),
        ("Node pve, the task's password login", "ok"),
        ("The mapping of node pve (its entries' node)", "ok"),
        ("Node other", "failed"),
    ], output[-3000:]
    assert proc.returncode == 2
    # node other's own (unreachable) address was used when the task gave none
    assert "127.0.0.1:9" in records[4]["result"]["msg"]
    assert records[3]["result"]["changed"] and records[3]["result"]["requests"]["writes"] == 0
    # who read /version: the inventory's token twice, then root@pam (the task's login, not mixed with the token)
    users = [r["user"] for r in lab.requests(mark) if r["path"] == "/api2/json/version"]
    token_user = lab.desc["token_id"]
    assert users == [token_user, token_user, "root@pam"]
    # -vvv shows each result and how the module ran, and no secret
    assert "pve_info: running gpulab.tasks.pve_info in this worker" in output
    assert lab.desc["token_secret"] not in output and lab.desc["password"] not in output


@pytest.mark.slow
def test_a_warning_and_the_result_read_the_same_in_the_worker_and_as_a_module(lab, tmp_path):
    """A change PVE would hold as pending on a running VM (check mode, with diff): the module warns, in the
    worker (the task on the controller) as in its own Python (a task with `environment`), and both report
    the same result."""
    prepare_gpu_lab(lab)
    run_module("pve_vm", gpu_vm_args(lab, state="started"))
    args = gpu_vm_args(lab, state="started", cores=6)
    check = {"check_mode": True, "diff": True}
    tasks = [
        {"name": "worker", "pve_vm": args, **check},
        {"name": "own python", "pve_vm": args, **check, "environment": {"GPULAB_PROBE": "1"}},
    ]
    mark = lab.mark()
    proc, records = _play(lab, tmp_path, {"pve": {"pve_node": "pve"}}, tasks)
    output = proc.stdout + proc.stderr
    assert [(r["task"], r["status"]) for r in records] == [("worker", "ok"), ("own python", "ok")], output[
        -3000:
    ]
    worker, own = (r["result"] for r in records)
    assert worker["changed"] and worker["restart_needed"] and worker["set"] == {"cores": "6"}
    assert worker["diff"]["after"]["cores"] == "6" and worker["diff"]["after_header"].endswith("(would be)")
    assert lab.writes(mark) == []
    assert "pve_vm: running gpulab.tasks.pve_vm in this worker" in output
    warning = "VM 102 (vm-gpu) on node pve runs with hardware changes PVE holds as pending (cores)"
    assert [w.startswith(warning) for w in worker["warnings"]] == [True], worker["warnings"]
    assert warning in output  # once: Ansible shows a warning it already showed no more
    assert {k: v for k, v in worker.items() if k != "invocation"} == {
        k: v for k, v in own.items() if k != "invocation"
    }
    assert lab.desc["token_secret"] not in output

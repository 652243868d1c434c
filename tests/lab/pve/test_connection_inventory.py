"""The PVE modules' connection from the play's module_defaults for the action group gpulab.homelab.pve
(meta/runtime.yml), as the stage playbooks set it once per play from preflight's fact (playbooks/vars/pve_api.yml):
each task passes only its own options, and an option the task gives wins."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml
from ansible_runs import BIN
from unit.pve.conftest import ROOT, PveSimProcess, gpu_vm_args, prepare_gpu_lab, run_module

from gpulab.pve import connection

GROUP = "group/gpulab.homelab.pve"


def test_preflight_keeps_the_connection_without_its_secrets():
    settings = {
        "pve_api_url": "https://pve.example:8006",
        "pve_api_token_id": "gpulab@pve!ansible",
        "pve_api_token_secret": "the-secret",
        "pve_api_password": "pw",
        "pve_api_validate_certs": True,
        "pve_api_fingerprint": "",  # empty: unset
    }
    assert connection.public_params(settings) == {
        "api_url": "https://pve.example:8006",
        "api_token_id": "gpulab@pve!ansible",
        "api_validate_certs": True,
    }


def test_the_pve_group_is_every_module_with_the_connection_options():
    runtime = yaml.safe_load((ROOT / "meta" / "runtime.yml").read_text())
    group = set(runtime["action_groups"]["pve"])
    with_fragment = {
        p.stem
        for p in (ROOT / "plugins" / "modules").glob("[!_]*.py")
        if "- gpulab.homelab.pve\n" in p.read_text()
    }
    assert group == with_fragment == {"lab_table", "pve_download", "pve_info", "pve_pci_mapping", "pve_vm"}


def test_every_play_that_runs_a_pve_module_sets_the_group_defaults():
    """A play whose tasks (or roles) call a PVE module sets module_defaults for the group from vars/pve_api.yml."""
    plays = {
        "playbooks/preflight.yml": "Preflight | validate",
        "playbooks/vms.yml": "Stage 2, vms | images",
        "playbooks/network.yml": "Network | DHCP",
        "playbooks/verify.yml": "Verify | the lab table",
        "playbooks/teardown.yml": "Teardown | destroy",
    }
    for path, name in plays.items():
        [play] = [p for p in yaml.safe_load((ROOT / path).read_text()) if p.get("name", "").startswith(name)]
        assert play["module_defaults"] == {GROUP: "{{ gpulab_pve_connection }}"}, path
        assert "vars/pve_api.yml" in play["vars_files"], path


def _play(
    lab: PveSimProcess, tmp_path, hosts: dict, tasks: list, defaults: dict
) -> tuple[subprocess.CompletedProcess, list]:
    """Runs the tasks on localhost with -vvv, this inventory and `defaults` as the PVE group's module_defaults;
    returns the process and the task records."""
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"proxmox": {"hosts": hosts}}}}))
    play = [
        {
            "name": "PVE modules with the group's connection",
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}"},
            "module_defaults": {GROUP: defaults},
            "tasks": tasks,
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    record = tmp_path / "record.jsonl"
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_CALLBACK_PLUGINS=str(ROOT / "tests" / "unit" / "pve" / "callbacks"),
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
    info = {"gather": ["version"]}
    tasks = [
        {"name": "Node pve", "gpulab.homelab.pve_info": {"node": "pve", **info}},
        {"name": "The task's URL wins", "gpulab.homelab.pve_info": {"node": "pve", "api_url": "https://127.0.0.1:9", "api_timeout": 2, **info}, "ignore_errors": True},
        {
            "name": "The mapping of node pve",
            "gpulab.homelab.pve_pci_mapping": {"id": "rtx3090", "entries": [{"node": "pve", "path": "0000:02:00", "id": "10de:2204"}]},
            "check_mode": True,
        },
    ]  # fmt: skip
    mark = lab.mark()
    proc, records = _play(lab, tmp_path, {"pve": {"pve_node": "pve"}}, tasks, lab.conn(api_retries=0))
    output = proc.stdout + proc.stderr
    assert [(r["task"], r["status"]) for r in records] == [
        ("Node pve", "ok"),
        ("The task's URL wins", "failed"),
        ("The mapping of node pve", "ok"),
    ], output[-3000:]
    assert "127.0.0.1:9" in records[1]["result"]["msg"]
    assert records[2]["result"]["changed"] and records[2]["result"]["requests"]["writes"] == 0
    users = [r["user"] for r in lab.requests(mark) if r["path"] == "/api2/json/version"]
    assert users == [lab.desc["token_id"]]
    assert "AnsiballZ_pve_info.py" in output  # each its own Python, as any module
    assert lab.desc["token_secret"] not in output


@pytest.mark.slow
def test_a_warning_and_the_result_of_a_pending_change(lab, tmp_path):
    """A change PVE would hold as pending on a running VM (check mode, with diff): the module warns once and
    reports what it would set."""
    prepare_gpu_lab(lab)
    run_module("pve_vm", gpu_vm_args(lab, state="started"))
    connection = {k: v for k, v in gpu_vm_args(lab).items() if k.startswith("api_")}
    args = {k: v for k, v in gpu_vm_args(lab, state="started", cores=6).items() if not k.startswith("api_")}
    tasks = [{"name": "pending", "gpulab.homelab.pve_vm": args, "check_mode": True, "diff": True}]
    mark = lab.mark()
    proc, records = _play(lab, tmp_path, {"pve": {"pve_node": "pve"}}, tasks, connection)
    output = proc.stdout + proc.stderr
    assert [(r["task"], r["status"]) for r in records] == [("pending", "ok")], output[-3000:]
    result = records[0]["result"]
    assert result["changed"] and result["restart_needed"] and result["set"] == {"cores": "6"}
    assert result["diff"]["after"]["cores"] == "6" and result["diff"]["after_header"].endswith("(would be)")
    assert lab.writes(mark) == []
    warning = "VM 102 (vm-gpu) on node pve runs with hardware changes PVE holds as pending (cores)"
    assert [w.startswith(warning) for w in result["warnings"]] == [True], result["warnings"]
    assert warning in output
    assert lab.desc["token_secret"] not in output

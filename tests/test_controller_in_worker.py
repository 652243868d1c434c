"""The controller modules run inside the task's worker (plugins/plugin_utils/controller.py runs the engine's
task, gpulab.tasks, with the module's argument spec) and answer exactly as when Ansible starts the module as
its own Python (which it still does for a task with `environment`): the same result, the same failures and
argument errors, check and diff mode, and no secret in the -vvv output."""

import json
import sys
from pathlib import Path

import pytest
import yaml
from ansible_runs import ansible_playbook

ROOT = Path(__file__).resolve().parent.parent
SECRET = "in-worker-secret-5d1f"

VALUES = {
    "chart_version": "2.10.0",
    "name": "hami",
    "namespace": "kube-system",
    "repo": "https://example.test",
}


def _playbook(tmp_path, tasks):
    """Run `tasks` on the controller; each task's result, in order, as the task registered it."""
    names = [f"r{i}" for i in range(len(tasks))]
    dump = tmp_path / "results.json"
    write = {
        "ansible.builtin.copy": {"content": "{{ [" + ", ".join(names) + "] | to_json }}", "dest": str(dump)}
    }
    plays = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [*[{**t, "register": names[i]} for i, t in enumerate(tasks)], write],
        }
    ]
    book = tmp_path / "book.yml"
    book.write_text(yaml.safe_dump(plays))
    inv = tmp_path / "hosts.ini"
    inv.write_text(f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    proc = ansible_playbook("-vvv", "-i", inv, book)
    assert dump.exists(), proc.stdout[-3000:] + proc.stderr[-2000:]
    return proc, json.loads(dump.read_text())


def _same(result):
    """A result without what only the module's own Python adds (its invocation, where Ansible injects it)."""
    return {k: v for k, v in result.items() if k != "invocation"}


def test_a_module_runs_in_the_worker_and_answers_as_its_own_python(tmp_path):
    split = {**VALUES, "device_split_count": 4}
    tasks = [
        {"name": "in the worker", "hami_values": split},
        {"name": "own python", "hami_values": split, "environment": {"GPULAB_PROBE": "1"}},
        {
            "name": "loop",
            "gpulab.homelab.hami_values": {**VALUES, "device_split_count": "{{ item }}"},
            "loop": [2, 3],
        },
    ]
    proc, (worker, own, loop) = _playbook(tmp_path, tasks)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert proc.stdout.count("hami_values: running gpulab.tasks.hami_values in this worker") == 3
    assert worker["values"]["devicePlugin"]["deviceSplitCount"] == 4
    assert _same(worker) == _same(own)
    assert set(_same(worker)) >= {"values", "values_content", "manifest", "keys_known", "changed"}
    assert [r["values"]["devicePlugin"]["deviceSplitCount"] for r in loop["results"]] == [2, 3]


@pytest.mark.parametrize("environment", [None, {"GPULAB_PROBE": "1"}], ids=["worker", "own-python"])
def test_a_failure_keeps_its_message_and_hides_the_secret(tmp_path, environment):
    bad = {
        "name": "bad key",
        "gpulab.homelab.hami_values": {**VALUES, "extra_values": {"devicePlugin": {"nosuchkey": 1}}},
    }
    pve = {
        "name": "unreachable PVE",
        "gpulab.homelab.pve_info": {
            "node": "pve",
            "api_url": "https://127.0.0.1:9",
            "api_token_id": "gpulab@pve!ansible",
            "api_token_secret": SECRET,
            "api_validate_certs": False,
            "api_timeout": 2,
            "api_retries": 0,
        },
        "ignore_errors": True,
    }
    tasks = [{**bad, "ignore_errors": True}, pve]
    if environment:
        tasks = [{**t, "environment": environment} for t in tasks]
    proc, (values, info) = _playbook(tmp_path, tasks)
    assert values["failed"] and "nosuchkey" in values["msg"], values
    assert info["failed"] and info["msg"].startswith("Reading node pve"), info
    assert info["requests"] == {"reads": 1, "writes": 0}  # the one read it tried
    assert SECRET not in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ({**VALUES, "bogus": 1}, "Unsupported parameters for (hami_values) module: bogus."),
        ({**VALUES, "device_split_count": "many"}, "device_split_count"),
        (
            {k: v for k, v in VALUES.items() if k != "chart_version"},
            "missing required arguments: chart_version",
        ),
        ({**VALUES, "kube_scheduler_image": {"tag": 1, "nosuch": "x"}}, "nosuch"),
    ],
    ids=["unknown", "type", "required", "suboption"],
)
def test_an_argument_error_reads_the_same_in_both(tmp_path, args, says):
    tasks = [
        {"name": "worker", "hami_values": args, "ignore_errors": True},
        {
            "name": "own",
            "hami_values": args,
            "ignore_errors": True,
            "environment": {"GPULAB_PROBE": "1"},
        },
    ]
    _, (worker, own) = _playbook(tmp_path, tasks)
    assert worker["failed"] and own["failed"]
    assert says in worker["msg"], worker
    assert worker["msg"] == own["msg"]


def test_check_and_diff_mode_and_a_secret_in_both(tmp_path):
    """A reservation on a dnsmasq on this machine (its hosts file in tmp_path): check mode with diff says
    what it would write and writes nothing, a run writes it, a re-run changes nothing; the router password
    (no_log) appears nowhere, in either path."""
    hosts = tmp_path / "dnsmasq-hosts"
    router = {
        "kind": "dnsmasq",
        "address": "127.0.0.1",
        "subnet": "192.168.100.0/24",
        "password": SECRET,
        "ssh": {"local": True},
        "options": {
            "hostsfile": str(hosts),
            "leasefile": str(tmp_path / "leases"),
            "reload_command": "true",
            "check_wiring": False,
        },
        "reservations": [{"mac": "bc:24:11:00:00:01", "address": "192.168.100.53", "hostname": "vm-1"}],
    }
    own = {"environment": {"GPULAB_PROBE": "1"}}
    check = {"check_mode": True, "diff": True}
    tasks = [
        {"name": "worker, check", "dhcp_reservation": router, **check},
        {"name": "own, check", "dhcp_reservation": router, **check, **own},
        {"name": "worker, run", "dhcp_reservation": router, "diff": True},
        {"name": "own, again", "dhcp_reservation": router, "diff": True, **own},
        {"name": "worker, again", "dhcp_reservation": router},
    ]
    proc, (w_check, o_check, w_run, o_again, w_again) = _playbook(tmp_path, tasks)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert w_check["changed"] and w_check["diff"] and _same(w_check) == _same(o_check)
    assert w_run["changed"] and w_run["diff"] == w_check["diff"]
    assert "192.168.100.53" in hosts.read_text()
    assert not o_again["changed"] and not w_again["changed"]
    assert "diff" in o_again and "diff" not in w_again  # a diff only when the task asks for one
    assert SECRET not in proc.stdout + proc.stderr + Path(tmp_path / "results.json").read_text()

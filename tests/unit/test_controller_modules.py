"""The controller modules run as Ansible runs any module, each its own Python on the controller: its
AnsibleModule checks the arguments it declares (ARGUMENT_SPEC), the engine's task (gpulab.tasks) does the work,
failures keep their message, check and diff mode hold, and no secret shows in the -vvv output. The PVE
connection comes from the play's module_defaults for the action group gpulab.homelab.pve."""

import json
import sys
from pathlib import Path

import pytest
import yaml
from ansible_runs import ansible_playbook

ROOT = Path(__file__).resolve().parent.parent.parent
SECRET = "in-worker-secret-5d1f"

VALUES = {
    "chart_version": "2.10.0",
    "name": "hami",
    "namespace": "kube-system",
    "repo": "https://example.test",
}


def _playbook(tmp_path, tasks, module_defaults=None):
    """Run `tasks` on the controller (with the play's `module_defaults`); each task's result, in order, as
    the task registered it."""
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
            **({"module_defaults": module_defaults} if module_defaults else {}),
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


def test_a_module_runs_as_its_own_python_in_a_loop_too(tmp_path):
    split = {**VALUES, "device_split_count": 4}
    tasks = [
        {"name": "once", "gpulab.homelab.hami_values": split},
        {
            "name": "loop",
            "gpulab.homelab.hami_values": {**VALUES, "device_split_count": "{{ item }}"},
            "loop": [2, 3],
        },
    ]
    proc, (once, loop) = _playbook(tmp_path, tasks)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "running gpulab.tasks" not in proc.stdout  # no runner in the worker
    assert once["values"]["devicePlugin"]["deviceSplitCount"] == 4
    assert set(once) >= {"values", "values_content", "manifest", "keys_known", "changed"}
    assert "AnsiballZ_hami_values.py" in proc.stdout  # shipped and started as any module
    assert [r["values"]["devicePlugin"]["deviceSplitCount"] for r in loop["results"]] == [2, 3]


def test_a_failure_keeps_its_message_and_the_connection_comes_from_the_group_defaults(tmp_path):
    bad = {
        "name": "bad key",
        "gpulab.homelab.hami_values": {**VALUES, "extra_values": {"devicePlugin": {"nosuchkey": 1}}},
        "ignore_errors": True,
    }
    pve = {"name": "unreachable PVE", "gpulab.homelab.pve_info": {"node": "pve"}, "ignore_errors": True}
    connection = {
        "api_url": "https://127.0.0.1:9",
        "api_token_id": "gpulab@pve!ansible",
        "api_token_secret": SECRET,
        "api_validate_certs": False,
        "api_timeout": 2,
        "api_retries": 0,
    }
    proc, (values, info) = _playbook(
        tmp_path, [bad, pve], module_defaults={"group/gpulab.homelab.pve": connection}
    )
    assert values["failed"] and "nosuchkey" in values["msg"], values
    assert info["failed"] and info["msg"].startswith("Reading node pve"), info
    assert "127.0.0.1:9" in info["msg"]  # the group's api_url
    assert info["requests"] == {"reads": 1, "writes": 0}  # the one read it tried
    assert SECRET not in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ({**VALUES, "bogus": 1}, "Unsupported parameters for (gpulab.homelab.hami_values) module: bogus."),
        ({**VALUES, "device_split_count": "many"}, "device_split_count"),
        (
            {k: v for k, v in VALUES.items() if k != "chart_version"},
            "missing required arguments: chart_version",
        ),
        ({**VALUES, "kube_scheduler_image": {"tag": 1, "nosuch": "x"}}, "nosuch"),
    ],
    ids=["unknown", "type", "required", "suboption"],
)
def test_an_argument_error_is_ansible_modules(tmp_path, args, says):
    tasks = [{"name": "bad", "gpulab.homelab.hami_values": args, "ignore_errors": True}]
    _, (bad,) = _playbook(tmp_path, tasks)
    assert bad["failed"]
    assert says in bad["msg"], bad


def test_check_and_diff_mode_and_a_secret(tmp_path):
    """A reservation on a dnsmasq on this machine (its hosts file in tmp_path): check mode with diff says
    what it would write and writes nothing, a run writes it, a re-run changes nothing; the router password
    (no_log) appears nowhere."""
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
    module = "gpulab.homelab.dhcp_reservation"
    tasks = [
        {"name": "check", module: router, "check_mode": True, "diff": True},
        {"name": "run", module: router, "diff": True},
        {"name": "again, diff", module: router, "diff": True},
        {"name": "again", module: router},
    ]
    proc, (check, run, again_diff, again) = _playbook(tmp_path, tasks)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert check["changed"] and check["diff"]
    assert run["changed"] and run["diff"] == check["diff"]
    assert "192.168.100.53" in hosts.read_text()
    assert not again_diff["changed"] and not again["changed"]
    assert "diff" in again_diff and "diff" not in again  # a diff only when the task asks for one
    assert SECRET not in proc.stdout + proc.stderr + Path(tmp_path / "results.json").read_text()

"""The controller modules run inside the task's worker (plugins/action/gpulab_controller.py) and answer
exactly as when Ansible starts them as their own Python (which it still does for a task with
`environment`)."""

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


def test_a_module_runs_in_the_worker_and_answers_as_its_own_python(tmp_path):
    split = {**VALUES, "device_split_count": 4}
    tasks = [
        {"name": "in the worker", "gpulab_hami_values": split},
        {"name": "own python", "gpulab_hami_values": split, "environment": {"GPULAB_PROBE": "1"}},
        {
            "name": "loop",
            "gpulab_hami_values": {**VALUES, "device_split_count": "{{ item }}"},
            "loop": [2, 3],
        },
    ]
    proc, (worker, own, loop) = _playbook(tmp_path, tasks)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert proc.stdout.count("gpulab_hami_values.py in this worker") == 3  # the first task and 2 items
    assert worker["values"]["devicePlugin"]["deviceSplitCount"] == 4
    assert {k: worker[k] for k in ("values", "manifest", "changed")} == {
        k: own[k] for k in ("values", "manifest", "changed")
    }
    assert [r["values"]["devicePlugin"]["deviceSplitCount"] for r in loop["results"]] == [2, 3]


@pytest.mark.parametrize("environment", [None, {"GPULAB_PROBE": "1"}], ids=["worker", "own-python"])
def test_a_failure_keeps_its_message_and_hides_the_secret(tmp_path, environment):
    bad = {
        "name": "bad key",
        "gpulab_hami_values": {**VALUES, "extra_values": {"devicePlugin": {"nosuchkey": 1}}},
    }
    pve = {
        "name": "unreachable PVE",
        "gpulab_pve_info": {
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

"""Every controller module is its documentation and one task of the engine (gpulab.tasks), started through the
one main() (plugins/module_utils/controller_module.py) or run in the worker by the one action plugin
(plugins/plugin_utils/controller.py); every PVE module takes its connection through
plugins/plugin_utils/pve_connection.py."""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible.plugins.loader import action_loader
from ansible_collections.gpulab.homelab.plugins.module_utils.controller_module import GPULAB_MISSING
from ansible_modules import MODULES, command

from gpulab import tasks
from gpulab.pve.client import PveError

ROOT = Path(__file__).resolve().parents[1]
ACTIONS = ROOT / "plugins" / "action"
PVE_MODULES = {
    "pve_info",
    "pve_download",
    "pve_pci_mapping",
    "pve_vm",
    "lab_table",
}
CONTROLLER = PVE_MODULES | {
    "hami_values",
    "hami_workloads",
    "dhcp_reservation",
    "monitoring_charts",
}


def imports(tree: ast.Module) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def controller_modules() -> dict[str, ast.Module]:
    """The modules whose main() is a task of the engine (they run on the controller), by name."""
    out = {}
    for path in sorted(MODULES.glob("[!_]*.py")):
        tree = ast.parse(path.read_text())
        if "ansible_collections.gpulab.homelab.plugins.module_utils.controller_module" in imports(tree):
            out[path.stem] = tree
    return out


def test_the_controller_modules_are_found_and_each_has_its_task():
    assert set(controller_modules()) == CONTROLLER
    engine = {p.stem for p in (ROOT / "library" / "gpulab" / "tasks").glob("*.py")} - {"__init__"}
    assert engine == CONTROLLER
    for name in CONTROLLER:
        assert tasks.of(name) is not None and tasks.of(f"ansible.legacy.{name}") is tasks.of(name)
        assert callable(tasks.of(name).run)
    assert tasks.of("gpu_facts") is None and tasks.of("ansible.builtin.copy") is None


@pytest.mark.parametrize("name", sorted(CONTROLLER))
def test_a_controller_module_is_its_documentation_and_its_task(name):
    tree = controller_modules()[name]
    assert imports(tree) - {"__future__"} == {
        "ansible_collections.gpulab.homelab.plugins.module_utils.controller_module"
    }, "the engine is the task's"
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    [main] = [n for n in calls if n.func.id == "run_module"]
    assert [a.value for a in main.args] == [name]
    assigns = {
        t.id: n.value
        for n in tree.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    assert set(assigns) == {"DOCUMENTATION", "EXAMPLES", "RETURN"}, "the options are the task's"
    pve = getattr(tasks.of(name), "PVE", False)
    assert pve == (name in PVE_MODULES)
    doc = assigns["DOCUMENTATION"].value
    fragment = "gpulab.homelab.pve"  # by its full name, as an installed collection finds it
    assert (fragment in yaml.safe_load(doc).get("extends_documentation_fragment", [])) == pve
    # Run returns the request counts of a PVE task: its RETURN documents them, itself or by the fragment
    returned = yaml.safe_load(assigns["RETURN"].value)
    documented = "requests" in returned or fragment in returned.get("extends_documentation_fragment", [])
    assert documented == pve


def test_every_controller_module_runs_in_the_worker_and_only_pve_modules_take_the_inventory_connection():
    # by their full names, as the playbooks call them (tests/conftest.py: the checkout is gpulab.homelab)
    from ansible_collections.gpulab.homelab.plugins.plugin_utils.controller import (
        ActionModule as worker,
    )
    from ansible_collections.gpulab.homelab.plugins.plugin_utils.pve_connection import (
        ActionModule as pve,
    )

    plugins = {p.stem for p in ACTIONS.glob("[!_]*.py")}
    # pve_access runs its module on the node; its action plugin does the controller's part.
    # wait runs another module (on the task's host) until it reports what was waited for.
    # run_lock runs its module on the node; its action plugin says who this run is.
    # apt_locks runs its module on the guest until no process holds apt's locks, saying who does.
    assert plugins == CONTROLLER | {
        "preflight",
        "pve_access",
        "wait",
        "run_lock",
        "apt_locks",
    }
    for name in sorted(CONTROLLER):
        plugin = action_loader.get(f"gpulab.homelab.{name}", class_only=True)
        assert issubclass(plugin, worker), name
        assert issubclass(plugin, pve) == (name in PVE_MODULES), name


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("pve_info", {"node": "pve", "api_url": "https://pve:8006", "api_token_secret": "tok-S3cret"}),
        ("hami_workloads", {"engines": [], "gpus_by_node": {}}),
    ],
)
def test_without_gpulab_a_module_says_what_is_missing(name, args):
    cmd = command(MODULES / f"{name}.py", json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    cmd[2] = "import sys; sys.modules['gpulab'] = None; " + cmd[2]  # `import gpulab` fails as without it
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    result = json.loads(proc.stdout)
    assert result["failed"] and result["msg"] == GPULAB_MISSING
    assert "tok-S3cret" not in proc.stdout + proc.stderr


class FakeTask:
    def __init__(self, params, secrets=()):
        self.params = params
        self.no_log_values = set(secrets)


def test_an_engine_error_fails_with_what_was_done_the_result_and_the_request_counts():
    task = FakeTask({"api_url": "https://pve:8006", "api_password": "p&ss word"}, secrets=["p&ss word"])
    result = {"node": "pve", "msg": "not for failures"}
    with pytest.raises(tasks.Failed) as failed, tasks.Run(task, "Reading node pve", result=result):
        raise PveError("refused", call="POST /access/ticket?password=p%26ss%20word&again=p%26ss+word")
    assert (
        failed.value.msg == "Reading node pve: POST /access/ticket?password=********&again=********: refused"
    )
    assert failed.value.result == {"changed": False, "node": "pve", "requests": {"reads": 0, "writes": 0}}


def test_only_the_named_errors_are_mapped_and_a_task_without_pve_reports_no_requests():
    task = FakeTask({"engines": []})
    with pytest.raises(tasks.Failed) as failed, tasks.Run(task, "Planning", ValueError):
        raise ValueError("two engines on one card")
    assert (failed.value.msg, failed.value.result) == (
        "Planning: two engines on one card",
        {"changed": False},
    )
    with pytest.raises(KeyError), tasks.Run(task, "Planning", ValueError):
        raise KeyError("a bug stays a traceback")


def test_no_log_values_are_found_in_suboptions_and_lists():
    spec = tasks.argument_spec(tasks.of("dhcp_reservation"))
    params = {"password": "top", "ssh": {"password": "ssh-pw", "user": "u"}, "reservations": [{"mac": "m"}]}
    assert tasks.no_log_values(spec, params) == {"top", "ssh-pw"}
    pve = tasks.argument_spec(tasks.of("pve_vm"))
    assert {"api_token_secret", "api_password"} <= {k for k, v in pve.items() if v.get("no_log")}
    found = tasks.no_log_values(pve, {"api_token_secret": "tok", "cloudinit": {"password": "ci-pw"}})
    assert found == {"tok", "ci-pw"}

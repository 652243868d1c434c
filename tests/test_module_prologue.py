"""Every controller module starts through the one prologue (plugins/module_utils/gpulab_module.py), and every
PVE module takes its connection through the one action plugin (plugins/action/gpulab_pve_connection.py)."""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.gpulab_module import GPULAB_MISSING, ModuleRun
from ansible.plugins.loader import action_loader
from ansible_modules import MODULES, command

from gpulab.pve.client import PveError

ROOT = Path(__file__).resolve().parents[1]
ACTIONS = ROOT / "plugins" / "action"
PVE_MODULES = {
    "gpulab_pve_info",
    "gpulab_pve_download",
    "gpulab_pve_pci_mapping",
    "gpulab_pve_vm",
    "gpulab_lab_table",
}
CONTROLLER = PVE_MODULES | {"gpulab_hami_values", "gpulab_hami_workloads", "gpulab_dhcp_reservation"}


def imports(tree: ast.Module) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def controller_modules() -> dict[str, ast.Module]:
    """The modules that use the engine (they run on the controller), by name."""
    out = {}
    for path in sorted(MODULES.glob("gpulab_*.py")):
        tree = ast.parse(path.read_text())
        if any(name == "gpulab" or name.startswith("gpulab.") for name in imports(tree)):
            out[path.stem] = tree
    return out


def test_the_controller_modules_are_found():
    assert set(controller_modules()) == CONTROLLER


@pytest.mark.parametrize("name", sorted(CONTROLLER))
def test_a_controller_module_keeps_no_prologue_of_its_own(name):
    tree = controller_modules()[name]
    assert "ansible.module_utils.gpulab_module" in imports(tree)
    assigned = {
        t.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    assert not assigned & {"HAS_GPULAB", "GPULAB_ERR"}, "the import guard is the prologue's"
    handlers = [n for n in ast.walk(tree) if isinstance(n, ast.ExceptHandler)]
    assert not [h for h in handlers if isinstance(h.type, ast.Name) and h.type.id == "ImportError"]
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    called = {n.func.id for n in calls}
    [prologue] = [n for n in calls if n.func.id == "controller_module"]
    # a PVE module (documented with the gpulab_pve fragment) gets the connection options from the prologue
    pve = any(
        k.arg == "pve" and isinstance(k.value, ast.Constant) and k.value.value is True
        for k in prologue.keywords
    )
    assert pve == (name in PVE_MODULES)
    assigns = {
        t.id: n.value
        for n in tree.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    doc = assigns["DOCUMENTATION"].value
    assert ("gpulab_pve" in yaml.safe_load(doc).get("extends_documentation_fragment", [])) == pve
    # ModuleRun returns the request counts of a PVE module: its RETURN documents them, itself or by the fragment
    returned = yaml.safe_load(assigns["RETURN"].value)
    documented = "requests" in returned or "gpulab_pve" in returned.get("extends_documentation_fragment", [])
    assert documented == pve
    assert not called & {"AnsibleModule", "missing_required_lib"}, "the module is built by the prologue"
    # the engine is imported under `if HAS_GPULAB:` only, so that a missing gpulab is reported, not raised
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not [n for n in top if "gpulab" in imports(ast.Module(body=[n], type_ignores=[]))]


def test_every_controller_module_runs_in_the_worker_and_only_pve_modules_take_the_inventory_connection():
    action_loader.add_directory(str(ACTIONS))  # as ansible.cfg's action_plugins, from any working directory
    worker = action_loader.get("gpulab_controller", class_only=True)
    pve = action_loader.get("gpulab_pve_connection", class_only=True)
    plugins = {p.stem for p in ACTIONS.glob("gpulab_*.py")} - {"gpulab_controller", "gpulab_pve_connection"}
    # gpulab_pve_access runs its module on the node; its action plugin does the controller's part.
    # gpulab_wait runs another module (on the task's host) until it reports what was waited for.
    assert plugins == CONTROLLER | {"gpulab_preflight", "gpulab_pve_access", "gpulab_wait"}
    for name in sorted(CONTROLLER):
        plugin = action_loader.get(name, class_only=True)
        assert issubclass(plugin, worker), name
        assert issubclass(plugin, pve) == (name in PVE_MODULES), name


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("gpulab_pve_info", {"node": "pve", "api_url": "https://pve:8006", "api_token_secret": "tok-S3cret"}),
        ("gpulab_hami_workloads", {"engines": [], "gpus_by_node": {}}),
    ],
)
def test_without_gpulab_a_module_says_what_is_missing(name, args):
    cmd = command(MODULES / f"{name}.py", json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    cmd[2] = "import sys; sys.modules['gpulab'] = None; " + cmd[2]  # `import gpulab` fails as without it
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    result = json.loads(proc.stdout)
    assert result["failed"] and result["msg"] == GPULAB_MISSING
    assert "tok-S3cret" not in proc.stdout + proc.stderr


class Failed(Exception):
    pass


class FakeModule:
    def __init__(self, spec, secrets=()):
        self.argument_spec = spec
        self.no_log_values = set(secrets)

    def fail_json(self, **result):
        raise Failed(result)


def test_an_engine_error_fails_with_what_was_done_the_result_and_the_request_counts():
    module = FakeModule({"api_url": {}, "api_password": {"no_log": True}}, secrets=["p&ss word"])
    result = {"node": "pve", "msg": "not for failures"}
    with pytest.raises(Failed) as failed, ModuleRun(module, "Reading node pve", result=result):
        raise PveError("refused", call="POST /access/ticket?password=p%26ss%20word&again=p%26ss+word")
    assert failed.value.args[0] == {
        "msg": "Reading node pve: POST /access/ticket?password=********&again=********: refused",
        "changed": False,
        "node": "pve",
        "requests": {"reads": 0, "writes": 0},
    }


def test_only_the_named_errors_are_mapped_and_a_module_without_pve_reports_no_requests():
    module = FakeModule({"engines": {}})
    with pytest.raises(Failed) as failed, ModuleRun(module, "Planning", ValueError):
        raise ValueError("two engines on one card")
    assert failed.value.args[0] == {"msg": "Planning: two engines on one card", "changed": False}
    with pytest.raises(KeyError), ModuleRun(module, "Planning", ValueError):
        raise KeyError("a bug stays a traceback")

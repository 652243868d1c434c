"""Every controller module is an ordinary Ansible module: its documentation, its argument spec, and a main()
that builds its AnsibleModule and runs one task of the engine (gpulab.tasks, through
plugins/module_utils/controller_module.py's run_task). No action plugin runs it in the worker or fills in its
options: an action plugin stays only to show progress on a long wait (pve_vm, pve_download)."""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible.plugins.action import ActionBase
from ansible.plugins.loader import action_loader
from ansible_collections.gpulab.homelab.plugins.module_utils.controller_module import GPULAB_MISSING
from ansible_modules import MODULES, command

from gpulab import tasks
from gpulab.pve.client import PveError

ROOT = Path(__file__).resolve().parents[2]
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
def test_a_controller_module_is_its_documentation_its_spec_and_an_ansible_module(name):
    tree = controller_modules()[name]
    pve = name in PVE_MODULES
    assert imports(tree) - {"__future__"} == {
        "ansible_collections.gpulab.homelab.plugins.module_utils.controller_module",
    } | ({"ansible_collections.gpulab.homelab.plugins.module_utils"} if pve else set())
    # no engine import in the file: run_module builds the AnsibleModule from the file's spec and rules, then
    # imports the engine's task by name (a controller without the engine gets missing_required_lib)
    assert not [n for n in tree.body if isinstance(n, ast.Try)]
    [main] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    calls = [n for n in ast.walk(main) if isinstance(n, ast.Call)]
    assert [(c.func.id, [getattr(a, "id", getattr(a, "value", None)) for a in c.args]) for c in calls] == [
        ("run_module", ["ARGUMENT_SPEC", "RULES", name])
    ]
    assigns = {
        t.id: n.value
        for n in tree.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name) and t.id.isupper() and not t.id.startswith(("HAS_", "GPULAB_"))
    }
    # an option's suboptions may be named above the spec (<OPTION>_OPTIONS), so that the spec is one option a line
    suboptions = {k for k in assigns if k.endswith("_OPTIONS")}
    assert set(assigns) - suboptions == {"DOCUMENTATION", "EXAMPLES", "RETURN", "ARGUMENT_SPEC", "RULES"}
    loaded = _load(name)
    for named in suboptions:
        option = named.removesuffix("_OPTIONS").lower()
        assert loaded.ARGUMENT_SPEC[option]["options"] is getattr(loaded, named), named
    # a PVE module spreads the connection options (plugins/module_utils/pve.py) into its spec
    assert pve == ("api_url" in loaded.ARGUMENT_SPEC)
    doc = assigns["DOCUMENTATION"].value
    fragment = "gpulab.homelab.pve"  # by its full name, as an installed collection finds it
    assert (fragment in yaml.safe_load(doc).get("extends_documentation_fragment", [])) == pve
    # Run returns the request counts of a PVE task: its RETURN documents them, itself or by the fragment
    returned = yaml.safe_load(assigns["RETURN"].value)
    documented = "requests" in returned or fragment in returned.get("extends_documentation_fragment", [])
    assert documented == pve


def test_no_runner_in_the_worker_and_an_action_plugin_only_for_progress():
    plugins = {p.stem for p in ACTIONS.glob("[!_]*.py")}
    # pve_vm and pve_download say how long they have waited (the VM's address, the download).
    # pve_access runs its module on the node; its action plugin does the controller's part.
    # wait runs another module (on the task's host) until it reports what was waited for.
    # run_lock runs its module on the node; its action plugin says who this run is.
    # apt_locks runs its module on the guest until no process holds apt's locks, saying who does.
    assert plugins == {"pve_vm", "pve_download", "preflight", "pve_access", "wait", "run_lock", "apt_locks"}
    utils = {p.stem for p in (ROOT / "plugins" / "plugin_utils").glob("[!_]*.py")}
    assert not utils & {"controller", "pve_connection"}
    for name in ("pve_vm", "pve_download"):
        plugin = action_loader.get(f"gpulab.homelab.{name}", class_only=True)
        assert plugin.__bases__ == (ActionBase,), name
        assert "module_args" not in vars(plugin), f"{name}: the task's arguments go to the module as they are"


@pytest.mark.parametrize(
    ("name", "args"),
    [
        (
            "pve_info",
            {
                "node": "pve",
                "api_url": "https://pve:8006",
                "api_token_id": "a@pve!t",
                "api_token_secret": "tok-S3cret",
            },
        ),
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


def test_secret_options_are_no_log_in_the_declared_spec_suboptions_too():
    from ansible.module_utils.common.parameters import _list_no_log_values

    dhcp = _load("dhcp_reservation").ARGUMENT_SPEC
    params = {"password": "top", "ssh": {"password": "ssh-pw", "user": "u"}, "reservations": [{"mac": "m"}]}
    assert _list_no_log_values(dhcp, params) == {"top", "ssh-pw"}
    pve = _load("pve_vm").ARGUMENT_SPEC
    assert {"api_token_secret", "api_password"} <= {k for k, v in pve.items() if v.get("no_log")}
    found = _list_no_log_values(pve, {"api_token_secret": "tok", "cloudinit": {"password": "ci-pw"}})
    assert found == {"tok", "ci-pw"}


def _load(name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"prologue_{name}", MODULES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

"""The main() of every controller module: its AnsibleModule, then its engine task.

A controller module (pve_vm, pve_info, dhcp_reservation, ...) declares its arguments itself (ARGUMENT_SPEC and
RULES, the one place they are declared: written by hand, but for pve_vm's, which `make docs` writes from its
option table gpulab.pve.vmoptions; a PVE module spreads the connection options of pve.py into them); its main() is
`run_module(ARGUMENT_SPEC, RULES, "<name>")`, which builds the AnsibleModule from them; `run_task` runs the
engine's task gpulab.tasks.<name> with the checked options, check and diff mode, and reports its result or its
failure. The engine (the gpulab distribution,
requirements.txt) runs on the controller; a module whose Python lacks it fails with GPULAB_MISSING.
"""

from __future__ import annotations

import importlib
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

GPULAB_MISSING = missing_required_lib(
    "gpulab (the project's engine: pip install -r requirements.txt, or make venv in a checkout)",
    reason="on the controller: run the playbook with the Python that holds it",
)


class ModuleTask:
    """What a task of gpulab.tasks is given (gpulab.tasks.Task), from the AnsibleModule."""

    def __init__(self, module):
        self.params = module.params
        self.check_mode = module.check_mode
        self.diff = module._diff
        self.no_log_values = module.no_log_values
        self.warn = module.warn
        self.log = module.log


def run_task(module, name: str) -> None:
    """Run the engine's task `name` (gpulab.tasks.<name>) with the module's checked options, then exit with its
    result, or fail with its message and the result so far. Without the engine the module fails with
    GPULAB_MISSING (after AnsibleModule has checked the arguments)."""
    try:
        task = importlib.import_module(f"gpulab.tasks.{name}")
        from gpulab.tasks import Failed
    except ImportError:
        module.fail_json(msg=GPULAB_MISSING, exception=traceback.format_exc())

    try:
        result = task.run(ModuleTask(module))
    except Failed as failed:
        module.fail_json(msg=failed.msg, **failed.result)
    module.exit_json(**result)


def run_module(argument_spec: dict, rules: dict, name: str) -> None:
    """The main() of a controller module: its AnsibleModule (the file's ARGUMENT_SPEC and RULES, check mode
    supported), then the engine's task `name` run with it (run_task)."""
    run_task(AnsibleModule(argument_spec=argument_spec, supports_check_mode=True, **rules), name)

"""The main() every gpulab controller module shares, wherever Ansible starts the module as its own Python.

Modules import it as a collection's modules import its module_utils,
`from ansible_collections.gpulab.homelab.plugins.module_utils.controller_module import run_module`: Ansible finds
it in the collection gpulab.homelab (installed, or this checkout through .collections and ansible.cfg
`collections_path`) and ships it with the module; the tests put .collections on sys.path
(tests/ansible_modules.py). A controller module keeps its
documentation (DOCUMENTATION, EXAMPLES, RETURN) and its main() is

    def main():
        run_module("pve_info")

The options and what the module does live in the engine, gpulab.tasks.pve_info (the action plugin
plugins/plugin_utils/controller.py runs the same in the task's worker): here they become an
AnsibleModule, which checks the arguments, runs the task and reports its result, failure or warnings.
These modules run on the controller with the project's virtualenv, which holds the engine (gpulab;
requirements.txt for a collection user); without it the module fails with Ansible's missing-library message
(missing_required_lib), as the action plugins do when the controller's own Python lacks it.
"""

from __future__ import annotations

import traceback

from ansible.module_utils.basic import AnsibleModule, _load_params, env_fallback, missing_required_lib

try:
    from gpulab import tasks
except ImportError:
    HAS_GPULAB, GPULAB_ERR = False, traceback.format_exc()
else:
    HAS_GPULAB, GPULAB_ERR = True, None

# The same words as the action plugins' when the controller's Python lacks the engine (plugins/action).
GPULAB_MISSING = missing_required_lib(
    "gpulab (the project's engine: pip install -r requirements.txt, or make venv in a checkout)",
    reason="on the controller: run the playbook with the Python that holds it",
)


class ModuleTask:
    """What a task of gpulab.tasks is given (gpulab.tasks.Task), from the AnsibleModule."""

    def __init__(self, module: AnsibleModule):
        self.params = module.params
        self.check_mode = module.check_mode
        self.diff = module._diff
        self.no_log_values = module.no_log_values
        self.warn = module.warn
        self.log = module.log


def run_module(name: str) -> None:
    """The main() of controller module `name`: its task of gpulab.tasks as an AnsibleModule (check mode
    supported). Without gpulab the options cannot be known, so the module fails naming the missing
    package whatever options it was given (each of them hidden)."""
    if not HAS_GPULAB:
        given = _load_params()
        hidden = {opt: {"type": "raw", "no_log": True} for opt in given if not opt.startswith("_ansible_")}
        AnsibleModule(argument_spec=hidden, supports_check_mode=True).fail_json(
            msg=GPULAB_MISSING, exception=GPULAB_ERR
        )
    task = tasks.of(name)
    module = AnsibleModule(
        argument_spec=tasks.argument_spec(task, env_fallback), supports_check_mode=True, **tasks.rules(task)
    )
    try:
        result = task.run(ModuleTask(module))
    except tasks.Failed as failed:
        module.fail_json(msg=failed.msg, **failed.result)
    module.exit_json(**result)

"""The prologue every gpulab controller module shares: the import guard of the engine, the AnsibleModule
built from an argument spec, and a run that maps the engine's errors to a failure with a clear message
(and, for a PVE module, connects and reports the request counts).

Modules import it the standard way, `from ansible.module_utils.gpulab_module import ...`: Ansible finds it
in plugins/module_utils (ansible.cfg `module_utils`) and ships it with the module; the tests add that folder
to `ansible.module_utils` (tests/ansible_modules.py). A module imports what it needs of the engine under
`if HAS_GPULAB:`, declares only its own options (ARGUMENT_SPEC, or build_argument_spec() where they
need the engine) and starts main() with

    module = controller_module(ARGUMENT_SPEC, pve=True)
    with ModuleRun(module, f"Reading node {p['node']}", SomeError, result=result) as run:
        ... run.connect() ...
    run.exit()

These modules run on the controller with the project's virtualenv, which holds the engine (gpulab).
"""

from __future__ import annotations

import traceback
from urllib.parse import quote, quote_plus

from ansible.module_utils.basic import AnsibleModule, _load_params, env_fallback, missing_required_lib

try:
    import gpulab  # noqa: F401 - each module imports its own parts of it under `if HAS_GPULAB:`
except ImportError:
    HAS_GPULAB, GPULAB_ERR = False, traceback.format_exc()
else:
    HAS_GPULAB, GPULAB_ERR = True, None

GPULAB_MISSING = missing_required_lib(
    "gpulab (the project's Python package)",
    reason="on the controller: run the playbook with the project's virtualenv (make venv)",
)


def argument_spec(own, pve=False, fallback=env_fallback):
    """A module's whole argument spec: its own options (`own`: a dict, or a function that returns it when
    they need the engine) and, for a PVE module, the connection options of gpulab.pve.connection (doc
    fragment gpulab_pve), which fall back to the PVE_API_* environment variables through `fallback` (they
    replace any the module declares itself)."""
    spec = dict(own() if callable(own) else own)
    if pve:
        from gpulab.pve import connection

        spec.update(connection.argument_spec(fallback))
    return spec


def controller_module(own, pve=False, **kwargs):
    """The AnsibleModule (check mode supported) of a controller module, or its failure without gpulab.

    `own` and `pve` as for `argument_spec`; a PVE module also gets the rules of the connection options (a
    token or a user and password, not both). Without gpulab the options cannot be known, so the module
    fails naming the missing package whatever options it was given.
    """
    if not HAS_GPULAB:
        given = _load_params()
        hidden = {name: {"type": "raw", "no_log": True} for name in given if not name.startswith("_ansible_")}
        AnsibleModule(argument_spec=hidden, supports_check_mode=True).fail_json(
            msg=GPULAB_MISSING, exception=GPULAB_ERR
        )
    if pve:
        from gpulab.pve import connection

        kwargs = {**connection.MODULE_KWARGS, **kwargs}
    return AnsibleModule(argument_spec=argument_spec(own, pve), supports_check_mode=True, **kwargs)


class ModuleRun:
    """The body of a module's main(): `with ModuleRun(module, what, *errors, result=result) as run:`.

    One of `errors` raised in the body fails the module with "<what>: <error>" and the result so far (its
    `msg` left out). A PVE module (one with the api_url option) fails so on a PveError too, connects with
    `run.connect()`, and its result carries `requests`, the reads and writes sent, on failure as well.
    Secrets stay out of the message: fail_json masks the module's no_log values, and the message is cleared
    of their URL-encoded forms here. `run.exit(**more)` ends the module with the result.
    """

    def __init__(self, module, what, *errors, result=None):
        self.module = module
        self.what = what
        self.result = {"changed": False} if result is None else result
        self.result.setdefault("changed", False)
        self.pve = "api_url" in module.argument_spec
        if self.pve:
            from gpulab.pve.client import PveError

            errors = (*errors, PveError)
        self.errors = errors
        self.client = None

    def connect(self):
        """The PVE client of the module's connection options; its requests are counted from here."""
        from gpulab.pve import connection

        self.client = connection.connect(self.module.params)
        return self.client

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if isinstance(exc, self.errors):
            self.fail(f"{self.what}: {exc}")
        return False

    def _out(self):
        out = dict(self.result)
        if self.pve:
            c = self.client
            out["requests"] = {"reads": c.reads if c else 0, "writes": c.writes if c else 0}
        return out

    def fail(self, msg):
        for secret in self.module.no_log_values:
            if len(str(secret)) >= 3:
                for form in (quote(str(secret), safe=""), quote_plus(str(secret))):
                    msg = msg.replace(form, "********")
        out = self._out()
        out.pop("msg", None)
        self.module.fail_json(msg=msg, **out)

    def exit(self, **more):
        self.result.update(more)
        self.module.exit_json(**self._out())

"""What each controller module does, as a function of its checked options: one module of this package per
module of plugins/modules that runs on the controller (hami_values -> gpulab.tasks.hami_values).

Each holds `run(task)`, which does the work and returns the result, or raises `Failed` with the message and
the result so far. `task` is what the caller gives: the checked options (`params`), `check_mode`, `diff`,
`warn(msg)`, `log(msg)` and `no_log_values`.

The options themselves are declared once, in the module file (plugins/modules/<name>.py): its ARGUMENT_SPEC
and RULES, written by hand (a PVE module spreads the connection options of plugins/module_utils/pve.py into
them; pve_vm's spec is the one `make docs` writes, from its option table gpulab.pve.vmoptions). Its main()
builds the AnsibleModule and runs the task (plugins/module_utils/controller_module.py, `run_task`); a task
reads its options from `params` by name. Nothing here imports Ansible.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any, Protocol

COLLECTION = "gpulab.homelab."


class Task(Protocol):
    params: Mapping[str, Any]
    check_mode: bool
    diff: bool
    no_log_values: set

    def warn(self, msg: str) -> None: ...

    def log(self, msg: str) -> None: ...


class Failed(Exception):
    """The task failed: `msg` says what was being done and why; `result` is what it had found so far."""

    def __init__(self, msg: str, result: Mapping[str, Any] | None = None):
        super().__init__(msg)
        self.msg = msg
        self.result = {k: v for k, v in (result or {}).items() if k not in ("msg", "failed")}


def of(module_name: str) -> ModuleType | None:
    """The task of the module `module_name` (a bare or dotted name such as ansible.legacy.pve_vm),
    None for a module that has none (one that runs on a managed host)."""
    prefix, _, short = module_name.rpartition(".")
    if prefix not in ("", "ansible.legacy", COLLECTION.rstrip(".")):
        return None
    try:
        return importlib.import_module(f"{__name__}.{short}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{short}":
            raise
        return None


def plain(value: Any) -> Any:
    """`value` with subclasses of str, int, float, dict and list (such as the tagged values of a templated
    task argument) made the plain types, the way a module reads its arguments from JSON."""
    if isinstance(value, bool) or value is None:
        return value
    for kind in (int, float, str):
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, Mapping):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


class Run:
    """The body of a task's run(): `with Run(task, what, *errors, result=result) as run:` ... `return run.done()`.

    One of `errors` raised in the body fails the task with "<what>: <error>" and the result so far (its
    `msg` left out). A PVE task (one with the api_url option) fails so on a PveError too, connects with
    `run.connect()`, and its result carries `requests`, the reads and writes sent, on failure as well.
    The message is cleared of the secrets' URL-encoded forms (the caller masks them as they are).
    """

    def __init__(self, task: Task, what: str, *errors: type[BaseException], result: dict | None = None):
        self.task = task
        self.what = what
        self.result = {"changed": False} if result is None else result
        self.result.setdefault("changed", False)
        self.pve = "api_url" in task.params
        if self.pve:
            from gpulab.pve.client import PveError

            errors = (*errors, PveError)
        self.errors = errors
        self.client = None

    def connect(self):
        """The PVE client of the task's connection options; its requests are counted from here."""
        from gpulab.pve import connection

        self.client = connection.connect(self.task.params)
        return self.client

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if isinstance(exc, self.errors):
            # here, not at the top: the routers' package (jinja2, requests) costs every module's start
            from gpulab.routers.http import mask

            raise Failed(mask(f"{self.what}: {exc}", self.task.no_log_values), self._out()) from exc
        return False

    def _out(self) -> dict:
        out = dict(self.result)
        if self.pve:
            c = self.client
            out["requests"] = {"reads": c.reads if c else 0, "writes": c.writes if c else 0}
        return out

    def done(self, **more) -> dict:
        """The task's result, with `more`."""
        self.result.update(more)
        return self._out()

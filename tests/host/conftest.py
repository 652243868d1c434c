"""Shared helpers for the host-stage tests: the host-side modules loaded from plugins/modules, run like Ansible."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULES = ROOT / "plugins" / "modules"
DATA = pathlib.Path(__file__).resolve().parent / "data"


def load_module(name):
    spec = importlib.util.spec_from_file_location(f"host_{name}", MODULES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_module(name, args, *, check_mode=False, diff=False, env=None):
    """Run a module as Ansible runs it on a host (JSON arguments on argv) and return its JSON result."""
    payload = {"ANSIBLE_MODULE_ARGS": {**args, "_ansible_check_mode": check_mode, "_ansible_diff": diff}}
    proc = subprocess.run(
        [sys.executable, str(MODULES / f"{name}.py"), json.dumps(payload)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=False,
        timeout=60,
    )
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"{name} printed no JSON (rc {proc.returncode}): {proc.stdout!r} {proc.stderr!r}")


@pytest.fixture(scope="session")
def cmdline_mod():
    return load_module("gpulab_kernel_cmdline")


@pytest.fixture(scope="session")
def facts_mod():
    return load_module("gpulab_pci_facts")

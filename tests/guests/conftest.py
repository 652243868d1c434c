"""Shared helpers for the guest-stack tests: load the host-side modules straight from plugins/modules."""

import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULES = ROOT / "plugins" / "modules"
FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"


def load_module(name):
    spec = importlib.util.spec_from_file_location(name, MODULES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_ansible_module(name, args, check_mode=False, env=None):
    """Run a module the way Ansible does on a host (JSON args file) and return its JSON result."""
    payload = {"ANSIBLE_MODULE_ARGS": {**args, "_ansible_check_mode": check_mode}}
    proc = subprocess.run(
        [sys.executable, str(MODULES / f"{name}.py"), json.dumps(payload)],
        input="",
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"module {name} printed no JSON: rc={proc.returncode} {proc.stdout!r} {proc.stderr!r}")


@pytest.fixture(scope="session")
def gpu_facts():
    return load_module("gpulab_gpu_facts")

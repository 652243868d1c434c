"""Shared helpers for the k3s/HAMi/workloads tests."""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULES = ROOT / "plugins" / "modules"
SHARED = ROOT.parent / "shared"
CHART_VALUES = SHARED / "reference" / "hami-chart-2.10.0-values.yaml"
CONSTRUCTED = SHARED / "reference" / "samples" / "constructed"


def need_shared(path):
    if not path.exists():
        pytest.skip(f"{path} is not here (shared/ sits beside the project in development and CI)")
    return path


def run_ansible_module(name, args, check_mode=False):
    """Run a module the way Ansible does (JSON arguments) with this interpreter and return its JSON result."""
    payload = {"ANSIBLE_MODULE_ARGS": {**args, "_ansible_check_mode": check_mode}}
    proc = subprocess.run(
        [sys.executable, str(MODULES / f"{name}.py"), json.dumps(payload)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"module {name} printed no JSON: rc={proc.returncode} {proc.stdout!r} {proc.stderr!r}")

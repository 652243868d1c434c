"""Shared helpers for the guest-stack tests: load the host-side modules straight from plugins/modules."""

import importlib.util
import pathlib

import pytest
from ansible_modules import run_json

ROOT = pathlib.Path(__file__).resolve().parents[3]
MODULES = ROOT / "plugins" / "modules"
FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"


def load_module(name):
    spec = importlib.util.spec_from_file_location(name, MODULES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_ansible_module(name, args, check_mode=False, env=None):
    """Run a module the way Ansible does on a host (JSON args) and return its JSON result."""
    return run_json(MODULES / f"{name}.py", args, check_mode=check_mode, env=env)


@pytest.fixture(scope="session")
def gpu_facts():
    return load_module("gpu_facts")

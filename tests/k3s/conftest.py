"""Shared helpers for the k3s/HAMi/workloads tests."""

import json
import pathlib
import subprocess

import pytest
from ansible_modules import command

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
        command(MODULES / f"{name}.py", json.dumps(payload)),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"module {name} printed no JSON: rc={proc.returncode} {proc.stdout!r} {proc.stderr!r}")


@pytest.fixture
def nshosts(tmp_path):
    """Make lab-like hosts (tests/k3s/nshost.py) that share one k3s release folder; all stopped at the end."""
    import os
    import shutil

    if os.geteuid() != 0:
        pytest.skip("needs root (mount namespaces and overlays)")
    missing = [t for t in ("unshare", "nsenter", "curl", "sha256sum") if not shutil.which(t)]
    if missing:
        pytest.skip(f"missing {', '.join(missing)}")
    from .nshost import NsHost, release

    files = release(tmp_path / "k3s-release")
    made = []

    def make(name, **kw):
        host = NsHost(tmp_path, name, files, **kw)
        made.append(host)
        return host

    yield make
    for host in made:
        host.stop()

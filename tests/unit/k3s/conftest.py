"""Shared helpers for the k3s/HAMi/workloads tests."""

import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest
import yaml
from ansible_modules import command

from labsim.net.k3s import common as k3s_common
from labsim.net.mount_ns_host import PATH, MountNsHost, k3s_release

ROOT = pathlib.Path(__file__).resolve().parents[3]
MODULES = ROOT / "plugins" / "modules"
SHARED = ROOT.parent / "shared"
CHART_VALUES = SHARED / "reference" / "hami-chart-2.10.0-values.yaml"
CONSTRUCTED = SHARED / "reference" / "samples" / "constructed"
PLAYBOOK = pathlib.Path(sys.executable).parent / "ansible-playbook"
#: the k3s release the lab's hosts install (the stand-in's default version)
VERSION = k3s_common.DEFAULT_VERSION
#: a host's PATH: the machine's, then this venv's (ansible-playbook)
HOST_PATH = f"{PATH}:{pathlib.Path(sys.executable).parent}"


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


#: a host of a play run on this machine itself (tests that run a playbook against stand-in tools in a bin folder)
LOCAL_HOST = {"ansible_connection": "local", "ansible_host": "127.0.0.1", "ansible_python_interpreter": sys.executable,
              "ansible_become_method": "ansible.builtin.su"}  # fmt: skip


@pytest.fixture
def ports():
    """(open, closed): a port on 127.0.0.1 that a listener answers on for the test, and one nothing listens on."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    yield listener.getsockname()[1], free_port()
    listener.close()


def tool_folder(folder: pathlib.Path, **tools: str) -> pathlib.Path:
    """`folder` created with one executable script per keyword (name -> its text), for a test's PATH."""
    folder.mkdir()
    for name, text in tools.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout=30.0):
    """predicate()'s first true value within `timeout` seconds (polled every 0.2 s), else its last value."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    return predicate()


def recap(result):
    m = re.search(
        r"localhost\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", result.stdout
    )
    assert m, result.stdout[-3000:] + result.stderr[-2000:]
    return {"ok": int(m[1]), "changed": int(m[2]), "failed": int(m[4])}


class RoleHost(MountNsHost):
    """A lab-like host (labsim.net.mount_ns_host) that runs this project's roles inside, with connection local."""

    def __init__(self, base, name, files, **kw):
        tmp = pathlib.Path(base) / name / "tmp"
        env = {
            "PATH": HOST_PATH,
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_LIBRARY": str(ROOT / "plugins" / "modules"),
            "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
            "ANSIBLE_LOCAL_TEMP": str(tmp / "local"),
            "ANSIBLE_REMOTE_TEMP": str(tmp / "remote"),
            "ANSIBLE_HOME": str(tmp / "home"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
        }
        super().__init__(base, name, files, env=env, **kw)

    def play(self, role, role_vars, *args):
        book = [
            {
                "name": "test",
                "hosts": "localhost",
                "connection": "local",
                "gather_facts": False,
                "vars": {"ansible_python_interpreter": sys.executable},
                "roles": [{"role": role, "vars": role_vars}],
            }
        ]
        path = self.base / "tmp" / "play.yml"
        path.write_text(yaml.safe_dump(book, sort_keys=False))
        return self.run(PLAYBOOK, "-i", "localhost,", path, "-v", *args, timeout=600)


@pytest.fixture
def nshosts(tmp_path):
    """Make lab-like hosts (RoleHost) that share one k3s release folder; all stopped at the end."""
    if os.geteuid() != 0:
        pytest.skip("needs root (mount namespaces and overlays)")
    missing = [t for t in ("unshare", "nsenter", "curl", "sha256sum") if not shutil.which(t)]
    if missing:
        pytest.skip(f"missing {', '.join(missing)}")
    files = k3s_release(tmp_path / "k3s-release")
    made = []

    def make(name, **kw):
        host = RoleHost(tmp_path, name, files, **kw)
        made.append(host)
        return host

    yield make
    for host in made:
        host.stop()

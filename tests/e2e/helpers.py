"""End-to-end helpers (imported by the e2e test modules and conftest.py): a real simulated lab per test module, inventory copies with one mistake, playbook runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import ansible_runs
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "inventory" / "demo"
VENV_BIN = Path(sys.executable).parent
GPULAB = str(VENV_BIN / "gpulab")
# The BAD list of tests/labdef names the router `isp-router`; the demo inventory calls it `lab-router`.
HOST_ALIASES = {"isp-router": "lab-router"}


def need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the lab runs hosts in network namespaces with real sshd and dnsmasq")


class RunningLab:
    def __init__(self, state: Path, info: dict[str, Any]) -> None:
        self.state = state
        self.info = info

    @property
    def prefix(self) -> str:
        return self.info["subnet"].split("/")[0].rsplit(".", 1)[0]

    def requests(self) -> list[dict[str, Any]]:
        path = self.state / "pve-requests.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def writes(self, since: int = 0) -> list[dict[str, Any]]:
        """Non-GET requests after the first `since` log lines, except logins."""
        return [
            r
            for r in self.requests()[since:]
            if r.get("method") != "GET"
            and not (r.get("method") == "POST" and str(r.get("path")).endswith("/access/ticket"))
        ]

    def pve_state(self) -> dict[str, Any]:
        return json.loads((self.state / "pve-state.json").read_text())

    def upper_snapshot(self) -> dict[str, tuple[int, int]]:
        """Every file under the lab hosts' own upper dirs with its size and mtime."""
        snap: dict[str, tuple[int, int]] = {}
        for upper in sorted((self.state / "net" / "hosts").glob("*/upper")):
            for path in upper.rglob("*"):
                if path.is_file() and not path.is_symlink():
                    st = path.stat()
                    snap[str(path.relative_to(self.state))] = (st.st_size, st.st_mtime_ns)
        return snap


def lab_up(state: Path, fixture: Path | None = None) -> RunningLab:
    extra = ["--fixture", str(fixture)] if fixture else []
    proc = subprocess.run(
        [GPULAB, "lab", "up", "--state", str(state), *extra],
        capture_output=True,
        text=True,
        timeout=600,  # the first lab on a machine builds the guest image (about a minute)
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return RunningLab(state, json.loads((state / "lab.json").read_text()))


def lab_down(state: Path) -> None:
    subprocess.run(
        [GPULAB, "lab", "down", "--state", str(state)], capture_output=True, timeout=120, check=False
    )


def playbook_env(lab: RunningLab, **extra: str) -> dict[str, str]:
    return ansible_runs.playbook_env(
        GPULAB_LAB_STATE=str(lab.state), ANSIBLE_CALLBACK_RESULT_FORMAT="json", **extra
    )


def run_playbook(
    lab: RunningLab,
    inventory: Path = DEMO,
    *args: str,
    playbook: str = "site.yml",
    timeout: float = 600,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    return ansible_runs.ansible_playbook(
        "-i", inventory, REPO / playbook, *args, env=env or playbook_env(lab), timeout=timeout
    )


def run_local_play(
    path: Path, name: str, tasks: list[dict[str, Any]], env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """A play of `tasks` on localhost (its modules import gpulab from this virtualenv), written to `path` and run."""
    play = [
        {
            "name": name,
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars": {"ansible_python_interpreter": sys.executable},
            "tasks": tasks,
        }
    ]
    path.write_text(yaml.safe_dump(play, sort_keys=False))
    return ansible_runs.ansible_playbook("-i", "localhost,", path, env=env)


def inventory_copy(dest: Path) -> Path:
    shutil.copytree(DEMO, dest)
    return dest


def vars_file(inventory: Path, host: str) -> Path:
    host = HOST_ALIASES.get(host, host)
    if host == "all":
        return inventory / "group_vars" / "all" / "main.yml"
    return inventory / "host_vars" / f"{host}.yml"


def set_vars(inventory: Path, host: str, changes: dict[str, Any], remove: object = KeyError) -> Path:
    """Set (or, for the value `remove`, delete) keys in the YAML file that holds `host`'s variables."""
    path = vars_file(inventory, host)
    data = yaml.safe_load(path.read_text()) if path.exists() else None
    data = data or {}
    for key, value in changes.items():
        if value is remove:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text("---\n" + yaml.safe_dump(data, sort_keys=False))
    return path


def all_vms(lab: RunningLab) -> dict[str, Any]:
    return lab.pve_state().get("vms", {})


def load_bad_cases() -> list[tuple[str, str, dict[str, Any], str]]:
    """tests/labdef/test_validation.py's BAD list (that folder is not a package: load it by path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_labdef_validation_cases", REPO / "tests" / "labdef" / "test_validation.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.BAD)


def api(lab: RunningLab, method: str, path: str, **params: Any) -> Any:
    """One PVE API call with the lab's token (the test's own pokes: stop a VM, create a scratch VM)."""
    import requests
    import urllib3

    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    auth = f"PVEAPIToken={lab.info['token_id']}={lab.info['token_secret']}"
    resp = requests.request(
        method,
        f"{lab.info['pve_url']}/api2/json{path}",
        headers={"Authorization": auth},
        data=params or None,
        verify=False,  # the lab's own self-signed certificate on 127.0.0.1
        timeout=30,
    )
    assert resp.status_code == 200, f"{method} {path}: {resp.status_code} {resp.text}"
    return resp.json()["data"]


def wait_task(lab: RunningLab, upid: str, timeout: float = 60) -> dict[str, Any]:
    import time

    node = lab.info["node"]
    deadline = time.monotonic() + timeout
    while True:
        status = api(lab, "GET", f"/nodes/{node}/tasks/{upid}/status")
        if status.get("status") == "stopped" or time.monotonic() > deadline:
            return status
        time.sleep(0.2)

"""End-to-end helpers (imported by the e2e test modules and conftest.py): a real simulated lab per test module, inventory copies with one mistake, playbook runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ansible_runs
import pytest
import yaml

from gpulab.pve import privileges

if TYPE_CHECKING:
    import requests

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "inventory" / "demo"
VENV_BIN = Path(sys.executable).parent
GPULAB = str(VENV_BIN / "gpulab")
# The BAD list of tests/unit/labdef names the router `isp-router`; the demo inventory calls it `lab-router`.
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


def lab_up(state: Path, fixture: Path | str | None = None) -> RunningLab:
    """`gpulab lab up` on `state` from `fixture`: a file, or the name of one of labsim's fixtures/."""
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


def running_lab(state: Path, fixture: Path | None = None) -> Iterator[RunningLab]:
    """A lab in ``state`` (root only) for a module's fixture to yield, taken down even when a test fails."""
    need_root()
    try:
        yield lab_up(state, fixture)
    finally:
        lab_down(state)


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


VAULT_PASS = "correct horse battery"


def user_inventory(dest: Path) -> Path:
    """inventory/demo copied to `dest` and made like a user's: token id named, its secret from the vault (none
    yet), no fingerprint; the vault's password in `dest`/../vault-pass."""
    inventory_copy(dest)
    main = dest / "group_vars" / "all" / "main.yml"
    text = main.read_text()
    text = re.sub(r"^pve_api_token_id:.*$", "pve_api_token_id: gpulab@pve!ansible", text, flags=re.M)
    text = re.sub(
        r"^pve_api_token_secret:.*$",
        "pve_api_token_secret: \"{{ vault_pve_api_token_secret | default('') }}\"",
        text,
        flags=re.M,
    )
    text = re.sub(r"^pve_api_fingerprint:.*$", '# pve_api_fingerprint: "AA:BB:...:FF"', text, flags=re.M)
    main.write_text(text)
    (dest.parent / "vault-pass").write_text(VAULT_PASS + "\n")
    return dest


def access(lab: RunningLab, inv: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """playbooks/access.yml on a user_inventory, with its vault password."""
    return run_playbook(
        lab,
        inv,
        "--vault-password-file",
        str(inv.parent / "vault-pass"),
        *extra,
        playbook="playbooks/access.yml",
        env=ansible_runs.playbook_env(GPULAB_LAB_STATE=str(lab.state)),  # ansible.cfg's YAML results
        timeout=180,
    )


def vault_values(inv: Path) -> dict[str, Any]:
    """The decrypted vault of a user_inventory (checked to be written encrypted)."""
    vault = inv / "group_vars" / "all" / "vault.yml"
    assert vault.read_text().startswith("$ANSIBLE_VAULT;1.1;AES256"), "the vault is written encrypted"
    plain = subprocess.run(
        [
            str(VENV_BIN / "ansible-vault"),
            "view",
            "--vault-password-file",
            str(inv.parent / "vault-pass"),
            str(vault),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return yaml.safe_load(plain)


def on_node(
    lab: RunningLab, command: str, stdin: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`command` as root on the lab's node over SSH, with the lab's key and known_hosts."""
    return subprocess.run(
        [
            "ssh",
            "-i",
            str(lab.state / "ssh" / "id_ed25519"),
            "-o",
            f"UserKnownHostsFile={lab.info['ssh_known_hosts']}",
            "-o",
            "BatchMode=yes",
            f"root@{lab.info['node_host']['address']}",
            command,
        ],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def token_call(
    lab: RunningLab, secret: str, method: str = "GET", path: str = "", **params: Any
) -> requests.Response:
    """One PVE API call with gpulab's token and `secret` (default: the node's status); the response as is."""
    import requests
    import urllib3

    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    return requests.request(
        method,
        f"{lab.info['pve_url']}/api2/json{path or '/nodes/' + lab.info['node'] + '/status'}",
        headers={"Authorization": f"PVEAPIToken={privileges.TOKEN_ID}={secret}"},
        data=params or None,
        verify=False,  # the lab's own self-signed certificate; tests compare the fingerprint themselves
        timeout=30,
    )


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
    """tests/unit/labdef/test_validation.py's BAD list, loaded by path (no e2e test imports a unit test module)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_labdef_validation_cases", REPO / "tests" / "unit" / "labdef" / "test_validation.py"
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

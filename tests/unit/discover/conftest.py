"""A node for `gpulab discover`'s pure part, without SSH: each command discover runs is answered here.

- `pvesh get PATH --output-format json [--KEY VALUE]` by the PVE API simulator (in-process, API only), logged
  in as root@pam, the way the node's own pvesh answers as root: the data of `GET /api2/json/PATH`, or the
  API's message and exit code 255;
- the sysfs walk (discover.SYSFS_SCRIPT) by the real shell over the lab's /sys tree of the reference node
  (labsim.sysfs_tree, materialised in a temporary folder; GPULAB_SYSFS_ROOT points the script there);
- the probe and `ip -j route` / `ip -j -4 addr` by recorded outputs of a PVE 9 node (vmbr0 192.168.100.5/24,
  default route by 192.168.100.1), which tests may change.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import urllib3
import yaml

from gpulab import discover
from labsim import sysfs_tree
from labsim.fixture import fixtures_dir

urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)

FAST = {"qmcreate": 0.02, "qmconfig": 0.02, "qmstart": 0.02, "qmstop": 0.02, "agent_delay": 0.05}
PROBE = {
    "pvesh": "/usr/bin/pvesh",
    "etc_pve": "1",
    "os": "Debian GNU/Linux 13 (trixie)",
    "hostname": "pve",
    "python3": "/usr/bin/python3",
}
# `ip -j route show table main` and `ip -j -4 addr show` of a PVE 9 node on the reference LAN
ROUTES = [
    {"dst": "default", "gateway": "192.168.100.1", "dev": "vmbr0", "protocol": "kernel", "flags": ["onlink"]},
    {"dst": "192.168.100.0/24", "dev": "vmbr0", "protocol": "kernel", "scope": "link",
     "prefsrc": "192.168.100.5", "flags": []},
]  # fmt: skip
ADDRS = [
    {"ifindex": 1, "ifname": "lo", "flags": ["LOOPBACK", "UP"], "operstate": "UNKNOWN",
     "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8, "scope": "host", "label": "lo"}]},
    {"ifindex": 4, "ifname": "vmbr0", "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"], "operstate": "UP",
     "addr_info": [{"family": "inet", "local": "192.168.100.5", "prefixlen": 24, "scope": "global",
                    "label": "vmbr0"}]},
]  # fmt: skip


class Sim:
    """An in-process PVE API simulator on a fixture, and a root@pam session to it."""

    def __init__(self, state: Path, fixture: Path):
        from labsim.pve_api_server import build

        self.server, self.desc = build(state, str(fixture), 0, api_only=True)
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()
        self.url = self.desc["pve_url"].rstrip("/").removesuffix("/api2/json") + "/api2/json"
        r = requests.post(
            f"{self.url}/access/ticket",
            data={"username": "root@pam", "password": self.desc["password"]},
            verify=False,
            timeout=10,
        )
        r.raise_for_status()
        data = r.json()["data"]
        self.session = requests.Session()
        self.session.verify = False
        self.session.cookies.set("PVEAuthCookie", data["ticket"])
        self.session.headers["CSRFPreventionToken"] = data["CSRFPreventionToken"]

    def request(self, method: str, path: str, **params: Any) -> requests.Response:
        return self.session.request(method, self.url + path, params=params if method == "GET" else None,
                                    data=None if method == "GET" else params, timeout=30, verify=False)  # fmt: skip

    def close(self) -> None:
        self.server.shutdown()
        self.thread.join(5)
        self.server.server_close()
        self.server.lab.close()


@dataclass
class Node:
    """What answers discover's commands (see the module's docstring); `calls` lists them in order."""

    sim: Sim | None
    sysfs_root: Path | None
    probe: dict[str, str] = field(default_factory=lambda: dict(PROBE))
    routes: Any = field(default_factory=lambda: json.loads(json.dumps(ROUTES)))
    addrs: Any = field(default_factory=lambda: json.loads(json.dumps(ADDRS)))
    pvesh_answers: dict[str, Any] = field(default_factory=dict)  # path -> data, instead of the simulator
    calls: list[str] = field(default_factory=list)

    def run(self, command: str) -> tuple[int, str, str]:
        self.calls.append(command)
        if command == discover.PROBE_SCRIPT:
            return 0, "".join(f"{k}={v}\n" for k, v in self.probe.items()), ""
        if command == discover.ROUTE_COMMAND:
            return 0, json.dumps(self.routes), ""
        if command == discover.ADDR_COMMAND:
            return 0, json.dumps(self.addrs), ""
        if command == discover.SYSFS_SCRIPT:
            env = {**os.environ, "GPULAB_SYSFS_ROOT": str(self.sysfs_root or "/nonexistent")}
            p = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env, check=False)
            return p.returncode, p.stdout, p.stderr
        words = shlex.split(command)
        if words[:2] == ["pvesh", "get"] and self.probe.get("pvesh"):
            return self._pvesh(words[2], words[3:])
        return 127, "", f"sh: 1: {words[0]}: not found\n"

    def _pvesh(self, path: str, args: list[str]) -> tuple[int, str, str]:
        assert args[:2] == ["--output-format", "json"], args
        params = dict(zip(args[2::2], args[3::2], strict=True))
        params = {k.removeprefix("--"): v for k, v in params.items()}
        if path in self.pvesh_answers:
            return 0, json.dumps(self.pvesh_answers[path]), ""
        r = self.sim.request("GET", path, **params)
        if r.status_code != 200:
            body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
            return 255, "", (body.get("message") or r.reason) + "\n"
        return 0, json.dumps(r.json()["data"]), ""


def fixture_file(tmp: Path, name: str, **extra: Any) -> Path:
    path = tmp / f"{name}-fast.yml"
    path.write_text(
        yaml.safe_dump({"extends": str(fixtures_dir() / f"{name}.yml"), "timings": FAST, **extra})
    )
    return path


def sysfs(tmp: Path, **options: Any) -> Path:
    """The reference node's /sys (stock state: nouveau on the card, as before gpulab), with options of
    labsim.sysfs_tree.materialise (iommu=False, share_group_with=ADDR)."""
    return sysfs_tree.materialise(tmp / "hw", "stock", **options)


def fixture_sim(tmp_path_factory, name: str):
    """The simulator on labsim fixture `name` with fast timings, for a module's tests; closed after them."""
    tmp = tmp_path_factory.mktemp(name)
    sim = Sim(tmp / "state", fixture_file(tmp, name))
    yield sim
    sim.close()


@pytest.fixture(scope="module")
def homelab_sim(tmp_path_factory):
    yield from fixture_sim(tmp_path_factory, "homelab")


@pytest.fixture(scope="module")
def reference_sim(tmp_path_factory):
    yield from fixture_sim(tmp_path_factory, "reference")

"""Fixtures for the PVE API simulator tests: an in-process lab with short task timings and extra tokens."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests
import urllib3
import yaml

from gpulab.labsim.fixture import reference_fixture_path

urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)

FAST_TIMINGS = {
    "qmcreate": 0.05,
    "qmconfig": 0.03,
    "qmstart": 0.05,
    "qmshutdown": 0.05,
    "qmstop": 0.03,
    "qmdestroy": 0.03,
    "resize": 0.03,
    "download_rate": 2_000_000_000,
    "download_max_s": 0.3,
    "download_progress_s": 0.05,
    "agent_delay": 0.2,
}
PROJECT_TOKEN_PRIVS_WITHOUT_MAPPING_USE = [
    "VM.Allocate",
    "VM.Audit",
    "VM.Config.HWType",
    "VM.Config.CPU",
    "VM.Config.Memory",
    "VM.Config.Options",
    "VM.PowerMgmt",
    "Datastore.AllocateSpace",
    "Datastore.Audit",
]
EXTRA_TOKENS = [
    {"userid": "auditor@pve", "tokenid": "ro", "privs": ["VM.Audit", "Sys.Audit"], "secret": "ro-secret"},
    {
        "userid": "nomap@pve",
        "tokenid": "tk",
        "privs": PROJECT_TOKEN_PRIVS_WITHOUT_MAPPING_USE,
        "secret": "nomap-secret",
    },
    {"userid": "root@pam", "tokenid": "full", "privsep": False, "secret": "root-token-secret"},
]


def write_fast_fixture(path: Path, **overrides: Any) -> Path:
    data = yaml.safe_load(reference_fixture_path().read_text())
    data["timings"] = {**data["timings"], **FAST_TIMINGS, **overrides.pop("timings", {})}
    data["access"] = {"tokens": EXTRA_TOKENS}
    data.update(overrides)
    path.write_text(yaml.safe_dump(data))
    return path


class Api:
    """A tiny PVE API client for tests: raw responses, so status codes and messages can be asserted."""

    def __init__(
        self, url: str, headers: dict[str, str] | None = None, cookies: dict[str, str] | None = None
    ):
        self.base = url + "/api2/json"
        self.session = requests.Session()
        self.session.headers.update(headers or {})
        for k, v in (cookies or {}).items():
            self.session.cookies.set(k, v)

    def request(self, method: str, path: str, **params: Any) -> requests.Response:
        kwargs: dict[str, Any] = {"verify": False, "timeout": 10}
        if method in ("POST", "PUT"):
            kwargs["data"] = params
        else:
            kwargs["params"] = params
        return self.session.request(method, self.base + path, **kwargs)

    def get(self, path: str, **params: Any) -> requests.Response:
        return self.request("GET", path, **params)

    def post(self, path: str, **params: Any) -> requests.Response:
        return self.request("POST", path, **params)

    def put(self, path: str, **params: Any) -> requests.Response:
        return self.request("PUT", path, **params)

    def delete(self, path: str, **params: Any) -> requests.Response:
        return self.request("DELETE", path, **params)

    def data(self, method: str, path: str, **params: Any) -> Any:
        r = self.request(method, path, **params)
        assert r.status_code == 200, f"{method} {path}: {r.status_code} {r.text}"
        return r.json()["data"]

    def wait(self, upid: str, node: str = "pve", timeout: float = 10.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.data("GET", f"/nodes/{node}/tasks/{upid}/status")
            if st["status"] == "stopped":
                return st
            time.sleep(0.02)
        raise AssertionError(f"task {upid} still running after {timeout}s")

    def run(self, method: str, path: str, **params: Any) -> dict:
        """Start an async call and wait for its task; return the final task status."""
        return self.wait(self.data(method, path, **params))


class LabHandle:
    """A running in-process lab: its description and clients for each principal."""

    def __init__(self, server, desc: dict[str, Any], state_dir: Path):
        self.server = server
        self.desc = desc
        self.state_dir = state_dir
        self.url = desc["pve_url"]

    def token_api(self, token_id: str | None = None, secret: str | None = None) -> Api:
        tid = token_id or self.desc["token_id"]
        sec = secret if secret is not None else self.desc["token_secret"]
        return Api(self.url, headers={"Authorization": f"PVEAPIToken={tid}={sec}"})

    def root_api(self) -> Api:
        r = requests.post(
            self.url + "/api2/json/access/ticket",
            data={"username": "root@pam", "password": self.desc["password"]},
            verify=False,
            timeout=10,
        )
        assert r.status_code == 200, r.text
        d = r.json()["data"]
        return Api(
            self.url,
            headers={"CSRFPreventionToken": d["CSRFPreventionToken"]},
            cookies={"PVEAuthCookie": d["ticket"]},
        )

    def requests_log(self) -> list[dict]:
        path = self.state_dir / "pve-requests.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def start_lab(state_dir: Path, fixture_path: Path):
    from gpulab.labsim.server import build

    server, desc = build(state_dir, str(fixture_path), 0, api_only=True)  # never real lab hosts here
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    return server, desc, thread


def stop_lab(server, thread) -> None:
    server.shutdown()
    thread.join(5)
    server.server_close()
    server.lab.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> LabHandle:
    """A fresh lab per test module (modules do not see each other's VMs)."""
    root = tmp_path_factory.mktemp("lab")
    fixture = write_fast_fixture(root / "fixture.yml")
    server, desc, thread = start_lab(root / "state", fixture)
    yield LabHandle(server, desc, root / "state")
    stop_lab(server, thread)


@pytest.fixture(scope="module")
def api(lab) -> Api:
    """The project's API token (gpulab@pve!ansible)."""
    return lab.token_api()


@pytest.fixture(scope="module")
def root(lab) -> Api:
    """root@pam with a password ticket."""
    return lab.root_api()


def create_vm(api: Api, vmid: int, **extra: Any) -> dict:
    params = {
        "vmid": vmid,
        "name": f"vm{vmid}",
        "cores": 2,
        "memory": "2048",
        "scsihw": "virtio-scsi-single",
        "scsi0": "local-zfs:8,iothread=1",
        "net0": "virtio,bridge=vmbr0",
        "agent": "enabled=1",
        **extra,
    }
    st = api.run("POST", "/nodes/pve/qemu", **params)
    assert st["exitstatus"] == "OK", st
    return api.data("GET", f"/nodes/pve/qemu/{vmid}/config")


def pytest_collection_modifyitems(items):
    """The lab's certificate is self-signed: its tests talk to it without verification, on purpose."""
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).parent == here:
            item.add_marker(pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning"))

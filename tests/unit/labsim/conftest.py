"""Fixtures for the PVE API simulator tests: an in-process lab with short task timings and extra tokens."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import requests
import urllib3

from unit.labsim.pve_sim_client import Api, write_fast_fixture

urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)

# pytestmark of the tests on the network lab's real hosts
NETWORK_LAB = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: network namespaces, veth links and mounts"),
]


class InProcessPveSim:
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
    from labsim.pve_api_server import build

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
def lab(tmp_path_factory) -> InProcessPveSim:
    """A fresh lab per test module (modules do not see each other's VMs)."""
    root = tmp_path_factory.mktemp("lab")
    fixture = write_fast_fixture(root / "fixture.yml")
    server, desc, thread = start_lab(root / "state", fixture)
    yield InProcessPveSim(server, desc, root / "state")
    stop_lab(server, thread)


@pytest.fixture(scope="module")
def api(lab) -> Api:
    """The project's API token (gpulab@pve!ansible)."""
    return lab.token_api()


@pytest.fixture(scope="module")
def root(lab) -> Api:
    """root@pam with a password ticket."""
    return lab.root_api()


def pytest_collection_modifyitems(items):
    """The lab's certificate is self-signed: its tests talk to it without verification, on purpose (the tests of
    every labsim folder: tests/unit/labsim and tests/lab/labsim, whose conftest imports this one's)."""
    here = Path(__file__).parent
    for item in items:
        if item.path.parent.name == here.name:
            item.add_marker(pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning"))

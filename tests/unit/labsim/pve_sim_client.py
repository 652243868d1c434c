"""Helpers of the PVE API simulator tests: a fixture with short task timings and extra tokens, a raw client.

A module of its own (the package unit.labsim, so that it does not hide the labsim package it tests), imported
by the tests beside it and by tests/lab/labsim.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import requests
import yaml

from labsim.fixture import reference_fixture_path

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


NOBLE = "https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img"
NOBLE_SHA256 = "d1940f7d69d343355e183dff1e08a59852d32e7309baa7a4bad8365b11b005ac"
# the map entry of the reference node's RTX 3090
UBUNTU_ISO = "https://releases.ubuntu.com/24.04/ubuntu-24.04.3-live-server-amd64.iso"
MAP = "node=pve,path=0000:02:00,id=10de:2204,iommugroup=13,subsystem-id=1462:3881"


def write_fast_fixture(path: Path, **overrides: Any) -> Path:
    data = yaml.safe_load(reference_fixture_path().read_text())
    data["timings"] = {**data["timings"], **FAST_TIMINGS, **overrides.pop("timings", {})}
    data["access"] = {"tokens": EXTRA_TOKENS}
    data.update(overrides)
    path.write_text(yaml.safe_dump(data))
    return path


class Api:
    """A tiny PVE API client for tests: raw responses, so status codes and messages can be asserted. The method
    and path are positional, so that a call may have a parameter named ``path`` (PUT /access/acl)."""

    def __init__(
        self, url: str, headers: dict[str, str] | None = None, cookies: dict[str, str] | None = None
    ):
        self.base = url + "/api2/json"
        self.session = requests.Session()
        self.session.headers.update(headers or {})
        for k, v in (cookies or {}).items():
            self.session.cookies.set(k, v)

    def request(self, method: str, path: str, /, **params: Any) -> requests.Response:
        kwargs: dict[str, Any] = {"verify": False, "timeout": 10}
        if method in ("POST", "PUT"):
            kwargs["data"] = params
        else:
            kwargs["params"] = params
        return self.session.request(method, self.base + path, **kwargs)

    def get(self, path: str, /, **params: Any) -> requests.Response:
        return self.request("GET", path, **params)

    def post(self, path: str, /, **params: Any) -> requests.Response:
        return self.request("POST", path, **params)

    def put(self, path: str, /, **params: Any) -> requests.Response:
        return self.request("PUT", path, **params)

    def delete(self, path: str, /, **params: Any) -> requests.Response:
        return self.request("DELETE", path, **params)

    def data(self, method: str, path: str, /, **params: Any) -> Any:
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

    def run(self, method: str, path: str, /, **params: Any) -> dict:
        """Start an async call and wait for its task; return the final task status."""
        return self.wait(self.data(method, path, **params))


def vm_params(vmid: int, storage: str = "local-zfs", **extra: Any) -> dict:
    """The create parameters of a small VM: 2 vCPU, 2048 MiB, an 8 GB disk on `storage`, a NIC on vmbr0;
    then `extra`."""
    return {
        "vmid": vmid,
        "name": f"vm{vmid}",
        "cores": 2,
        "memory": "2048",
        "scsihw": "virtio-scsi-single",
        "scsi0": f"{storage}:8,iothread=1",
        "net0": "virtio,bridge=vmbr0",
        **extra,
    }


def create_vm(api: Api, vmid: int, **extra: Any) -> dict:
    """A small VM (vm_params) with the guest agent on node pve; its config once the create task is OK."""
    st = api.run("POST", "/nodes/pve/qemu", **vm_params(vmid, **{"agent": "enabled=1", **extra}))
    assert st["exitstatus"] == "OK", st
    return api.data("GET", f"/nodes/pve/qemu/{vmid}/config")


def download(api: Api, **params: Any) -> str:
    """Start a download-url of the cloud image to storage local (``params`` change any); its UPID."""
    base = {"content": "import", "filename": "noble-server-cloudimg-amd64.qcow2", "url": NOBLE}
    return api.data("POST", "/nodes/pve/storage/local/download-url", **{**base, **params})


def download_iso(api: Api, filename: str = "u.iso") -> dict:
    """The Ubuntu server ISO downloaded to storage local as `filename`; the finished task's status."""
    return api.wait(download(api, content="iso", filename=filename, url=UBUNTU_ISO))


def task_log(api: Api, upid: str, node: str = "pve") -> list[str]:
    """A task's whole log, its lines' text."""
    return [line["t"] for line in api.data("GET", f"/nodes/{node}/tasks/{upid}/log", limit=0)]


def token_api(desc: dict) -> Api:
    """A client with the token of a lab's description (the line `lab up` prints)."""
    return Api(
        desc["pve_url"], headers={"Authorization": f"PVEAPIToken={desc['token_id']}={desc['token_secret']}"}
    )


def create_booting_vm(api: Api, vmid: int, name: str, **extra: Any) -> dict:
    """Create on node pve a VM that the network lab boots a host for: the guest agent on, a 4 GB disk, a NIC
    on vmbr0 with a fixed MAC, DHCP and user ubuntu through cloud-init; then `extra`. The create task's final
    status."""
    return api.run(
        "POST",
        "/nodes/pve/qemu",
        vmid=vmid,
        name=name,
        agent="1",
        scsi0="local-zfs:4",
        net0="virtio=BC:24:11:00:01:00,bridge=vmbr0",
        ipconfig0="ip=dhcp",
        ciuser="ubuntu",
        ide2="local-zfs:cloudinit",
        **extra,
    )

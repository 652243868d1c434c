"""A strict simulated PVE API per test (labsim), and a runner for the modules."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml
from ansible_modules import command

ROOT = pathlib.Path(__file__).resolve().parents[3]
MODULES = ROOT / "plugins" / "modules"
GPU_SHA256 = "d1940f7d69d343355e183dff1e08a59852d32e7309baa7a4bad8365b11b005ac"
IMAGE_URL = "https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img"
FAST = {
    "qmcreate": 0.05,
    "qmconfig": 0.02,
    "qmstart": 0.05,
    "qmshutdown": 0.05,
    "qmstop": 0.02,
    "qmdestroy": 0.02,
    "resize": 0.02,
    "download_max_s": 0.4,
    "download_progress_s": 0.1,
    "agent_delay": 0.1,
}
# A token of a user who may look but not create VMs (for the 403 tests).
AUDITOR = {
    "userid": "auditor@pve",
    "tokenid": "ro",
    "secret": "0b7f2c1e-1111-4222-8333-944455556666",
    "privs": ["VM.Audit", "Sys.Audit", "Datastore.Audit", "Mapping.Audit"],
}


class PveSimProcess:
    def __init__(self, state: pathlib.Path, desc: dict, proc: subprocess.Popen):
        self.state = state
        self.desc = desc
        self.proc = proc
        self.log = state / "pve-requests.jsonl"

    def conn(self, **over) -> dict:
        args = {
            "api_url": self.desc["pve_url"],
            "api_token_id": self.desc["token_id"],
            "api_token_secret": self.desc["token_secret"],
            "api_fingerprint": self.desc["fingerprint"],
            "api_retries": 2,
        }
        args.update(over)
        return {k: v for k, v in args.items() if v is not None}

    def root_conn(self) -> dict:
        return self.conn(
            api_token_id=None, api_token_secret=None, api_user="root@pam", api_password=self.desc["password"]
        )

    def mark(self) -> int:
        return len(self.requests())

    def requests(self, since: int = 0) -> list[dict]:
        if not self.log.exists():
            return []
        lines = self.log.read_text().splitlines()
        return [json.loads(x) for x in lines[since:] if x.strip()]

    def writes(self, since: int = 0) -> list[dict]:
        return [r for r in self.requests(since) if r["method"] != "GET"]

    def rejected(self, since: int = 0) -> list[dict]:
        """Requests the simulator refused as malformed (schema: 400, or 501 for what it does not serve)."""
        return [r for r in self.requests(since) if r["status"] in (400, 501)]

    def client(self, **over):
        from gpulab.pve import connection

        return connection.connect(self.conn(**over))

    def inject(self, **faults):
        from labsim import pve_faults as f

        f.inject(self.state, **faults)


def start_lab(tmp: pathlib.Path, timings: dict | None = None, fixture: dict | None = None) -> PveSimProcess:
    """The simulator on the reference machine, or on `fixture` (a whole fixture, e.g. `cluster_fixture()`),
    with fast timings and the auditor's token."""
    from labsim.fixture import reference_fixture_path

    if fixture is None:
        fixture = yaml.safe_load(pathlib.Path(reference_fixture_path()).read_text())
    fixture["timings"] = {**(fixture.get("timings") or {}), **FAST, **(timings or {})}
    fixture.setdefault("access", {}).setdefault("tokens", []).append(AUDITOR)
    state = tmp / "lab"
    state.mkdir()
    fx = tmp / "fixture.yml"
    fx.write_text(yaml.safe_dump(fixture))
    env = dict(os.environ, GPULAB_LAB_API_ONLY="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "labsim.pve_api_server", "--state", str(state), "--fixture", str(fx)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        pytest.fail(f"the PVE simulator did not start; see {state / 'server.log'}")
    return PveSimProcess(state, json.loads(line), proc)


def cluster_fixture() -> dict:
    """fixtures/cluster.yml as one file: nodes pve (RTX 3090) and pve2 (RTX 4090 at 0000:01:00)."""
    from labsim.fixture import load_fixture

    data = load_fixture("cluster")
    data.pop("_path")
    return data


def stop_lab(lab: PveSimProcess) -> None:
    lab.proc.terminate()
    try:
        lab.proc.wait(5)
    except subprocess.TimeoutExpired:
        lab.proc.kill()


@contextlib.contextmanager
def playbook_lab(tmp: pathlib.Path, fixture: dict | None = None, key_comment: str = "test@lab"):
    """start_lab for playbooks on inventory/demo (or a copy), with what that inventory reads from the lab's
    state: lab.json, and the lab's public key for cloud-init (the network lab makes a real one; this one
    ends in `key_comment`)."""
    lab = start_lab(tmp, fixture=fixture)
    try:
        (lab.state / "lab.json").write_text(json.dumps(lab.desc))
        (lab.state / "ssh").mkdir()
        (lab.state / "ssh" / "id_ed25519.pub").write_text(
            f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITestKeyOnly {key_comment}\n"
        )
        yield lab
    finally:
        stop_lab(lab)


def wipe_vms(lab: PveSimProcess) -> None:
    """Stop and destroy every VM, so that the next test starts from an empty node."""
    client = lab.client()
    for vm in client.get("cluster/resources", type="vm"):
        base = f"nodes/{vm['node']}/qemu/{vm['vmid']}"
        if vm.get("status") == "running":
            client.wait_task(vm["node"], client.post(f"{base}/status/stop"), 30)
        client.wait_task(vm["node"], client.delete(base, purge=1), 30)


@pytest.fixture(scope="module")
def shared_lab(tmp_path_factory):
    lab = start_lab(tmp_path_factory.mktemp("pve"))
    yield lab
    stop_lab(lab)


@pytest.fixture
def lab(shared_lab):
    """The module's simulated PVE (reference machine, fast timings) with no VM and no fault; after the
    test, every request it sent must have passed the simulator's schema validation (no 400/501)."""
    from labsim import pve_faults

    mark = shared_lab.mark()
    yield shared_lab
    pve_faults.clear(shared_lab.state)
    rejected = shared_lab.rejected(mark)
    wipe_vms(shared_lab)
    assert rejected == [], f"the simulator refused requests as malformed: {rejected}"


@pytest.fixture
def own_lab(tmp_path):
    """A simulated PVE of the test's own (for changed timings)."""
    labs = []

    def make(**timings) -> PveSimProcess:
        labs.append(start_lab(tmp_path, timings))
        return labs[-1]

    yield make
    for lab in labs:
        assert lab.rejected() == [], lab.rejected()
        stop_lab(lab)


_LOADED: dict = {}


def _load_module(name: str):
    if name not in _LOADED:
        spec = importlib.util.spec_from_file_location(f"pve_test_{name}", MODULES / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _LOADED[name] = mod
    return _LOADED[name]


def run_module(
    name: str, args: dict, check: bool = False, diff: bool = False, subprocess_run: bool = False
) -> dict:
    """Run a module with JSON arguments, as Ansible does, and return its JSON result.

    In this process by default (fast: the module's main() with Ansible's argument buffer set, its JSON
    output captured); in a fresh interpreter with `subprocess_run=True`.
    """
    payload = json.dumps(
        {"ANSIBLE_MODULE_ARGS": {**args, "_ansible_check_mode": check, "_ansible_diff": diff}}
    )
    if subprocess_run:
        proc = subprocess.run(
            command(MODULES / f"{name}.py", payload),
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        out = proc.stdout
    else:
        from ansible.module_utils import basic

        mod = _load_module(name)
        buf = io.StringIO()
        saved = basic._ANSIBLE_ARGS, basic._ANSIBLE_PROFILE
        basic._ANSIBLE_ARGS, basic._ANSIBLE_PROFILE = payload.encode(), "legacy"
        try:
            with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
                mod.main()
        finally:
            basic._ANSIBLE_ARGS, basic._ANSIBLE_PROFILE = saved
        out = buf.getvalue()
    try:
        return json.loads(out)
    except json.JSONDecodeError:
        pytest.fail(f"module {name} printed no JSON: {out!r}")


def gpu_vm_args(lab: PveSimProcess, **over) -> dict:
    """The reference lab's vm-gpu as module arguments (cloud image, GPU through its mapping)."""
    args = lab.conn(
        node="pve",
        vmid=102,
        name="vm-gpu",
        machine="q35",
        bios="ovmf",
        efidisk={"storage": "local-zfs", "pre_enrolled_keys": False},
        cpu="host",
        cores=8,
        memory=16384,
        balloon=0,
        scsihw="virtio-scsi-single",
        disks=[
            {
                "slot": "scsi0",
                "storage": "local-zfs",
                "size_gb": 200,
                "import_from": "local:import/noble-server-cloudimg-amd64.qcow2",
                "iothread": True,
            }
        ],
        nets=[{"bridge": "vmbr0"}],
        hostpci=[{"mapping": "rtx3090", "pcie": True}],
        agent=True,
        onboot=False,
        serial_console=True,
        boot_order=["scsi0"],
    )
    args.update(over)
    return args


def small_vm_args(lab: PveSimProcess, vmid: int = 100, name: str = "vm-1", **over) -> dict:
    args = lab.conn(
        node="pve",
        vmid=vmid,
        name=name,
        machine="i440fx",
        bios="seabios",
        cores=4,
        memory=4096,
        scsihw="virtio-scsi-single",
        disks=[{"slot": "scsi0", "storage": "local-zfs", "size_gb": 60, "iothread": True}],
        nets=[{"bridge": "vmbr0"}],
        agent=True,
        boot_order=["scsi0"],
    )
    args.update(over)
    return args


def image_args(lab: PveSimProcess, **over) -> dict:
    """pve_download's arguments for the cloud image the GPU VM imports; `over` changes any."""
    args = lab.conn(
        node="pve",
        storage="local",
        content="import",
        url=IMAGE_URL,
        filename="noble-server-cloudimg-amd64.qcow2",
        checksum=GPU_SHA256,
    )
    args.update(over)
    return args


def gpu_map(**over) -> list[dict]:
    """pve_pci_mapping's entries for the lab's GPU; `over` changes any field of the one entry."""
    entry = {
        "node": "pve",
        "path": "0000:02:00",
        "id": "10de:2204",
        "iommugroup": 13,
        "subsystem_id": "1462:3881",
    }
    entry.update(over)
    return [entry]


def download_iso(lab: PveSimProcess) -> str:
    """The Ubuntu live-server ISO on storage local, as the lab serves it (its URL and checksum): its volume."""
    iso = run_module(
        "pve_download",
        lab.conn(
            node="pve",
            storage="local",
            url="https://releases.ubuntu.com/24.04/ubuntu-24.04.3-live-server-amd64.iso",
            filename="ubuntu-24.04.3-live-server-amd64.iso",
            checksum="e93681f3cab37e29bdf53bf2231ffc4de4bcc9d90ad8dc5bb62d18a2355052a0",
        ),
    )
    assert not iso.get("failed"), iso
    return iso["volid"]


def prepare_gpu_lab(lab: PveSimProcess) -> None:
    """The image and the GPU's mapping, as the role's first steps leave them (idempotent)."""
    image = run_module("pve_download", image_args(lab))
    assert not image.get("failed"), image
    mapping = run_module("pve_pci_mapping", lab.conn(id="rtx3090", entries=gpu_map()))
    assert not mapping.get("failed"), mapping

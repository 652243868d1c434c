"""Preflight reaches the PVE API (gpulab.reach) before any stage changes anything."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpulab import reach

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def inventory(conn: dict) -> dict:
    """The inventory's pve_api_* variables for these module options."""
    return {f"pve_{k}": v for k, v in conn.items() if k not in ("api_retries",)}


@pytest.mark.parametrize(
    ("run", "skip", "expected"),
    [
        (None, None, {"host", "vms", "network", "guests", "k3s", "hami", "verify"}),
        (["all"], ["host"], {"vms", "network", "guests", "k3s", "hami", "verify"}),
        (["host"], None, {"host"}),
        (["guests", "k3s", "preflight"], [], {"guests", "k3s"}),
        (["workloads"], None, {"workloads"}),
        (["hami", "hami-proof"], None, {"hami", "hami-proof"}),
    ],
)
def test_selected_stages_follow_tags(run, skip, expected):
    assert reach.selected_stages(run, skip) == expected


def test_reached_with_the_inventorys_settings_is_one_read(lab):
    mark = lab.mark()
    what, problem = reach.reach_pve(inventory(lab.conn()))
    assert problem is None
    assert what == f"Proxmox VE API at {lab.desc['pve_url']}: version 9.2.11"
    assert [(r["method"], r["path"]) for r in lab.requests(mark)] == [("GET", "/api2/json/version")]


def test_a_wrong_secret_names_the_token_and_the_fix(lab):
    what, problem = reach.reach_pve(inventory(lab.conn(api_token_secret="0" * 36)))
    assert what is None
    text = str(problem)
    assert text.startswith(f"all: pve_api_token_id={lab.desc['token_id']!r}: the Proxmox VE API at ")
    assert "refused these credentials" in text and "Fix: correct the token ID and secret" in text
    assert "0" * 36 not in text


def test_a_wrong_fingerprint_is_a_tls_problem(lab):
    _, problem = reach.reach_pve(inventory(lab.conn(api_fingerprint=":".join(["AB"] * 32))))
    assert problem.field == "pve_api_url"
    assert "TLS verification failed" in problem.why and "pve_api_fingerprint" in problem.fix


def test_nothing_listening_names_the_url_quickly():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"https://127.0.0.1:{port}"
    _, problem = reach.reach_pve(
        {"pve_api_url": url, "pve_api_token_id": "gpulab@pve!lab", "pve_api_token_secret": "x"}
    )
    assert (problem.field, problem.value) == ("pve_api_url", url)
    assert "did not answer" in problem.why and "no answer after 2 attempts" in problem.why


def _preflight(lab, secret: str, tags: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """playbooks/preflight.yml on inventory/homelab, its API settings pointed at the simulator."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAB_")}
    env.update(
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        GPULAB_PVE_API_TOKEN_SECRET=secret,
        GPULAB_ROUTER_PASSWORD="pw-for-test",
        PATH=f"{BIN}:{env['PATH']}",
    )
    extra = {
        "pve_api_url": lab.desc["pve_url"],
        "pve_api_token_id": lab.desc["token_id"],
        "pve_api_fingerprint": lab.desc["fingerprint"],
        "vault_vm_become_password": "sudo-pw",  # the ISO guests' sudo password, as the vault gives it
        "pve_vms_vfio_proof": False,  # the API-only lab has no node to read the GPU's driver on
    }
    mark = lab.mark()
    proc = subprocess.run(
        [
            BIN / "ansible-playbook",
            "-i",
            "inventory/homelab",
            "playbooks/preflight.yml",
            "--tags",
            tags,
            "-e",
            json.dumps(extra),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc, lab.requests(mark)


def test_preflight_play_reaches_the_api_for_stage_vms(lab):
    proc, sent = _preflight(lab, lab.desc["token_secret"], "vms")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"Proxmox VE API at {lab.desc['pve_url']}: version 9.2.11" in proc.stdout
    # /version, then one read of the guests that exist (what stage vms would refuse half way)
    assert [(r["method"], r["path"]) for r in sent] == [
        ("GET", "/api2/json/version"),
        ("GET", "/api2/json/cluster/resources"),
    ]


def test_preflight_play_stops_on_a_refused_token_before_anything_else(lab):
    wrong = "11111111-2222-3333-4444-555555555555"
    proc, sent = _preflight(lab, wrong, "vms")
    assert proc.returncode == 2
    assert "an API it needs is not; nothing was changed" in proc.stdout + proc.stderr
    assert "refused these credentials" in proc.stdout + proc.stderr
    assert wrong not in proc.stdout + proc.stderr and lab.desc["token_secret"] not in proc.stdout
    assert [(r["method"], r["path"], r["status"]) for r in sent] == [("GET", "/api2/json/version", 401)]


def test_preflight_play_leaves_the_api_alone_for_stages_over_ssh(lab):
    proc, sent = _preflight(lab, "11111111-2222-3333-4444-555555555555", "host,guests")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sent == []


def test_what_stage_vms_would_refuse_half_way_is_found_before_any_write(lab):
    from .conftest import run_module, small_vm_args

    assert not run_module("gpulab_pve_vm", small_vm_args(lab, vmid=100, name="vm-1")).get("failed")  # 60 GB
    assert not run_module("gpulab_pve_vm", small_vm_args(lab, vmid=101, name="db")).get("failed")
    vms = {
        "vm-1": {"vm_id": 100, "vm_name": "vm-1", "vm_node": "pve", "vm_disk_gb": 40},
        "vm-2": {"vm_id": 101, "vm_name": "vm-2", "vm_node": "pve", "vm_disk_gb": 60},
        "vm-gpu": {"vm_id": 102, "vm_name": "vm-gpu", "vm_node": "pve", "vm_disk_gb": 200},  # not there yet
    }
    mark = lab.mark()
    problems = [str(p) for p in reach.existing_vm_problems(inventory(lab.conn()), vms)]
    assert problems == [
        "vm-1: vm_disk_gb=40: VM 100 (vm-1) has a 60 GB disk now, and PVE cannot shrink a disk. "
        "Fix: set vm_disk_gb: 60 (or more, to grow it).",
        "vm-2: vm_id=101: VM 101 on node pve is the qemu guest named 'db', not 'vm-2'; gpulab never takes "
        "over another guest. Fix: pick a free vm_id, or set vm_name to the name it has if it is this VM.",
    ]
    assert [(r["method"], r["path"]) for r in lab.requests(mark)] == [("GET", "/api2/json/cluster/resources")]
    vms["vm-1"]["vm_disk_gb"] = 60
    del vms["vm-2"]
    assert reach.existing_vm_problems(inventory(lab.conn()), vms) == []

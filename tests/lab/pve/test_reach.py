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

ROOT = Path(__file__).resolve().parents[3]
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
        "gpulab_download_check": False,  # no internet here; tests/unit/test_downloads.py proves the check
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
    # /version, one read of the guests that exist (what stage vms would refuse half way), then the node's
    # storages and the content of the one its ISO goes on (is the file there already?)
    assert [(r["method"], r["path"]) for r in sent] == [
        ("GET", "/api2/json/version"),
        ("GET", "/api2/json/cluster/resources"),
        ("GET", "/api2/json/nodes/pve/storage"),
        ("GET", "/api2/json/nodes/pve/storage/local/content"),
    ]


def test_preflight_play_stops_on_a_refused_token_before_anything_else(lab):
    wrong = "11111111-2222-3333-4444-555555555555"
    proc, sent = _preflight(lab, wrong, "vms")
    assert proc.returncode == 2
    assert "an API it needs is not; nothing was changed" in proc.stdout + proc.stderr
    assert "refused these credentials" in proc.stdout + proc.stderr
    assert wrong not in proc.stdout + proc.stderr and lab.desc["token_secret"] not in proc.stdout
    assert [(r["method"], r["path"], r["status"]) for r in sent] == [("GET", "/api2/json/version", 401)]


def test_preflight_play_leaves_the_api_alone_for_stage_host(lab):
    proc, sent = _preflight(lab, "11111111-2222-3333-4444-555555555555", "host")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sent == []


def test_preflight_play_reads_only_the_vm_list_for_stages_over_ssh(lab):
    """Stages that log in to the VMs without stage vms read PVE's VM list once (a VM missing or stopped stops
    the run there); an API that refuses the read does not stop a run that needs no API."""
    proc, sent = _preflight(lab, "11111111-2222-3333-4444-555555555555", "host,guests")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [(r["method"], r["path"], r["status"]) for r in sent] == [
        ("GET", "/api2/json/cluster/resources", 401)
    ]


def test_what_stage_vms_would_refuse_half_way_is_found_before_any_write(lab):
    from unit.pve.conftest import run_module, small_vm_args

    assert not run_module("pve_vm", small_vm_args(lab, vmid=100, name="vm-1")).get("failed")  # 60 GB
    assert not run_module("pve_vm", small_vm_args(lab, vmid=101, name="db")).get("failed")
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


def _cluster_definition():
    from gpulab import inventory as inv
    from gpulab import labdef

    groups, hostvar, names = inv.load(ROOT / "inventory" / "demo-cluster")
    # without a lab its secrets are missing, not its VMs
    definition, _ = labdef.check(groups, hostvar, names)
    assert definition is not None
    return groups, definition


@pytest.mark.parametrize(
    ("stages", "limited", "expected"),
    [
        # stage vms in the run: it creates, starts and sets aside the VMs itself
        ({"vms", "k3s"}, None, []),
        ({"host"}, None, []),
        ({"k3s"}, None, ["server-1", "server-2", "server-3", "agent-1", "gpu-3090", "gpu-4090"]),
        ({"guests"}, ["server-1", "gpu-3090", "pve"], ["server-1", "gpu-3090"]),  # --limit applied
    ],
)
def test_login_hosts_are_the_vms_of_the_stages_that_log_in(stages, limited, expected):
    groups, _ = _cluster_definition()
    assert reach.login_hosts(stages, groups, limited or groups["vms"]) == expected


def test_a_missing_or_stopped_vm_is_named_with_why_and_what_brings_it_up():
    """PVE's VM list against the VMs a run without stage vms logs in to: a VM not there yet, a stopped GPU VM
    (held back for its node's reboot) and a stopped plain VM are named; a stopped k3s server is not (the run
    names it down and goes on without it)."""
    _, d = _cluster_definition()
    resources = [
        {"vmid": 100, "name": "server-1", "node": "pve", "status": "running"},
        {"vmid": 101, "name": "server-2", "node": "pve", "status": "stopped"},
        {"vmid": 103, "name": "agent-1", "node": "pve2", "status": "stopped"},
        {"vmid": 104, "name": "gpu-3090", "node": "pve", "status": "stopped"},
        {"vmid": 105, "name": "gpu-4090", "node": "pve2", "status": "running"},
    ]
    hosts = ["server-1", "server-2", "server-3", "agent-1", "gpu-3090", "gpu-4090"]
    found = reach.absent_vm_problems(d, hosts, resources, {"k3s"})
    assert [(p.host, p.field, p.value) for p in found] == [
        ("server-3", "vm_id", 102),
        ("agent-1", "vm_id", 103),
        ("gpu-3090", "vm_id", 104),
    ]
    missing, plain, gpu = found
    assert str(missing) == (
        "server-3: vm_id=102: server-3 (VM 102 on node pve2) does not exist yet, and this run's stages (k3s) log "
        "in to it. Fix: run site.yml without --tags (or add vms to --tags): stage vms creates and starts it."
    )
    assert plain.why.startswith("agent-1 (VM 103 on node pve2) is stopped") and "qm start 103" in plain.fix
    # pve may reboot (demo-cluster): the run without --tags does it
    assert (
        "It has GPU rtx3090: stage vms starts a GPU VM only once its node has handed the card to vfio-pci"
        in (gpu.why)
    )
    assert gpu.why.endswith("(stage host reboots pve: pve_host_reboot_allowed is true there)")
    assert gpu.fix == (
        "run site.yml without --tags: stage host reboots pve if it still waits for that, and stage vms starts "
        "gpu-3090"
    )
    # the reboot not allowed: the fix says to allow it (or reboot by hand)
    d.node_reboot_allowed["pve"] = False
    [gpu] = reach.absent_vm_problems(d, ["gpu-3090"], resources, {"k3s", "hami"})
    assert "(pve_host_reboot_allowed is false for pve, so stage host leaves that reboot to you)" in gpu.why
    assert gpu.fix.startswith("allow the reboot (pve_host_reboot_allowed: true for pve")
    assert gpu.fix.endswith("or reboot pve yourself and run site.yml --tags vms,hami,k3s")
    # every VM running: nothing to say
    running = [dict(r, status="running") for r in resources] + [{"vmid": 102, "status": "running"}]
    assert reach.absent_vm_problems(d, hosts, running, {"k3s"}) == []

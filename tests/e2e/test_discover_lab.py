"""`gpulab discover` over real SSH against the simulated lab's node, whose pvesh answers from the API
simulator's state (as root@pam) and whose /sys is the reference node's: the demo lab (a bare node) and the
homelab lab (three VMs made by hand, `--fixture homelab`).

The written inventory is compared with inventory/homelab-lab's values (node facts, GPU functions, IOMMU group,
boot_vga, VMs), filled in as a user would and checked with `gpulab plan`; the node is only read. Host key
checking is on: the lab's node is unknown to an empty known_hosts until its key is added.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from unit.discover.filling import fill, placeholders

from .helpers import GPULAB, REPO, RunningLab, lab_down, lab_up, need_root

pytestmark = [pytest.mark.root, pytest.mark.slow]
HOMELAB_LAB = REPO / "inventory" / "homelab-lab"


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def discover(
    lab: RunningLab, inventory: Path, known_hosts: Path, address: str | None = None
) -> subprocess.CompletedProcess[str]:
    address = address or lab.info["node_host"]["address"]
    return subprocess.run(
        [GPULAB, "discover", "-i", lab.info["ssh_private_key"], "--known-hosts", str(known_hosts),
         f"root@{address}", str(inventory)],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "HOME": str(known_hosts.parent)},  # no ~/.ssh/known_hosts of this machine's
    )  # fmt: skip


def trust_node(lab: RunningLab, known_hosts: Path, address: str | None = None) -> None:
    """What the user does after comparing the fingerprint: add the host's key."""
    scan = subprocess.run(
        ["ssh-keyscan", "-t", "ed25519", address or lab.info["node_host"]["address"]],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert scan.stdout.strip(), scan.stderr
    with known_hosts.open("a") as f:
        f.write(scan.stdout)


def plan(inventory: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "GPULAB_PVE_API_TOKEN_SECRET": "0e4c6a5d-7b1f-4a53-9d2e-5f8a1c3b7e90",
        "GPULAB_ROUTER_PASSWORD": "router-admin-secret",
    }
    return subprocess.run(
        [GPULAB, "plan", str(inventory)], capture_output=True, text=True, env=env, check=False
    )


def router_fill(lab: RunningLab) -> dict[str, str]:
    return {
        "router_address": lab.info["router"]["address"],
        "router_kind": "dnsmasq",
        "router_user": "root",
        "start": f"{lab.prefix}.2",
        "end": f"{lab.prefix}.253",
    }


def check_node_facts(lab: RunningLab, inventory: Path) -> None:
    mine, theirs = load(inventory / "host_vars" / "pve.yml"), load(HOMELAB_LAB / "host_vars" / "pve.yml")
    for key in ("pve_node", "pve_memory_mib", "pve_threads", "ansible_user", "ansible_python_interpreter"):
        assert mine[key] == theirs[key], key
    assert mine["pve_gpus"] == theirs["pve_gpus"]  # functions, vendor:device, IOMMU group 13, boot_vga
    assert mine["ansible_host"] == lab.info["node_host"]["address"]
    assert set(mine["pve_storages"]) == set(theirs["pve_storages"])
    assert mine["pve_storages"]["local-zfs"]["content"] == theirs["pve_storages"]["local-zfs"]["content"]
    router = load(inventory / "host_vars" / "lan-router.yml")
    assert router["router_subnet"] == lab.info["subnet"]
    # the lab's hosts have no default route (nothing leaves the lab), so the router's address is the user's
    # to give; on a node with one it is the default gateway (tests/unit/discover)
    assert router["router_address"] == "CHANGE-ME" and router["ansible_host"] == "{{ router_address }}"
    main = load(inventory / "group_vars" / "all" / "main.yml")
    assert main["pve_api_url"] == f"https://{lab.info['node_host']['address']}:8006"
    assert main["pve_api_fingerprint"] == lab.info["fingerprint"]


def test_discover_on_the_homelab_lab_writes_what_inventory_homelab_lab_says(tmp_path):
    need_root()
    state = tmp_path / "lab"
    try:
        lab = lab_up(state, Path("homelab"))
        known_hosts = tmp_path / "known_hosts"
        known_hosts.write_text("")
        inventory = tmp_path / "mylab"
        before = len(lab.requests())

        refused = discover(lab, inventory, known_hosts)
        assert refused.returncode == 1 and not inventory.exists(), refused.stdout + refused.stderr
        assert "is not in known_hosts, so gpulab does not trust it" in refused.stderr
        assert "ssh-keyscan" in refused.stderr

        trust_node(lab, known_hosts)
        proc = discover(lab, inventory, known_hosts)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "VMs: vm-1 (100), vm-2 (101), vm-gpu (102)" in proc.stdout
        check_node_facts(lab, inventory)
        for host in ("vm-1", "vm-2", "vm-gpu"):
            mine = {
                **load(inventory / "group_vars" / "vms.yml"),
                **load(inventory / "host_vars" / f"{host}.yml"),
            }
            theirs = {
                **load(HOMELAB_LAB / "group_vars" / "vms.yml"),
                **load(HOMELAB_LAB / "host_vars" / f"{host}.yml"),
            }
            same = {k for k in theirs if k.startswith("vm_")} - {"vm_address", "vm_ssh_user"}
            assert {k: mine.get(k) for k in same} == {k: theirs[k] for k in same}, host
        # discover read pvesh on the node (the API's request log has its GETs) and wrote nothing
        reads = lab.requests()[before:]
        assert any(str(r.get("path")).endswith("/nodes/pve/hardware/pci") for r in reads), reads[-5:]
        logins = [
            r for r in reads if str(r.get("path")).endswith("/access/ticket") and r.get("method") == "POST"
        ]
        assert [r for r in reads if r.get("method") != "GET" and r not in logins] == []

        refused = plan(inventory)
        assert refused.returncode == 1 and "vm-gpu: vm_address='CHANGE-ME': a placeholder" in refused.stdout
        leases = lab.info["seed_leases"]
        fill(inventory, {h: leases[h] for h in ("vm-1", "vm-2", "vm-gpu")}, router_fill(lab), ssh_user="ubuntu",
             server="vm-1", agents=("vm-2", "vm-gpu"))  # fmt: skip
        passed = plan(inventory)
        assert passed.returncode == 0, passed.stdout + passed.stderr
        # the router host is a Debian machine without Proxmox VE: refused with what was found, nothing written
        router = lab.info["router"]["address"]
        trust_node(lab, known_hosts, router)
        other = discover(lab, tmp_path / "router-lab", known_hosts, router)
        assert other.returncode == 1 and not (tmp_path / "router-lab").exists(), other.stdout + other.stderr
        assert (
            f"root@{router} is not a Proxmox VE node (pvesh: not found on its PATH; /etc/pve: absent"
            in other.stderr
        )
        again = discover(lab, inventory, known_hosts)  # never over an existing folder
        assert again.returncode == 1 and "never overwrites" in again.stderr
        assert placeholders(inventory) == {}
    finally:
        lab_down(state)


def test_discover_on_the_demo_lab_proposes_the_three_vms(tmp_path):
    need_root()
    state = tmp_path / "lab"
    try:
        lab = lab_up(state)
        known_hosts = tmp_path / "known_hosts"
        trust_node(lab, known_hosts)
        inventory = tmp_path / "mylab"
        proc = discover(lab, inventory, known_hosts)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "VMs (proposed: the node has none): vm-1 (100), vm-2 (101), vm-gpu (102)" in proc.stdout
        check_node_facts(lab, inventory)
        vms = load(inventory / "group_vars" / "vms.yml")
        key = Path(lab.info["ssh_private_key"] + ".pub").read_text().strip()
        assert vms["vm_ssh_public_key"] == key and vms["vm_os_install"] == "cloud_image"
        demo = REPO / "inventory" / "demo" / "host_vars"
        for host in ("vm-1", "vm-2", "vm-gpu"):
            mine, theirs = load(inventory / "host_vars" / f"{host}.yml"), load(demo / f"{host}.yml")
            assert {k: v for k, v in mine.items() if k != "vm_address"} == {
                k: v for k, v in theirs.items() if k != "vm_address"
            }
        fill(inventory, {"vm-1": f"{lab.prefix}.53", "vm-2": f"{lab.prefix}.54", "vm-gpu": f"{lab.prefix}.55"},
             router_fill(lab))  # fmt: skip
        passed = plan(inventory)
        assert passed.returncode == 0, passed.stdout + passed.stderr
    finally:
        lab_down(state)

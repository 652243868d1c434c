"""Preflight's second half: reach the APIs the selected stages will use, read-only, before any change.

A wrong token, a pinned fingerprint that no longer matches or a node that is down then stops the run
before stage host has touched the node, with the same kind of message as a lab definition problem.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpulab.labdef import Problem
from gpulab.pve import connection
from gpulab.pve.client import PveAuthError, PveConnectionError, PveError

# The stages of site.yml (its play tags) and the ones that talk to the PVE API.
STAGES = ("host", "vms", "network", "guests", "k3s", "hami", "hami-proof", "workloads", "verify")
# The stages that run only when named (--tags): they start pods of their own.
OPT_IN_STAGES = frozenset({"hami-proof", "workloads"})
PVE_STAGES = frozenset({"vms", "network", "verify"})
# The stages that log in to the VMs and use sudo there.
SUDO_STAGES = frozenset({"guests", "k3s", "hami", "hami-proof", "workloads", "verify"})
# A reachability check, not a run: fail fast rather than retry for minutes.
TIMEOUT_S = 10
RETRIES = 1


def selected_stages(run_tags: Iterable[str] | None, skip_tags: Iterable[str] | None) -> set[str]:
    """The stages an ansible-playbook run with these --tags / --skip-tags runs (OPT_IN_STAGES only when named)."""
    run = set(run_tags or ["all"])
    skip = set(skip_tags or [])
    chosen = set(STAGES) - OPT_IN_STAGES if "all" in run else run & set(STAGES)
    return chosen - skip


def reach_pve(settings: Mapping[str, Any]) -> tuple[str | None, Problem | None]:
    """GET /version with the inventory's API settings: (what answered, None) or (None, the problem)."""
    params = connection.params_from_inventory(settings) | {"api_timeout": TIMEOUT_S, "api_retries": RETRIES}
    url = params.get("api_url")
    try:
        version = connection.connect(params).get("version") or {}
    except PveAuthError as exc:
        return None, Problem(
            "all",
            "pve_api_token_id" if params.get("api_token_id") else "pve_api_user",
            params.get("api_token_id") or params.get("api_user"),
            f"the Proxmox VE API at {url} refused these credentials ({exc.message})",
            "correct the token ID and secret (or the user and password) in the inventory or the vault",
        )
    except PveConnectionError as exc:
        return None, Problem(
            "all",
            "pve_api_url",
            url,
            f"the Proxmox VE API did not answer ({exc.message})",
            "start the node or correct the address and port; a self-signed certificate needs "
            "pve_api_fingerprint or pve_api_ca_file",
        )
    except (PveError, ValueError) as exc:
        return None, Problem(
            "all",
            "pve_api_url",
            url,
            f"the Proxmox VE API could not be asked GET /version ({exc})",
            "check that the URL points at the node's API (https://ADDRESS:8006)",
        )
    return f"Proxmox VE API at {url}: version {version.get('version', '?')}", None


GIB = 1 << 30


def existing_vm_problems(settings: Mapping[str, Any], vms: Mapping[str, Mapping[str, Any]]) -> list[Problem]:
    """What stage vms would refuse only once it has started writing, found with one read (GET
    /cluster/resources?type=vm): a VM ID held by a guest of another name or on another node, and a disk
    smaller than the one the VM has (PVE grows disks, never shrinks them)."""
    params = connection.params_from_inventory(settings) | {"api_timeout": TIMEOUT_S, "api_retries": RETRIES}
    try:
        resources = connection.connect(params).get("cluster/resources", type="vm") or []
    except (PveError, ValueError):
        return []  # reach_pve has just read /version; a failure here is left to stage vms to report
    by_id = {int(r["vmid"]): r for r in resources if r.get("vmid") is not None}
    out = []
    for host, vm in vms.items():
        have = by_id.get(int(vm["vm_id"]))
        if have is None:
            continue
        where = f"VM {vm['vm_id']}"
        if have.get("type") not in (None, "qemu") or have.get("name") not in (None, vm["vm_name"]):
            out.append(
                Problem(
                    host,
                    "vm_id",
                    vm["vm_id"],
                    f"{where} on node {have.get('node')} is the {have.get('type', 'qemu')} guest named "
                    f"{have.get('name')!r}, not {vm['vm_name']!r}; gpulab never takes over another guest",
                    "pick a free vm_id, or set vm_name to the name it has if it is this VM",
                )
            )
            continue
        if have.get("node") not in (None, vm["vm_node"]):
            out.append(
                Problem(
                    host,
                    "vm_node",
                    vm["vm_node"],
                    f"{where} ({vm['vm_name']}) is on node {have.get('node')}",
                    f"set vm_node: {have.get('node')}, or migrate the VM first",
                )
            )
            continue
        size = int(have.get("maxdisk") or 0)
        if size > int(vm["vm_disk_gb"]) * GIB:
            now = -(-size // GIB)
            out.append(
                Problem(
                    host,
                    "vm_disk_gb",
                    vm["vm_disk_gb"],
                    f"{where} ({vm['vm_name']}) has a {now} GB disk now, and PVE cannot shrink a disk",
                    f"set vm_disk_gb: {now} (or more, to grow it)",
                )
            )
    return out

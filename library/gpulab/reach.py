"""Preflight's second half: reach the APIs the selected stages will use, read-only, before any change.

A wrong token, a pinned fingerprint that no longer matches or a node that is down then stops the run
before stage host has touched the node, with the same kind of message as a lab definition problem.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpulab.labdef import LabDefinition, Problem, gpu_ids
from gpulab.labdef.node_checks import reboot_allowed
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


# The read of the VM list for a run whose stages need no API (absent_vms): once, and not for long.
VM_LIST_TIMEOUT_S = 5
# The stages that log in to VMs, and the group of the VMs each logs in to (playbooks/guests.yml ... verify.yml).
LOGIN_STAGES = {
    "guests": "vms",
    "verify": "vms",
    "k3s": "k3s_cluster",
    "hami": "k3s_cluster",
    "hami-proof": "k3s_cluster",
    "workloads": "k3s_cluster",
}


def login_hosts(
    stages: Iterable[str], groups: Mapping[str, Sequence[str]], limited: Iterable[str]
) -> list[str]:
    """The VMs a run of `stages` logs in to, in the inventory's order: the groups of its stages that log in
    (LOGIN_STAGES), within `limited` (the hosts --limit leaves). None without stage vms' own look at them
    (`vms` in `stages`): stage vms creates and starts them, and sets aside the ones it holds back."""
    stages = set(stages)
    if "vms" in stages:
        return []
    wanted = {LOGIN_STAGES[s] for s in stages if s in LOGIN_STAGES}
    hosts = set().union(*(set(groups.get(g) or []) for g in wanted)) if wanted else set()
    if "k3s_cluster" in wanted:
        hosts |= set(groups.get("k3s_server") or []) | set(groups.get("k3s_agent") or [])
    keep = set(limited)
    return [h for h in groups.get("vms") or [] if h in hosts and h in keep]


def absent_vm_problems(
    definition: LabDefinition,
    hosts: Sequence[str],
    resources: Sequence[Mapping[str, Any]],
    stages: Iterable[str],
) -> list[Problem]:
    """The VMs of `hosts` that a run without stage vms would meet as unreachable, from PVE's VM list
    (GET /cluster/resources?type=vm): one that does not exist yet, and one that is stopped, a GPU VM most
    often because stage vms held it back while its node waited for a reboot. A stopped k3s server is left
    out: the run names it down and goes on without it (playbooks/k3s_speaker.yml)."""
    by_id = {int(r["vmid"]): r for r in resources if r.get("vmid") is not None}
    shown = ",".join(sorted(stages))
    out = []
    for host in hosts:
        vm = definition.vms.get(host)
        if vm is None or vm.get("vm_id") is None:
            continue
        vmid, node = vm["vm_id"], vm.get("vm_node")
        where = f"{host} (VM {vmid} on node {node})"
        have = by_id.get(int(vmid))
        if have is None:
            why = f"{where} does not exist yet, and this run's stages ({shown}) log in to it"
            fix = "run site.yml without --tags (or add vms to --tags): stage vms creates and starts it"
            out.append(Problem(host, "vm_id", vmid, why, fix))
            continue
        status = str(have.get("status") or "unknown")
        if status == "running" or host in definition.k3s_servers:
            continue
        out.append(_stopped_vm_problem(definition, host, where, status, shown))
    return out


def _stopped_vm_problem(definition: LabDefinition, host: str, where: str, status: str, shown: str) -> Problem:
    vm = definition.vms[host]
    vmid, cards = vm["vm_id"], gpu_ids(vm)
    why = f"{where} is {status}, and this run's stages ({shown}) log in to it: nothing answers at its address"
    if not cards:
        fix = f"start it (`qm start {vmid}` on node {vm.get('vm_node')}), or run site.yml without --tags"
        return Problem(host, "vm_id", vmid, why, fix)
    found = definition.node_by_name(str(vm.get("vm_node")))
    node_host = found[0] if found else str(vm.get("vm_node"))
    allowed = reboot_allowed(definition, node_host)
    why += (
        f". It has GPU {'+'.join(cards)}: stage vms starts a GPU VM only once its node has handed the card to "
        "vfio-pci, and holds it back while the node waits for the reboot that does"
    )
    if allowed:
        why += f" (stage host reboots {node_host}: pve_host_reboot_allowed is true there)"
        fix = (
            f"run site.yml without --tags: stage host reboots {node_host} if it still waits for that, and stage "
            f"vms starts {host}"
        )
    else:
        why += f" (pve_host_reboot_allowed is false for {node_host}, so stage host leaves that reboot to you)"
        fix = (
            f"allow the reboot (pve_host_reboot_allowed: true for {node_host}, or -e pve_host_reboot_allowed=true) "
            f"and run site.yml without --tags, or reboot {node_host} yourself and run site.yml --tags vms,"
            f"{shown}"
        )
    return Problem(host, "vm_id", vmid, why, fix)


def absent_vms(
    settings: Mapping[str, Any], definition: LabDefinition, hosts: Sequence[str], stages: Iterable[str]
) -> list[Problem]:
    """absent_vm_problems from one read of PVE's VM list, tried once; nothing when PVE does not answer (these
    stages need no API: the run goes on, and reports what it cannot reach as before)."""
    if not hosts:
        return []
    params = connection.params_from_inventory(settings) | {"api_timeout": VM_LIST_TIMEOUT_S, "api_retries": 0}
    try:
        resources = connection.connect(params).get("cluster/resources", type="vm") or []
    except (PveError, ValueError):
        return []
    return absent_vm_problems(definition, hosts, resources, stages)

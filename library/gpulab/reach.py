"""Preflight's second half: reach the APIs the selected stages will use, read-only, before any change.

A wrong token, a pinned fingerprint that no longer matches or a node that is down then stops the run
before stage host has touched the node, with the same kind of message as a lab definition problem. So do
what stage vms would meet only after stage host: a storage it needs that is disabled, missing or lacks the
content type (one GET /nodes/{node}/storage per node, :func:`storage_problems`), and a download that has
moved, vanished or changed under its URL (:func:`node_problems`, gpulab.downloads).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpulab import downloads
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


# ------------------------------------------------------------------------------------- storages and downloads
# The variable that picks each storage a run needs, by what it stores there.
IMAGE_VARS = {"import": "gpulab_os_image", "iso": "gpulab_os_iso"}
SNIPPET_VAR = "gpulab_snippet_storage"
# What PVE refuses, word for word (pve-storage Status.pm download_url; Storage.pm storage_check_enabled).
_NOT_CONFIGURED = "storage '{sid}' is not configured for content-type '{content}'"
_DISABLED = "storage '{sid}' is disabled"


def storage_needs(
    plans: Mapping[str, Mapping[str, Any]],
) -> dict[str, dict[tuple[str, str], tuple[str, str]]]:
    """node -> (storage, content) -> (host, the variable that picks it), for every VM's disk, image and
    snippet (the first VM that needs it names it)."""
    needs: dict[str, dict[tuple[str, str], tuple[str, str]]] = {}
    for plan in plans.values():
        mine = needs.setdefault(str(plan["node"]), {})
        disks = (plan.get("spec") or {}).get("disks") or []
        if disks and disks[0].get("storage"):
            mine.setdefault((disks[0]["storage"], "images"), (plan["host"], "vm_storage"))
        image = plan.get("image")
        if image:
            var = f"{IMAGE_VARS[image['content']]}.storage"
            mine.setdefault((image["storage"], image["content"]), ("all", var))
        snippet = plan.get("snippet")
        if snippet:
            mine.setdefault((snippet["storage"], "snippets"), ("all", SNIPPET_VAR))
    return needs


def _content(entry: Mapping[str, Any]) -> list[str]:
    return [c for c in str(entry.get("content") or "").split(",") if c]


def _enabled(entry: Mapping[str, Any]) -> bool:
    return str(entry.get("enabled", 1)) not in ("0", "False", "false")


def storage_problem(
    node: str, sid: str, content: str, where: tuple[str, str], storages: Mapping[str, Mapping[str, Any]]
) -> Problem | None:
    """What PVE would refuse of storage ``sid`` for ``content`` on ``node`` (``storages``: its GET
    /nodes/{node}/storage by id), or None. ``where``: the host and variable that picked it."""
    host, var = where
    holders = sorted(s for s, e in storages.items() if _enabled(e) and content in _content(e))
    if holders:
        other = f"set {var} to {' or '.join(holders)} (what node {node} has with content {content})"
    else:
        other = f"set {var} to a storage of node {node} that holds content {content}"
    entry = storages.get(sid)
    if entry is None:
        why = (
            f"node {node} has no storage '{sid}' (it has {', '.join(sorted(storages)) or 'none'}; a storage the "
            "API token may not audit is not listed either)"
        )
        return Problem(host, var, sid, why, other)
    if not _enabled(entry):
        why = f"storage '{sid}' of node {node} is disabled, and PVE refuses it ({_DISABLED.format(sid=sid)})"
        fix = f"{other}, or enable it on the node: `pvesm set {sid} --disable 0`"
        return Problem(host, var, sid, why, fix)
    have = _content(entry)
    if content not in have:
        why = (
            f"storage '{sid}' of node {node} holds content {','.join(have) or 'none'} but not {content}, and PVE "
            f"refuses it ({_NOT_CONFIGURED.format(sid=sid, content=content)})"
        )
        fix = f"run on the node `pvesm set {sid} --content {','.join([*have, content])}`, or {other}"
        return Problem(host, var, sid, why, fix)
    return None


def storage_problems(client: Any, plans: Mapping[str, Mapping[str, Any]]) -> list[Problem]:
    """Every storage the VMs need, read with one GET /nodes/{node}/storage per node: disabled, missing or
    without the content type it must hold. What stage vms would meet only after stage host has run."""
    out: list[Problem] = []
    for node, needs in storage_needs(plans).items():
        storages = {str(e.get("storage")): e for e in client.get(f"nodes/{node}/storage") or []}
        for (sid, content), where in needs.items():
            problem = storage_problem(node, sid, content, where, storages)
            if problem is not None and problem not in out:
                out.append(problem)
    return out


def needed_downloads(client: Any, plans: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(variable, image) of each image some node lacks: what stage vms will have that node download (a file
    already on its storage is not downloaded again, gpulab.pve.download). One content list per node,
    storage and content type."""
    listings: dict[tuple[str, str, str], set[str]] = {}
    out: list[tuple[str, dict[str, Any]]] = []
    for plan in plans.values():
        image = plan.get("image")
        if not image:
            continue
        key = (str(plan["node"]), image["storage"], image["content"])
        if key not in listings:
            items = client.get(f"nodes/{key[0]}/storage/{key[1]}/content", content=key[2]) or []
            listings[key] = {str(i.get("volid")) for i in items}
        if image["volume"] not in listings[key]:
            out.append((IMAGE_VARS[image["content"]], dict(image)))
    return out


def _client(settings: Mapping[str, Any]) -> Any:
    params = connection.params_from_inventory(settings) | {"api_timeout": TIMEOUT_S, "api_retries": RETRIES}
    return connection.connect(params)


def download_check_on(settings: Mapping[str, Any]) -> bool:
    """gpulab_download_check as given (default true; ``-e gpulab_download_check=false`` is a string)."""
    value = settings.get("gpulab_download_check")
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "on", "1")
    return True if value is None else bool(value)


def node_problems(
    settings: Mapping[str, Any], plans: Mapping[str, Mapping[str, Any]], fetch: Any = None
) -> list[Problem]:
    """Stage vms' storages (storage_problems), then, when they are fine, the downloads it will start
    (gpulab.downloads, from the controller; ``gpulab_download_check: false`` skips it)."""
    try:
        client = _client(settings)
        found = storage_problems(client, plans)
        if found:
            return found
        needed = needed_downloads(client, plans)
    except (PveError, ValueError):
        return []  # reach_pve has just read /version; a failure here is left to stage vms to report
    return download_problems(settings, needed, fetch)


def download_problems(
    settings: Mapping[str, Any], needed: Iterable[tuple[str, Mapping[str, Any]]], fetch: Any = None
) -> list[Problem]:
    """The online check of ``needed`` (variable, image), unless ``gpulab_download_check`` is false."""
    if not download_check_on(settings):
        return []
    if fetch is None:
        fetch = downloads.http_fetch(settings.get("gpulab_download_check_proxy") or None)
    return downloads.check_images(needed, fetch)


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

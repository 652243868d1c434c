"""The checks of the lab definition: the rules table on every value, then what ties values together
(logins and their secrets, OS images, nodes and their GPUs, memory and disk budgets, the router's
network, the k3s groups), and the inventory's own names (a misspelt variable is refused).

The VM checks are in gpulab.labdef.vm_checks. Every message names the host, the field, the value, why
it is wrong and how to fix it.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from gpulab.constants import DOWNLOAD_EXTENSION_HINTS, DOWNLOAD_EXTENSIONS, PLACEHOLDER
from gpulab.k8s import open_webui, workloads
from gpulab.labdef.catalogue import (
    BY_NAME,
    CHECKSUM_LENGTHS,
    DNS_NAME_RE,
    DOWNLOAD_URL_RE,
    FILENAME_RE,
    OS_IMAGES,
    PASSWORD_ROUTERS,
    PCI_FUNC_RE,
    PCI_SLOT_RE,
    PLACEHOLDER_RE,
    STORAGE_ID_RE,
    VENDOR_DEVICE_RE,
    known_names,
    owned_prefixes,
    role_options,
    run_switches,
)
from gpulab.labdef.definition import LabDefinition, gpu_ids, load, pinned_mib
from gpulab.labdef.hami_values import check_hami_values
from gpulab.labdef.k3s_inputs import check_k3s_inputs
from gpulab.labdef.k3s_inputs import extra_problems as k3s_extra_problems
from gpulab.labdef.monitoring_values import check_monitoring_values
from gpulab.labdef.node_checks import check_cluster
from gpulab.labdef.open_webui_values import check_open_webui_values, first_set, true
from gpulab.labdef.problems import Problem, Problems
from gpulab.labdef.registries import check_registries
from gpulab.labdef.rules import first_failure
from gpulab.labdef.vm_checks import check_vms

# An unknown variable's value is shown unless its name looks like it holds a secret.
_SECRET_NAME_RE = re.compile(r"secret|passw|token|key", re.IGNORECASE)


def _rule_problem(host: str, name: str, value: Any) -> Problem | None:
    rule = first_failure(name, value)
    return None if rule is None else Problem(host, name, value, rule.why, rule.fix)


def check_values(d: LabDefinition, out: Problems) -> None:
    """The rules table on every value the lab definition read, defaults included."""
    sections = [("all", d.globals), *d.nodes.items(), *d.vms.items(), *([d.router] if d.router else [])]
    for host, values in sections:
        for name, value in values.items():
            if (p := _rule_problem(host, name, value)) is not None:
                out.append(p)


def _placeholders(name: str, value: Any) -> list[str]:
    """The fields (`name`, `name.key`, `name[0]`) of a value that hold the placeholder."""
    if isinstance(value, str):
        return [name] if PLACEHOLDER in value else []
    if isinstance(value, dict):
        return [f for k, v in value.items() for f in _placeholders(f"{name}.{k}", v)]
    if isinstance(value, list):
        return [f for i, v in enumerate(value) for f in _placeholders(f"{name}[{i}]", v)]
    return []


PLACEHOLDER_WHY = "a placeholder: a value gpulab discover could not read, or one that is yours to decide"
PLACEHOLDER_FIX = (
    "replace it with the real value (the comment above it in the inventory says what goes there)"
)


def check_placeholders(d: LabDefinition, out: Problems) -> None:
    """A value holding CHANGE-ME (what `gpulab discover` writes where it could not read a value, or where the
    value is the user's to decide) is refused wherever it stands, with the field named. Secrets are left
    to check_api, which refuses their example placeholders without showing them."""
    sections = [("all", d.globals), *d.nodes.items(), *d.vms.items(), *([d.router] if d.router else [])]
    for host, values in sections:
        for name, value in values.items():
            if name in BY_NAME and BY_NAME[name].secret:
                continue
            for where in _placeholders(name, value):
                why = PLACEHOLDER_WHY
                out.add(host, where, PLACEHOLDER, why, PLACEHOLDER_FIX)


def check_api(d: LabDefinition, out: Problems) -> None:
    g = d.globals
    tid, secret = g.get("pve_api_token_id"), g.get("pve_api_token_secret")
    user, password = g.get("pve_api_user"), g.get("pve_api_password")
    if not tid and not user:
        fix = "set pve_api_token_id and its secret, or pve_api_user and pve_api_password"
        out.add("all", "pve_api_token_id", None, "no way to log in to the Proxmox API", fix)
    if tid and not secret:
        fix = "put vault_pve_api_token_secret in the vault or export GPULAB_PVE_API_TOKEN_SECRET"
        out.add("all", "pve_api_token_secret", None, "missing secret for the API token " + tid, fix)
    if user and not tid and not password:
        fix = "put vault_pve_api_password in the vault or export GPULAB_PVE_API_PASSWORD"
        out.add("all", "pve_api_password", None, "missing secret: password of " + user, fix)
    for name in ("pve_api_token_secret", "pve_api_password"):
        value = g.get(name)
        if value and PLACEHOLDER_RE.search(value):
            fix = "put the real secret in the vault (ansible-vault edit ...)"
            out.add("all", name, "<placeholder>", "the example placeholder was never replaced", fix)


def check_images(d: LabDefinition, out: Problems) -> None:
    """gpulab_os_image and gpulab_os_iso: what PVE's download-url needs, so the download cannot fail on it."""
    for name, content in OS_IMAGES.items():
        img = d.globals.get(name)
        if not img:
            continue
        algo = img.get("checksum_algorithm", "sha256")
        if algo not in CHECKSUM_LENGTHS:
            why = "PVE checks sha256 or sha512 here"
            out.add("all", f"{name}.checksum_algorithm", algo, why, "use sha256 or sha512")
            continue
        ck = str(img.get("checksum", ""))
        if not re.fullmatch(rf"[0-9a-fA-F]{{{CHECKSUM_LENGTHS[algo]}}}", ck):
            why = f"a {algo} checksum is {CHECKSUM_LENGTHS[algo]} hex digits"
            fix = "copy the image's line from the distribution's SHA256SUMS file"
            out.add("all", f"{name}.checksum", ck or None, why, fix)
        url = img.get("url")
        if not (isinstance(url, str) and DOWNLOAD_URL_RE.match(url)):
            fix = "give the image's full download URL"
            out.add("all", f"{name}.url", url, "PVE downloads from an http(s) URL", fix)
        for key in ("filename", "storage"):
            if not img.get(key):
                fix = f"set {name}.{key} (see inventory/homelab/group_vars/all/main.yml)"
                out.add("all", f"{name}.{key}", None, "required", fix)
        filename = img.get("filename")
        if not filename:
            continue
        field = f"{name}.filename"
        if not FILENAME_RE.match(str(filename)):
            why = "PVE keeps only letters, digits, '_', '.' and '-' of a file name (and no folder)"
            fix = "give a plain file name, e.g. noble-server-cloudimg-amd64.qcow2"
            out.add("all", field, filename, why, fix)
        elif not DOWNLOAD_EXTENSIONS[content].search(str(filename)):
            ends = DOWNLOAD_EXTENSION_HINTS[content]
            why = f"PVE stores this download as content {content}, which must end with {ends}"
            out.add("all", field, filename, why, "rename the file accordingly")


def check_nodes(d: LabDefinition, out: Problems) -> dict[str, tuple[str, dict]]:
    """The nodes and their GPUs; returns the GPUs by "node/gpu-id" -> (host, gpu) for the VM checks."""
    gpus: dict[str, tuple[str, dict]] = {}
    names: dict[str, str] = {}
    if not d.nodes:
        fix = "add the node under group proxmox with pve_node, pve_memory_mib, pve_storages"
        out.add("inventory", "group proxmox", None, "no Proxmox node in the inventory", fix)
    for host, node in d.nodes.items():
        name = node.get("pve_node")
        if name in names:
            fix = "give each node its own name as PVE knows it"
            out.add(host, "pve_node", name, f"the same node name as {names[name]}", fix)
        names[name] = host
        for sid, st in (node.get("pve_storages") or {}).items():
            if not STORAGE_ID_RE.match(str(sid)):
                fix = "use the storage id shown under Datacenter > Storage"
                out.add(host, "pve_storages", sid, "not a valid PVE storage id", fix)
            if not isinstance(st, dict) or not isinstance(st.get("content", []), list):
                why = "expected {type, content: [...], size_gb}"
                out.add(host, f"pve_storages.{sid}", st, why, "describe the storage as a mapping")
        seen_slots: dict[str, str] = {}
        for i, gpu in enumerate(node.get("pve_gpus") or []):
            where = f"pve_gpus[{i}]"
            if not isinstance(gpu, dict) or not gpu.get("id"):
                fix = "write {id: rtx3090, pci: '0000:02:00', ...}"
                out.add(host, where, gpu, "a GPU needs at least id and pci", fix)
                continue
            key = f"{name}/{gpu['id']}"
            if key in gpus:
                why = "two GPUs with the same id on this node"
                out.add(host, f"{where}.id", gpu["id"], why, "give each GPU its own id")
            gpus[key] = (host, gpu)
            slot = str(gpu.get("pci", ""))
            if not PCI_SLOT_RE.match(slot):
                why = "not a PCI slot DDDD:BB:SS (lower-case hex, no function)"
                fix = "copy it from `lspci -D` without the .function, e.g. 0000:02:00"
                out.add(host, f"{where}.pci", gpu.get("pci"), why, fix)
            elif slot in seen_slots:
                why = f"the same slot as GPU {seen_slots[slot]}"
                out.add(host, f"{where}.pci", slot, why, "list each card once")
            seen_slots[slot] = gpu["id"]
            for fn in gpu.get("functions") or []:
                if not PCI_FUNC_RE.match(str(fn)) or not str(fn).startswith(slot + "."):
                    why = f"not a function DDDD:BB:SS.F of slot {slot}"
                    fix = "list the card's functions as `lspci -D -s SLOT` shows them"
                    out.add(host, f"{where}.functions", fn, why, fix)
            vd = gpu.get("vendor_device")
            if vd is not None and not VENDOR_DEVICE_RE.match(str(vd)):
                why, fix = "not VVVV:DDDD in lower-case hex", "copy it from `lspci -nn` (e.g. 10de:2204)"
                out.add(host, f"{where}.vendor_device", vd, why, fix)
    return gpus


def check_capacity(d: LabDefinition, out: Problems) -> None:
    """Pinned memory and disk sizes against each node's memory and storages."""
    reserve = d.globals.get("gpulab_host_reserve_mib") or 0
    for host, node in d.nodes.items():
        mine = [(h, vm) for h, vm in d.vms.items() if vm.get("vm_node") == node.get("pve_node")]
        pinned = reserve + sum(pinned_mib(vm) for _, vm in mine)
        total = node.get("pve_memory_mib")
        if isinstance(total, int) and pinned > total:
            parts = ", ".join(f"{h} {pinned_mib(vm)}" for h, vm in mine)
            why = f"pinned memory {pinned} MiB ({parts}, host reserve {reserve}) exceeds it"
            fix = (
                "lower vm_memory_mib, enable ballooning with vm_balloon_min_mib on VMs without a GPU, "
                "or remove a VM"
            )
            out.add(host, "pve_memory_mib", total, why, fix)
        for sid, st in (node.get("pve_storages") or {}).items():
            size = st.get("size_gb") if isinstance(st, dict) else None
            if not isinstance(size, int | float):
                continue
            used = [
                (h, vm["vm_disk_gb"])
                for h, vm in mine
                if vm.get("vm_storage") == sid and isinstance(vm.get("vm_disk_gb"), int)
            ]
            for h, gb in used:
                if gb > size:
                    fix = f"use at most {size} GB or another storage"
                    out.add(h, "vm_disk_gb", gb, f"larger than storage {sid} ({size} GB)", fix)
            total_gb = sum(gb for _, gb in used)
            if total_gb > size and all(gb <= size for _, gb in used):
                why = f"the VM disks on it add up to {total_gb} GB"
                fix = "shrink vm_disk_gb of some VMs or put them on another storage"
                out.add(host, f"pve_storages.{sid}.size_gb", size, why, fix)


def _ip(host: str, name: str, value: Any, out: Problems) -> ipaddress.IPv4Address | None:
    if value is None:
        return None
    try:
        return ipaddress.IPv4Address(str(value))
    except ValueError:
        out.add(host, name, value, "not an IPv4 address", "write it like 192.168.100.53")
        return None


def check_router(d: LabDefinition, out: Problems) -> None:
    """The router's kind and secret, its network and pool, and every VM's address in it."""
    if d.router is None:
        fix = "add the router host under group router with router_kind, router_address, ..."
        out.add("inventory", "group router", None, "no router in the inventory", fix)
        return
    host, r = d.router
    kind = r.get("router_kind")
    if kind in PASSWORD_ROUTERS and not r.get("router_password"):
        fix = "put vault_router_password in the vault or export GPULAB_ROUTER_PASSWORD"
        out.add(host, "router_password", None, f"missing secret: the {kind} router's password", fix)
    try:
        net = ipaddress.IPv4Network(str(r.get("router_subnet")), strict=True)
    except ValueError as exc:
        why = f"not an IPv4 network ({exc})"
        out.add(host, "router_subnet", r.get("router_subnet"), why, "write it like 192.168.100.0/24")
        return
    raddr = _ip(host, "router_address", r.get("router_address"), out)
    if raddr is not None and raddr not in net:
        fix = "fix the router's address or the subnet"
        out.add(host, "router_address", str(raddr), f"outside router_subnet {net}", fix)
    pool = r.get("router_dhcp_pool") or {}
    start = _ip(host, "router_dhcp_pool.start", pool.get("start"), out)
    end = _ip(host, "router_dhcp_pool.end", pool.get("end"), out)
    if start and end:
        if start not in net or end not in net:
            fix = "give a pool inside the router's subnet"
            out.add(host, "router_dhcp_pool", f"{start}-{end}", f"not inside {net}", fix)
        elif start > end:
            out.add(host, "router_dhcp_pool", f"{start}-{end}", "start is after end", "swap start and end")
    seen: dict[ipaddress.IPv4Address, str] = {}
    for vhost, vm in d.vms.items():
        addr = _ip(vhost, "vm_address", vm.get("vm_address"), out)
        if addr is None:
            continue
        if addr not in net:
            why, fix = f"outside the router's subnet {net}", f"pick an address in {net}"
        elif addr in (net.network_address, net.broadcast_address):
            why, fix = f"the network or broadcast address of {net}", "pick a host address"
        elif addr == raddr:
            why, fix = "that is the router's own address", "pick another free address"
        elif addr in seen:
            why, fix = f"already given to {seen[addr]}", "give every VM its own address"
        else:
            why = ""
        if why:
            out.add(vhost, "vm_address", str(addr), why, fix)
        seen.setdefault(addr, vhost)
    for nhost, node in d.nodes.items():
        addr = node.get("ansible_host")
        if addr and str(addr) in {str(a) for a in seen}:
            vhost = seen[ipaddress.IPv4Address(str(addr))]
            why = f"that is the address of Proxmox node {nhost}"
            out.add(vhost, "vm_address", str(addr), why, "pick another free address")


def _is_dns_name(value: str) -> bool:
    """A DNS name: at most 253 characters of dot-separated labels (each a DNS_NAME_RE label), not all digits."""
    labels = value.split(".")
    return (
        len(value) <= 253
        and all(DNS_NAME_RE.match(label) for label in labels)
        and not value.replace(".", "").isdigit()
    )


def check_registration(d: LabDefinition, out: Problems) -> None:
    """k3s_registration_address: the fixed address agents and joining servers register through. A DNS name
    is the user's to resolve; an IPv4 address must be on the router's LAN and outside its DHCP pool unless
    stage network reserves it (a VM's vm_address), else the router may lease it to another device."""
    value = d.globals.get("k3s_registration_address")
    if not value:
        return  # the first server's vm_address, checked with the VMs
    name = "k3s_registration_address"
    try:
        addr = ipaddress.IPv4Address(str(value))
    except ValueError:
        if not _is_dns_name(str(value)):
            why = "neither an IPv4 address nor a DNS name"
            fix = "give a DNS name that resolves to the k3s servers, or a free IPv4 address on the LAN"
            out.add("all", name, value, why, fix)
        return
    router = _router_net(d)
    if router is None:
        return  # reported by check_router
    net, router_address, start, end = router
    owners = {str(vm.get("vm_address")): h for h, vm in d.vms.items() if vm.get("vm_address")}
    servers = ", ".join(d.k3s_servers) or "the servers"
    if addr not in net:
        why = f"outside the router's subnet {net}: agents on the LAN would not reach the servers through it"
        fix = f"use a free address in {net} outside the DHCP pool, a server's vm_address, or a DNS name"
        out.add("all", name, str(addr), why, fix)
    elif addr in (net.network_address, net.broadcast_address) or str(addr) == router_address:
        why = f"the network, broadcast or router address of {net}"
        out.add("all", name, str(addr), why, "pick a free host address outside the DHCP pool")
    elif str(addr) in owners and owners[str(addr)] not in d.k3s_servers:
        why = f"that is the address of {owners[str(addr)]}, which is not a k3s server ({servers})"
        out.add("all", name, str(addr), why, "use a server's vm_address, a free address or a DNS name")
    elif start and end and start <= addr <= end and str(addr) not in owners:
        why = (
            f"inside the router's DHCP pool {start}-{end} and no reservation holds it (stage network "
            "reserves only the VMs' addresses): the router may lease it to another device"
        )
        fix = f"pick a free address of {net} outside {start}-{end}, or a server's vm_address, or a DNS name"
        out.add("all", name, str(addr), why, fix)


def check_k3s(d: LabDefinition, out: Problems) -> None:
    """The k3s groups, and the GPU engines of stage workloads against the VMs and their cards."""
    servers, agents = d.k3s_servers, d.k3s_agents
    if not servers:
        fix = "put one VM (e.g. vm-1) in group k3s_server"
        out.add("inventory", "group k3s_server", None, "k3s has no server", fix)
    elif len(servers) == 2:
        why = (
            "2 servers: embedded etcd's quorum is 2 of 2, so losing either server loses quorum and the API "
            "stops answering (less available than one server)"
        )
        fix = "use 1 server (SQLite) or 3 (quorum 2 of 3 survives losing one)"
        out.add("inventory", "group k3s_server", servers, why, fix)
    elif len(servers) % 2 == 0:
        n = len(servers)
        why = (
            f"{n} servers: embedded etcd needs an odd number for a quorum ({n // 2 + 1} of {n} survives "
            f"losing {n // 2 - 1} servers, no more than {n - 1} servers would)"
        )
        out.add("inventory", "group k3s_server", servers, why, f"use {n - 1} or {n + 1} servers")
    for h in set(servers) & set(agents):
        fix = "keep it in one of k3s_server or k3s_agent"
        out.add(h, "group k3s_agent", h, "the host is both k3s server and agent", fix)
    for h in [*servers, *agents]:
        if h not in d.vms:
            fix = "add it to group vms with its vm_* settings, or remove it from k3s"
            out.add(h, "group vms", h, "a k3s node that is not a lab VM", fix)
    check_engines(d, out)


def check_engines(d: LabDefinition, out: Problems) -> None:
    """The GPU engines of stage workloads: each on a lab VM with a GPU, then every rule of the stage's own plan
    (gpulab.k8s.workloads.plan: keys, names, cards, the memory and core shares of each card as HAMi books them,
    vLLM's memory fraction, start order), through the same function, on the cards each GPU VM has."""
    engines = d.globals.get("workloads_engines") or []
    if not isinstance(engines, list):
        return  # the rules table refuses it
    cards_by_node = {host: len(gpu_ids(vm)) for host, vm in d.vms.items() if vm.get("vm_gpu")}
    placed = True
    for i, engine in enumerate(engines):
        if not isinstance(engine, dict) or not engine.get("node"):
            continue  # the plan says what is missing
        if engine["node"] not in cards_by_node:
            fix = "use the inventory name of a VM that has vm_gpu set, e.g. vm-gpu"
            out.add("all", f"workloads_engines[{i}].node", engine["node"], "not a lab VM with a GPU", fix)
            placed = False
    if not placed:
        return
    wait_image = next(
        (v["workloads_wait_image"] for v in d.other_vars.values() if "workloads_wait_image" in v), None
    )
    err = workloads.check_engines(engines, cards_by_node, d.globals.get("k3s_version"), wait_image)
    if err is not None:
        fix = (
            err.fix
            or "change workloads_engines as the message says (its keys: docs/variables.md, role workloads)"
        )
        out.add("all", "workloads_engines", err.value, err.why, fix)
    else:
        check_lan(d, engines, out)


def _router_net(d: LabDefinition):
    """The router's subnet, its address and DHCP pool (start, end), or None when the router is not usable."""
    if d.router is None:
        return None
    _host, r = d.router
    try:
        net = ipaddress.IPv4Network(str(r.get("router_subnet")), strict=True)
    except ValueError:
        return None
    pool = r.get("router_dhcp_pool") or {}
    try:
        start, end = (
            ipaddress.IPv4Address(str(pool.get("start"))),
            ipaddress.IPv4Address(str(pool.get("end"))),
        )
    except ValueError:
        start = end = None
    return net, str(r.get("router_address")), start, end


def _has_kube_vip(d: LabDefinition) -> bool:
    """Whether stage k3s runs kube-vip (playbooks/vars/k3s_vip.yml): the registration address is an IPv4 address
    that is no VM's vm_address."""
    value = str(d.globals.get("k3s_registration_address") or "")
    try:
        ipaddress.IPv4Address(value)
    except ValueError:
        return False
    return value not in {str(vm.get("vm_address")) for vm in d.vms.values()}


def check_lan(d: LabDefinition, engines: list, out: Problems) -> None:
    """The LAN addresses of the engines with lan: true, before any change. A lan_address (kube-vip announces it)
    must be on the router's subnet, outside its DHCP pool (no reservation holds it, so the router could lease it
    to another device), and used by nothing else: not the router, a Proxmox node, a VM, the registration
    address or another engine's. Without lan_address the engine answers on its node's vm_address (ServiceLB),
    where two engines cannot take the same port."""
    router = _router_net(d)
    users: dict[str, str] = {}
    if router is not None:
        users[router[1]] = "the router"
    for host, node in d.nodes.items():
        if node.get("ansible_host"):
            users[str(node["ansible_host"])] = f"Proxmox node {host}"
    for host, vm in d.vms.items():
        if vm.get("vm_address"):
            users[str(vm["vm_address"])] = f"VM {host}"
    if d.globals.get("k3s_registration_address"):
        users[str(d.globals["k3s_registration_address"])] = (
            "k3s_registration_address (kube-vip's control plane)"
        )
    taken: dict[str, str] = {}  # lan_address -> engine
    ports: dict[tuple[str, int], str] = {}  # (node address, port) -> engine, for ServiceLB
    for i, engine in enumerate(engines):
        lan = workloads.lan_settings(engine)  # the plan accepted it
        if lan is None:
            continue
        name, field = engine["name"], f"workloads_engines[{i}].lan_address"
        if lan["address"] is None:
            node_address = str(d.vms.get(engine["node"], {}).get("vm_address") or engine["node"])
            other = ports.setdefault((node_address, lan["port"]), name)
            if other != name:
                why = (
                    f"engines {other} and {name} both take port {lan['port']} on {engine['node']}'s address "
                    f"{node_address} (k3s' ServiceLB): only one can have it"
                )
                out.add("all", f"workloads_engines[{i}].lan_port", lan["port"], why,
                        "give one of them another lan_port, or a lan_address of its own")  # fmt: skip
            continue
        addr = ipaddress.IPv4Address(lan["address"])
        if not _has_kube_vip(d):
            why = (
                "no kube-vip runs in this lab to announce it: kube-vip runs for a k3s_registration_address that "
                "is an IPv4 address and no VM's vm_address (several servers)"
            )
            fix = "leave lan_address out (the engine answers on its node's vm_address), or set up kube-vip's VIP"
            out.add("all", field, lan["address"], why, fix)
            continue
        if lan["address"] in taken:
            why = (
                f"given to two engines, {taken[lan['address']]} and {name}; each LAN address is one engine's"
            )
            out.add("all", field, lan["address"], why, "give one of them another free address")
            continue
        taken[lan["address"]] = name
        if router is None:
            continue  # reported by check_router
        net, _gw, start, end = router
        if addr not in net:
            why = f"outside the router's subnet {net}: the LAN would not reach the engine there"
            out.add("all", field, lan["address"], why, f"pick a free address of {net} outside the DHCP pool")
        elif addr in (net.network_address, net.broadcast_address):
            why = f"the network or broadcast address of {net}"
            out.add("all", field, lan["address"], why, "pick a free host address outside the DHCP pool")
        elif lan["address"] in users:
            why = f"already in use: that is the address of {users[lan['address']]}"
            out.add("all", field, lan["address"], why, f"pick a free address of {net} outside the DHCP pool")
        elif start and end and start <= addr <= end:
            why = f"inside the router's DHCP pool {start}-{end}: the router may lease it to another device"
            out.add("all", field, lan["address"], why, f"pick a free address of {net} outside {start}-{end}")
    check_open_webui_lan(d, router, users, taken, ports, out)


def check_open_webui_lan(
    d: LabDefinition, router, users: dict[str, str], taken: dict[str, str], ports: dict, out: Problems
) -> None:
    """Where Open WebUI answers on the LAN (workloads_open_webui: true), as an engine's address is checked: a
    workloads_open_webui_lan_address (kube-vip announces it) on the router's subnet, outside its DHCP pool, no
    other machine's nor an engine's (naming it); without one, k3s' ServiceLB serves its lan_port on every node,
    where no LAN engine without a lan_address may take the same port."""
    if not true(first_set(d, "workloads_open_webui")):
        return
    field, value = "workloads_open_webui_lan_address", first_set(d, "workloads_open_webui_lan_address")
    port = first_set(d, "workloads_open_webui_lan_port") or open_webui.LAN_PORT
    if value is None:
        for (node_address, taken_port), engine in ports.items():
            if str(taken_port) == str(port):
                why = (
                    f"Open WebUI and engine {engine} both take port {port} (k3s' ServiceLB serves Open WebUI's "
                    f"port on every node, {node_address} too): only one can have it"
                )
                fix = (
                    "give workloads_open_webui_lan_port another port, or Open WebUI a lan_address of its own"
                )
                out.add("all", "workloads_open_webui_lan_port", port, why, fix)
        return
    try:
        address = open_webui.lan_address(value)
    except open_webui.OpenWebUIError:
        why = "not an IPv4 address"
        out.add("all", field, value, why, "give a free address of the router's subnet outside its DHCP pool")
        return
    assert address is not None
    if not _has_kube_vip(d):
        why = (
            "no kube-vip runs in this lab to announce it: kube-vip runs for a k3s_registration_address that "
            "is an IPv4 address and no VM's vm_address (several servers)"
        )
        fix = "leave it empty (Open WebUI answers on the nodes' addresses), or set up kube-vip's VIP"
        out.add("all", field, address, why, fix)
        return
    if address in taken:
        why = f"given twice, to engine {taken[address]} and to Open WebUI; each LAN address is one service's"
        out.add("all", field, address, why, "give Open WebUI another free address")
        return
    if router is None:
        return  # reported by check_router
    net, _gw, start, end = router
    addr = ipaddress.IPv4Address(address)
    if addr not in net:
        why = f"outside the router's subnet {net}: the LAN would not reach Open WebUI there"
        out.add("all", field, address, why, f"pick a free address of {net} outside the DHCP pool")
    elif addr in (net.network_address, net.broadcast_address):
        out.add("all", field, address, f"the network or broadcast address of {net}",
                "pick a free host address outside the DHCP pool")  # fmt: skip
    elif address in users:
        why = f"already in use: that is the address of {users[address]}"
        out.add("all", field, address, why, f"pick a free address of {net} outside the DHCP pool")
    elif start and end and start <= addr <= end:
        why = f"inside the router's DHCP pool {start}-{end}: the router may lease it to another device"
        out.add("all", field, address, why, f"pick a free address of {net} outside {start}-{end}")


def _unknown(host: str, name: str, value: Any, known: Iterable[str]) -> Problem:
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
    shown = "<hidden>" if value is not None and _SECRET_NAME_RE.search(name) else value
    why = "unknown variable: neither the lab definition nor a role reads it"
    if close:
        return Problem(
            host, name, shown, f"{why} (did you mean {close[0]}?)", f"rename it to {close[0]}, or remove it"
        )
    return Problem(host, name, shown, why, "remove it, or use a name from docs/variables.md")


EXTRA_VARS = "extra vars (-e)"


def check_extra_vars(extra: dict[str, Any], d: LabDefinition | None = None) -> list[Problem]:
    """The variables given with -e for this run: one with a prefix gpulab owns that neither the lab definition,
    a role nor a playbook reads is a typo (`-e pve_host_reboot_alowed=true` would otherwise pass silently and
    the node would not be rebooted), refused with the nearest known name. The values of known ones are checked
    where the lab definition reads them (hostvars hold the extra vars too); the k3s roles' inputs, which -e
    sets over the playbook's, through the roles' own rules (gpulab.labdef.k3s_inputs) with the definition `d`."""
    known = known_names() | run_switches()
    prefixes = owned_prefixes()
    out: list[Problem] = []
    for name in sorted(extra):
        if name.startswith(prefixes) and name not in known:
            p = _unknown(EXTRA_VARS, name, extra[name], known)
            out.append(replace(p, why=p.why.replace("unknown variable", "unknown variable given with -e", 1)))
    if d is not None:
        out.extend(k3s_extra_problems(d, extra))
    return out


def check_names(d: LabDefinition, out: Problems) -> None:
    """The inventory's variables beyond the catalogue: each must be a role's option and keep its rules.

    A variable set for several hosts (group_vars) is reported once, naming its hosts, or `all`."""
    known = known_names()
    options = role_options()
    found: dict[tuple[str, str, str], tuple[Problem, list[str]]] = {}
    for host, variables in d.other_vars.items():
        for name, value in variables.items():
            if name not in known:
                p = _unknown(host, name, value, known)
            elif (p := _rule_problem(host, name, value)) is not None and options[name].get("no_log"):
                p = replace(p, value="<hidden>")
            if p is not None:
                found.setdefault((p.field, repr(p.value), p.why), (p, []))[1].append(host)
    everyone = set(d.other_vars)
    for p, hosts in found.values():
        where = "all" if len(everyone) > 1 and set(hosts) == everyone else ", ".join(hosts)
        out.append(replace(p, host=where))


def validate(d: LabDefinition) -> list[Problem]:
    """Every problem of the lab definition, in inventory order; empty when it is valid."""
    out = Problems(d.problems)
    check_placeholders(d, out)
    check_values(d, out)
    check_api(d, out)
    check_images(d, out)
    gpus = check_nodes(d, out)
    check_vms(d, gpus, out)
    check_cluster(d, out)
    check_capacity(d, out)
    check_router(d, out)
    check_k3s(d, out)
    check_registration(d, out)
    check_k3s_inputs(d, {}, out)
    check_registries(d, out)
    check_hami_values(d, out)
    check_monitoring_values(d, out)
    check_open_webui_values(d, out)
    check_names(d, out)
    # one message per (host, field, why): a missing value may be reported by two checks; a placeholder only
    # as such (what else its field breaks follows from it)
    # a value of the wrong type that is the placeholder (pve_memory_mib: CHANGE-ME) is reported as one
    out = Problems(
        replace(p, value=PLACEHOLDER, why=PLACEHOLDER_WHY, fix=PLACEHOLDER_FIX)
        if isinstance(p.value, str) and PLACEHOLDER in p.value and p.why.startswith("expected a ")
        else p
        for p in out
    )
    held = {(p.host, p.field) for p in out if p.why == PLACEHOLDER_WHY}
    unique: dict[tuple[str, str, str], Problem] = {}
    for p in out:
        if (p.host, p.field) in held and p.why != PLACEHOLDER_WHY:
            continue
        unique.setdefault((p.host, p.field, p.why), p)
    return list(unique.values())


def check(
    groups: dict[str, Iterable[str]],
    hostvar: Callable[[str, str], Any],
    names: Callable[[str], Iterable[str]],
) -> tuple[LabDefinition, list[Problem]]:
    """Read and validate the lab definition (see gpulab.labdef.definition.load for the arguments)."""
    definition = load(groups, hostvar, names)
    return definition, validate(definition)

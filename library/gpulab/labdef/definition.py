"""The lab definition as read from the inventory: one dict per host, defaults applied, types checked.

Nothing here knows about Ansible. The caller hands in the groups, ``hostvar(host, name)`` (a host's
variable, templated, or None) and ``names(host)`` (the names the inventory itself sets for that host:
its inventory file, group_vars and host_vars; no facts, no extra vars).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gpulab.labdef.catalogue import BY_NAME, CATALOGUE, GROUPS, Var, owned_prefixes
from gpulab.labdef.problems import Problem

# The router host's connection variables, read with its catalogue variables: an SSH router (dnsmasq,
# openwrt) is reached with them (gpulab.routerspec). Its ansible_password is a secret and is not read here.
ROUTER_CONNECTION = (
    "ansible_host",
    "ansible_port",
    "ansible_user",
    "ansible_connection",
    "ansible_ssh_private_key_file",
    "ansible_ssh_common_args",
    "ansible_ssh_extra_args",
    "ansible_host_key_checking",
)


@dataclass
class LabDefinition:
    """The user's lab definition as read from the inventory, defaults applied."""

    globals: dict[str, Any]
    nodes: dict[str, dict[str, Any]]  # inventory host -> vars
    vms: dict[str, dict[str, Any]]
    router: tuple[str, dict[str, Any]] | None
    k3s_servers: list[str]
    k3s_agents: list[str]
    problems: list[Problem] = field(default_factory=list)
    # Every host of the groups, in inventory order: the variables with a gpulab or role prefix that the
    # inventory sets for it and the catalogue does not read (role options, and misspellings), with values.
    other_vars: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Each node host's pve_host_reboot_allowed as the run sees it (extra vars too); None when not set.
    node_reboot_allowed: dict[str, Any] = field(default_factory=dict)
    # Each node host's pve_host_nomodeset as the run sees it (extra vars too); None when not set (auto).
    node_nomodeset: dict[str, Any] = field(default_factory=dict)

    def node_by_name(self, pve_node: str) -> tuple[str, dict[str, Any]] | None:
        for host, node in self.nodes.items():
            if node.get("pve_node") == pve_node:
                return host, node
        return None


def gpu_ids(vm: dict[str, Any]) -> list[str]:
    """The card ids a VM's ``vm_gpu`` names, in hostpci order: none, the one id, or each id of its list."""
    value = vm.get("vm_gpu")
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def pinned_mib(vm: dict[str, Any]) -> int:
    """Memory PVE cannot take back from a VM: all of it with a GPU or without ballooning,
    else its balloon floor (which defaults to all of it)."""
    mem = vm.get("vm_memory_mib") if isinstance(vm.get("vm_memory_mib"), int) else 0
    if vm.get("vm_gpu") or not vm.get("vm_balloon"):
        return mem
    floor = vm.get("vm_balloon_min_mib")
    return min(floor, mem) if isinstance(floor, int) else mem


_TYPES: dict[str, Callable[[Any], bool]] = {
    "str": lambda v: isinstance(v, str),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "list": lambda v: isinstance(v, list),
    "dict": lambda v: isinstance(v, dict),
    # one value or several (vm_gpu: one card id, or a list of them)
    "str or list": lambda v: isinstance(v, str | list),
}


def _coerce(host: str, var: Var, value: Any, problems: list[Problem]) -> Any:
    """Check a value's type; return it (bools and ints from strings are refused: YAML gives types)."""
    if _TYPES[var.type](value):
        return value
    if var.type == "int" and isinstance(value, str) and value.strip().isdigit():
        return int(value)  # templated values arrive as strings
    if var.type == "float" and isinstance(value, str) and re.fullmatch(r"\s*\d+(\.\d+)?\s*", value):
        return float(value)
    if var.type == "bool" and isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if var.type in ("str", "str or list") and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    kind = var.type.replace(" or ", " or a ")
    why = f"expected a {kind}, got {type(value).__name__}"
    problems.append(Problem(host, var.name, value, why, f"write it as a {kind} ({var.doc})"))
    return var.default


def _read(host: str, scope: str, get: Callable[[str], Any], problems: list[Problem]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for var in CATALOGUE:
        if var.scope != scope:
            continue
        value = get(var.name)
        if value is None or (var.secret and value == ""):
            if var.required:
                fix = f"set it in the inventory ({var.doc})"
                problems.append(Problem(host, var.name, None, "required and not set", fix))
            out[var.name] = var.default
            continue
        out[var.name] = _coerce(host, var, value, problems)
    return out


def load(
    groups: dict[str, Iterable[str]],
    hostvar: Callable[[str, str], Any],
    names: Callable[[str], Iterable[str]],
) -> LabDefinition:
    """Read the lab definition; ``hostvar(host, name)`` returns a host's variable or None, ``names(host)``
    the names the inventory sets for the host."""
    problems: list[Problem] = []
    groups = {g: list(groups.get(g) or []) for g in GROUPS}
    everyone = list(dict.fromkeys(h for g in GROUPS for h in groups[g]))
    first = (groups["proxmox"] or sorted(everyone) or ["all"])[0]
    glob = _read("all", "all", lambda n: hostvar(first, n), problems)
    nodes = {}
    for h in groups["proxmox"]:
        nodes[h] = _read(h, "proxmox", lambda n, h=h: hostvar(h, n), problems)
        nodes[h]["ansible_host"] = hostvar(h, "ansible_host")
    vms = {}
    for h in groups["vms"]:
        vm = _read(h, "vms", lambda n, h=h: hostvar(h, n), problems)
        vm["vm_name"] = vm.get("vm_name") or h
        vms[h] = vm
    router = None
    if groups["router"]:
        rh = groups["router"][0]
        router = (rh, _read(rh, "router", lambda n: hostvar(rh, n), problems))
        router[1].update((name, hostvar(rh, name)) for name in ROUTER_CONNECTION)
        for extra in groups["router"][1:]:
            fix = f"keep one host in group router (first is {rh})"
            problems.append(Problem(extra, "group router", extra, "only one router is supported", fix))
    prefixes = owned_prefixes()
    other_vars = {
        h: {n: hostvar(h, n) for n in sorted(set(names(h))) if n.startswith(prefixes) and n not in BY_NAME}
        for h in everyone
    }
    reboots = {h: hostvar(h, "pve_host_reboot_allowed") for h in groups["proxmox"]}
    nomodeset = {h: hostvar(h, "pve_host_nomodeset") for h in groups["proxmox"]}
    return LabDefinition(
        glob,
        nodes,
        vms,
        router,
        groups["k3s_server"],
        groups["k3s_agent"],
        problems,
        other_vars,
        reboots,
        nomodeset,
    )

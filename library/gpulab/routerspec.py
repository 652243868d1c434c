"""The lab's router and each VM's reservation, resolved once into what stage network sends.

`resolve(lab, setting)` is pure: it takes a lab definition (defaults applied, see gpulab.labdef) and
`setting(name)`, the run's value of an option of role router_dhcp that shapes the reservations (None when
the run does not set it: the role's declared default applies). It returns the router as dhcp_reservation
takes it, every default and decision made (the kind's row of gpulab.routers.kinds, its URL, the SSH target,
the options merged), and one reservation per VM: its inventory name, the host name stored with it, its MAC
normalised (when the inventory fixes one) and the address it wants (planned mode) or must keep (keep mode);
then one reservation per Proxmox node (group proxmox, `machine: node`): its own address (ansible_host), which it
has as a static address and keeps in either mode, with the MAC of its LAN bridge's port that stage network reads
from the node (fact gpulab_node_lan_mac). A node's reservation is left out, with the reason in `skipped`, where
the router would refuse it (an address outside the router's subnet, or inside the pool on a router that takes
static mappings outside its pool only); nothing of gpulab ever changes a node's address.
Preflight publishes the result as the fact `gpulab_router`; roles/router_dhcp passes it to module
dhcp_reservation as its arguments.

The spec holds no secret: `secrets` names the router host's variables that hold them (router_password, and
ansible_password for an SSH router), which the role's task reads when the module runs. What only stage vms
knows (the MAC PVE gave a VM, the address it holds) joins the spec in `reservations()` (filter
dhcp_reservations).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpulab.labdef.catalogue import role_options
from gpulab.routers.kinds import KINDS, SSH, ssh_settings
from gpulab.routers.model import ip4, norm_mac

# The options of role router_dhcp the spec depends on (the others steer the run: state, known_only, ...).
SETTINGS = (
    "router_dhcp_reservation_mode",
    "router_dhcp_set_hostname",
    "router_dhcp_options",
    "router_dhcp_ssh_host_key_checking",
)
# Where the router host keeps the secrets: module option -> the variable, read at run time only.
SECRETS = {"password": "router_password", "ssh_password": "ansible_password"}

NO_ROUTER = (
    "no host in inventory group router: add the router's host with router_kind, router_address, "
    "router_subnet and router_dhcp_pool"
)


#: the host variable that holds, per kind of machine, the MAC read at run time (see reservations())
MAC_FACT = {"vm": "gpulab_vm_mac", "node": "gpulab_node_lan_mac"}


class RouterSpecError(ValueError):
    """The inventory describes no router that stage network can use (the message says how to fix it)."""


def _set(value: Any) -> Any:
    """None for a value the inventory leaves unset (an omitted one reads as Ansible's omit placeholder)."""
    if value in ("", None) or (isinstance(value, str) and value.startswith("__omit_place_holder__")):
        return None
    return value


def _setting(setting: Callable[[str], Any], name: str) -> Any:
    value = _set(setting(name))
    return role_options()[name].get("default") if value is None else value


def _bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "on", "1")
    return bool(value)


def _ssh(r: Mapping[str, Any], setting: Callable[[str], Any]) -> dict[str, Any]:
    """How an SSH router is reached, from the router host's connection variables (no password; gpulab.labdef's
    ROUTER_CONNECTION reads them with the router's catalogue variables)."""
    checking = _set(r.get("ansible_host_key_checking"))
    if checking is None:
        checking = _setting(setting, "router_dhcp_ssh_host_key_checking")
    args = " ".join(
        a for a in (_set(r.get("ansible_ssh_common_args")), _set(r.get("ansible_ssh_extra_args"))) if a
    )
    given = {
        "host": _set(r.get("ansible_host")),
        "port": _set(r.get("ansible_port")),
        "user": _set(r.get("ansible_user")),
        "key_file": _set(r.get("ansible_ssh_private_key_file")),
        "ssh_args": args or None,
        "host_key_checking": _bool(checking),
        "local": _set(r.get("ansible_connection")) == "local",
    }
    ssh = ssh_settings(r.get("router_address"), _set(r.get("router_user")), given)
    del ssh["password"]  # a secret: read at run time from the variable SECRETS names
    return ssh


def node_refusal(kind: Any, address: Any, subnet: Any, pool: Any) -> str | None:
    """Why the router would not take a reservation of a node's static `address`, or None."""
    try:
        ip = ip4(str(address))
    except ValueError:
        return f"its address (ansible_host {address!r}) is not an IPv4 address the router could reserve"
    try:
        net = ipaddress.ip_network(str(subnet), strict=False)
        first, last = ip4(str(pool["start"])), ip4(str(pool["end"]))
    except (TypeError, KeyError, ValueError):
        return None  # preflight's checks name the router's own mistakes
    if ip not in net:
        return f"{ip} is outside the router's subnet {net} (the node is on another network)"
    if not kind.cls.in_pool_allowed and first <= ip <= last:
        return (
            f"{ip} is inside the DHCP pool {first}-{last} and this router takes static mappings outside its "
            "pool only; the node keeps its static address without one"
        )
    return None


def _nodes(lab: Any, kind: Any, r: Mapping[str, Any], hostnames: bool) -> tuple[list[dict], list[dict]]:
    """Each Proxmox node's reservation (its static address, both modes) and the nodes left out, with why."""
    out, skipped = [], []
    for name, node in lab.nodes.items():
        address = _set(node.get("ansible_host"))
        if address is None:
            continue
        why = node_refusal(kind, address, r.get("router_subnet"), r.get("router_dhcp_pool"))
        if why:
            skipped.append({"host": name, "address": str(address), "why": why})
            continue
        out.append(
            {
                "host": name,
                "machine": "node",
                "hostname": name if hostnames else None,
                "mac": None,
                "address": str(address),
                "expect": None,
            }
        )
    return out, skipped


def resolve(lab: Any, setting: Callable[[str], Any]) -> dict[str, Any]:
    """The router of `lab` and one reservation per VM (see the module docstring); raises RouterSpecError."""
    if lab.router is None:
        raise RouterSpecError(NO_ROUTER)
    host, r = lab.router
    kind = KINDS.get(r.get("router_kind"))
    if kind is None:
        raise RouterSpecError(
            f"{host}: router_kind={r.get('router_kind')!r}: unknown router kind; use one of {', '.join(KINDS)}"
        )
    mode = _setting(setting, "router_dhcp_reservation_mode")
    hostnames = _bool(_setting(setting, "router_dhcp_set_hostname"))
    options = {
        **kind.defaults(),
        **(r.get("router_options") or {}),
        **(_setting(setting, "router_dhcp_options") or {}),
    }
    address = r.get("router_address")
    reservations = [
        {
            "host": name,
            "machine": "vm",
            "hostname": name if hostnames else None,
            "mac": norm_mac(str(vm["vm_mac"])) if _set(vm.get("vm_mac")) else None,
            "address": vm.get("vm_address") if mode == "planned" else None,
            "expect": vm.get("vm_address") if mode == "keep" else None,
        }
        for name, vm in lab.vms.items()
    ]
    nodes, skipped = _nodes(lab, kind, r, hostnames)
    return {
        "host": host,
        "kind": kind.name,
        "address": address,
        "subnet": r.get("router_subnet"),
        "pool": r.get("router_dhcp_pool"),
        "user": _set(r.get("router_user")),
        "url": None if kind.reach == SSH else kind.base_url(address, _set(r.get("router_url"))),
        "validate_certs": r.get("router_validate_certs"),
        "options": options,
        "ssh": _ssh(r, setting) if kind.reach == SSH else None,
        "secrets": {
            option: var for option, var in SECRETS.items() if kind.reach == SSH or option == "password"
        },
        "mode": mode,
        "reservations": reservations + nodes,
        "skipped": skipped,
    }


def reservations(
    spec: Mapping[str, Any],
    facts: Mapping[str, Mapping[str, Any]],
    new: Iterable[str] = (),
    known_only: bool = False,
) -> list[dict[str, Any]]:
    """The spec's reservations as dhcp_reservation takes them, with what the run recorded:
    `facts[host]` holds `mac` (a VM's gpulab_vm_mac, the MAC PVE gave a VM without vm_mac; a node's
    gpulab_node_lan_mac, read from its bridge by stage network: MAC_FACT) and `address` (gpulab_vm_address,
    the address a VM holds now; a node holds its own). The VMs of `new` (not created yet) are left out, and
    with `known_only` the machines whose MAC is not known yet; without it such a machine raises
    RouterSpecError."""
    new = set(new)
    out, missing = [], []
    for r in spec["reservations"]:
        if r["host"] in new:
            continue
        known = facts.get(r["host"]) or {}
        mac = r["mac"] or (norm_mac(str(known["mac"])) if _set(known.get("mac")) else None)
        if mac is None:
            missing.append(r["host"])
            continue
        node = r.get("machine") == "node"
        current = r["address"] if node else _set(known.get("address"))
        out.append(
            {
                "mac": mac,
                "address": r["address"],
                "expect": r["expect"],
                "current_address": str(current) if current else None,
                "hostname": r["hostname"],
                "name": r["host"],
            }
        )
    if missing and not known_only:
        machine = {r["host"]: r.get("machine", "vm") for r in spec["reservations"]}
        vms = [h for h in missing if machine[h] == "vm"]
        nodes = [h for h in missing if machine[h] == "node"]
        if vms:
            raise RouterSpecError(
                f"no MAC known for {', '.join(vms)}: run stage vms first (it records gpulab_vm_mac) "
                "or set vm_mac in the inventory"
            )
        raise RouterSpecError(
            f"no MAC known for node {', '.join(nodes)}: stage network reads the MAC of its LAN bridge's port "
            "from the node over SSH (gpulab_node_lan_mac); check that the node answers and has that bridge"
        )
    return out

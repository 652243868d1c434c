"""Filters of stage network.

`router_dhcp_result.addresses | list | dhcp_move_order(hostvars)` reads each VM's held address
(gpulab_vm_address,
stage vms) and its reservation (router_dhcp_reserved_address, set by roles/router_dhcp) and returns
gpulab.routers.model.move_order: `{"first": [...], "cycle": [...]}`, the order the VMs restart in.

`gpulab_router | dhcp_reservations(hostvars, new_vms, known_only)` is the router's reservations as module
dhcp_reservation takes them (gpulab.routerspec.reservations): the spec preflight resolved, with the MAC and
address stage vms recorded on each VM (gpulab_vm_mac, gpulab_vm_address) and the MAC stage network read on
each node (gpulab_node_lan_mac); the VMs of `new_vms` (not created yet) left out, and with `known_only` those
whose MAC is not known yet.

`gpulab_router | router_secrets(hostvars)` is the router's secrets as module dhcp_reservation takes them: for
each option of the spec's `secrets` (option -> variable name), the value of that variable on the router's host,
left out when it is unset or empty.
"""

from __future__ import annotations

from ansible.errors import AnsibleError, AnsibleFilterError
from ansible_collections.gpulab.homelab.plugins.plugin_utils.engine import MissingEngine

try:
    from gpulab import routerspec
    from gpulab.routers.model import Move, move_order
except ImportError as err:  # the engine runs here, on the controller: requirements.txt
    Move = move_order = routerspec = MissingEngine(err)


def dhcp_move_order(hosts, hostvars):
    moves = []
    for host in hosts or []:
        vm = hostvars[host]
        holds, reserved = vm.get("gpulab_vm_address"), vm.get("router_dhcp_reserved_address")
        moves.append(Move(host, str(holds) if holds else None, str(reserved) if reserved else None))
    return move_order(moves)


def dhcp_reservations(router, hostvars, new_vms=(), known_only=False):
    def var(host, name):
        """A host's variable, templated; one that is undefined reads as unset."""
        try:
            return hostvars[host].get(name)
        except (KeyError, AnsibleError):
            return None

    facts = {
        r["host"]: {
            "mac": var(r["host"], routerspec.MAC_FACT[r.get("machine", "vm")]),
            "address": var(r["host"], "gpulab_vm_address"),
        }
        for r in router["reservations"]
    }
    try:
        return routerspec.reservations(router, facts, new_vms or (), bool(known_only))
    except routerspec.RouterSpecError as e:
        raise AnsibleFilterError(str(e)) from None


def router_secrets(router, hostvars):
    host = hostvars[router["host"]]
    out = {}
    for option, name in (router.get("secrets") or {}).items():
        try:
            value = host.get(name)
        except (KeyError, AnsibleError):
            value = None
        if value:
            out[option] = value
    return out


class FilterModule:
    def filters(self):
        return {
            "dhcp_move_order": dhcp_move_order,
            "dhcp_reservations": dhcp_reservations,
            "router_secrets": router_secrets,
        }

"""Filters of stage network.

`router_dhcp_result.addresses | list | dhcp_move_order(hostvars)` reads each VM's held address
(gpulab_vm_address,
stage vms) and its reservation (router_dhcp_reserved_address, set by roles/router_dhcp) and returns
gpulab.routers.model.move_order: `{"first": [...], "cycle": [...]}`, the order the VMs restart in.
"""

from __future__ import annotations

from ansible_collections.gpulab.homelab.plugins.plugin_utils.engine import MissingEngine

try:
    from gpulab.routers.model import Move, move_order
except ImportError as err:  # the engine runs here, on the controller: requirements.txt
    Move = move_order = MissingEngine(err)


def dhcp_move_order(hosts, hostvars):
    moves = []
    for host in hosts or []:
        vm = hostvars[host]
        holds, reserved = vm.get("gpulab_vm_address"), vm.get("router_dhcp_reserved_address")
        moves.append(Move(host, str(holds) if holds else None, str(reserved) if reserved else None))
    return move_order(moves)


class FilterModule:
    def filters(self):
        return {"dhcp_move_order": dhcp_move_order}

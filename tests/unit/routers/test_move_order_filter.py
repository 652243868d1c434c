"""The filter roles/router_dhcp orders its moves with reads each VM's held and reserved address from hostvars."""

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "gpulab_router_filter", Path(__file__).parents[3] / "plugins" / "filter" / "router.py"
)
plugin = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plugin)


def test_the_filter_reads_stage_vms_address_and_the_reservation_of_each_host():
    hostvars = {
        "server-1": {"gpulab_vm_address": "10.0.0.55", "router_dhcp_reserved_address": "10.0.0.51"},
        "server-3": {"gpulab_vm_address": "10.0.0.31", "router_dhcp_reserved_address": "10.0.0.55"},
        "gpu": {"router_dhcp_reserved_address": "10.0.0.53"},  # held back: not started, no address yet
    }
    order = plugin.FilterModule().filters()["dhcp_move_order"](["server-1", "server-3", "gpu"], hostvars)
    assert order == {"first": ["server-1", "server-3"], "cycle": []}


ROUTER = {
    "reservations": [
        {"host": "vm-1", "machine": "vm", "mac": None, "address": None, "expect": "10.0.0.53", "hostname": "vm-1"},
        {"host": "vm-2", "machine": "vm", "mac": "BC:24:11:00:00:02", "address": None, "expect": None, "hostname": "vm-2"},
        {"host": "new", "machine": "vm", "mac": None, "address": None, "expect": None, "hostname": "new"},
        {"host": "pve", "machine": "node", "mac": None, "address": "10.0.0.5", "expect": None, "hostname": "pve"},
    ]
}  # fmt: skip


def test_the_reservations_filter_takes_what_stage_vms_and_network_recorded():
    """roles/router_dhcp passes the reservations as the module's argument: the MAC stage vms recorded for a VM
    without vm_mac, the address it holds, a node's LAN MAC; a VM not created yet is left out."""
    hostvars = {
        "vm-1": {"gpulab_vm_mac": "bc:24:11:00:00:01", "gpulab_vm_address": "10.0.0.53"},
        "vm-2": {},
        "pve": {"gpulab_node_lan_mac": "aa:bb:cc:00:00:05"},
    }
    found = plugin.FilterModule().filters()["dhcp_reservations"](ROUTER, hostvars, ["new"])
    by_host = {r["hostname"]: r for r in found}
    assert list(by_host) == ["vm-1", "vm-2", "pve"]
    assert by_host["vm-1"]["mac"].lower() == "bc:24:11:00:00:01"
    assert by_host["vm-1"]["current_address"] == "10.0.0.53"
    assert by_host["pve"]["mac"].lower() == "aa:bb:cc:00:00:05" and by_host["pve"]["address"] == "10.0.0.5"


def test_the_reservations_filter_names_a_vm_whose_mac_is_not_known():
    import pytest
    from ansible.errors import AnsibleFilterError

    reservations = plugin.FilterModule().filters()["dhcp_reservations"]
    with pytest.raises(AnsibleFilterError, match="new"):
        reservations(ROUTER, {"vm-1": {"gpulab_vm_mac": "bc:24:11:00:00:01"}, "pve": {}}, [])
    # known_only leaves such machines out instead
    kept = reservations(ROUTER, {"vm-1": {"gpulab_vm_mac": "bc:24:11:00:00:01"}}, [], True)
    assert [r["hostname"] for r in kept] == ["vm-1", "vm-2"]

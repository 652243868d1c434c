"""The filter roles/router_dhcp orders its moves with reads each VM's held and reserved address from hostvars."""

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "gpulab_router_filter", Path(__file__).parents[2] / "plugins" / "filter" / "router.py"
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

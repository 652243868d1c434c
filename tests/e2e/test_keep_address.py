"""One address per VM in keep mode, on the lab as the user has it before gpulab (fixture homelab: the VMs
exist and hold their DHCP leases at .53, .54 and .55). A vm_address that disagrees with the lease its VM
holds stops the run in preflight, before anything is written, with both addresses and the two ways out."""

from __future__ import annotations

import re
import shutil

import pytest

from .helpers import REPO, run_playbook, set_vars

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_a_vm_address_that_is_not_the_held_lease_stops_the_run_before_any_write(homelab, tmp_path):
    inventory = tmp_path / "homelab-lab"
    shutil.copytree(REPO / "inventory" / "homelab-lab", inventory)
    set_vars(inventory, "vm-2", {"vm_address": "{{ labsim_prefix }}.60"})
    before = len(homelab.requests())
    proc = run_playbook(homelab, inventory, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    prefix = homelab.prefix
    assert f"holds {prefix}.54 (its DHCP lease" in out and f"its vm_address is {prefix}.60" in out, out[
        -3000:
    ]
    assert f"vm_address: {prefix}.54" in out and "router_dhcp_reservation_mode: planned" in out
    assert "PLAY [Stage 1, host" not in out  # stopped in preflight
    assert homelab.writes(before) == []

    # the inventory as it is (the addresses the VMs hold): preflight's check passes and writes nothing
    agree = run_playbook(
        homelab, REPO / "inventory" / "homelab-lab", "--tags", "network", "--check", timeout=300
    )
    out = agree.stdout + agree.stderr
    assert "Plan the reservations (check mode)" in out, out[-3000:]
    # none of the router model's "holds" messages (an address held by lease, reservation or the VM's report, or
    # several reservations); the run lock's task name says "holds" too
    assert not re.search(r" holds (\d+ reservations|\S+ \()", out.split("PLAY [Network", 1)[0]), out[-3000:]
    assert homelab.writes(before) == []

"""Two cards on one node, both to one VM, through the whole site.yml on the network lab (fixture two-gpus:
an RTX 3060 12 GB at 0000:05:00, IOMMU group 16, beside the reference RTX 3090): stage host lets vfio-pci
claim both cards' functions at the node's boot, stage vms passes both (hostpci0 and hostpci1), the guest's
driver sees both, HAMi registers both on the node with 10 shares each; a second run changes nothing."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from builders import TWO_GPUS_RTX3060

from labsim.fixture import fixtures_dir

from .helpers import inventory_copy, lab_down, lab_up, need_root, run_playbook, set_vars

pytestmark = [pytest.mark.root, pytest.mark.slow]

RECAP = re.compile(
    r"^(?P<host>\S+)\s+: ok=\d+\s+changed=(?P<changed>\d+)\s+unreachable=\d+\s+failed=\d+", re.M
)


@pytest.fixture(scope="module")
def two_card_run(tmp_path_factory):
    need_root()
    root = tmp_path_factory.mktemp("two-cards")
    lab = lab_up(root / "lab", fixtures_dir() / "two-gpus.yml")
    try:
        inv = inventory_copy(root / "inventory")
        pve_vars = inv / "host_vars" / "pve.yml"
        gpus = yaml.safe_load(pve_vars.read_text())["pve_gpus"]
        set_vars(inv, "pve", {"pve_gpus": [*gpus, TWO_GPUS_RTX3060]})
        set_vars(inv, "vm-gpu", {"vm_gpu": ["rtx3090", "rtx3060"]})
        first = run_playbook(lab, inv, timeout=900)
        second = run_playbook(lab, inv, timeout=600)
        yield lab, first, second
    finally:
        lab_down(lab.state)


def test_both_cards_reach_the_vm_its_driver_and_hami(two_card_run):
    lab, first, _ = two_card_run
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-2000:]
    node = lab.pve_state()
    vm = node["vms"]["102"]["config"]
    assert (vm["hostpci0"], vm["hostpci1"]) == ("mapping=rtx3090,pcie=1", "mapping=rtx3060,pcie=1")
    boots = (lab.state / "net/hosts/node0/upper/var/lib/gpulab-sim/boot/last-boot.json").read_text()
    assert json.loads(boots)["cards"] == {"0000:02:00.0": "vfio", "0000:05:00.0": "vfio"}
    rows = {r["vm"]: r for r in json.loads((lab.state / "lab-table.json").read_text())}
    driver = rows["vm-gpu"]["driver"]
    assert "NVIDIA GeForce RTX 3090, 24576 MiB" in driver and "NVIDIA GeForce RTX 3060" in driver, driver
    assert rows["vm-gpu"]["hami"] == "20"  # 10 shares of each card
    assert rows["vm-gpu"]["k3s"].startswith("Ready")


def test_a_second_run_changes_nothing(two_card_run):
    _, _, second = two_card_run
    assert second.returncode == 0, second.stdout[-6000:]
    changed = {m["host"]: int(m["changed"]) for m in RECAP.finditer(second.stdout)}
    assert changed and set(changed.values()) == {0}, changed

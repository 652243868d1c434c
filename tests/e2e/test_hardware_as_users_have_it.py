"""The whole site.yml on the network lab started from the hardware fixtures of issue 43, one run each (CI time;
idempotence is proven by tests/lab/host/test_role_hardware.py on the same fixtures):

- igpu-boot-vga: the i9-10900K's UHD 630 (i915) is the boot display, the RTX 3090 beside it is passed through:
  stage host leaves nomodeset out and says why, the iGPU keeps i915 after gpulab's reboot, the lab converges;
- turing-usbc: the RTX 2080 goes to vm-gpu, its xHCI function stays on the built-in xhci_hcd: the run accepts it
  and says so, and converges;
- grub-stray-cmdline: a GRUB node with a leftover /etc/kernel/cmdline: the run stops in stage host before any
  write, naming the files and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from builders import FIXTURE_CARDS

from .helpers import RunningLab, inventory_copy, lab_down, lab_up, need_root, run_playbook, set_vars

pytestmark = [pytest.mark.root, pytest.mark.slow]

NODE = Path("net/hosts/node0")


def _site(tmp_path_factory, fixture: str, change):
    """Lab up from `fixture`, inventory/demo changed by `change(inventory)`, one site.yml run; the lab goes down."""
    need_root()
    root = tmp_path_factory.mktemp(fixture)
    lab = lab_up(root / "lab", fixture)  # by name, as `gpulab lab up --fixture NAME`
    try:
        inv = inventory_copy(root / "inventory")
        change(inv)
        yield lab, run_playbook(lab, inv, timeout=1500)
    finally:
        lab_down(lab.state)


def _gpus(inv: Path) -> list[dict]:
    return yaml.safe_load((inv / "host_vars" / "pve.yml").read_text())["pve_gpus"]


def _node_file(lab: RunningLab, path: str) -> str:
    return (lab.state / NODE / "upper" / path.lstrip("/")).read_text()


def _driver(lab: RunningLab, address: str) -> str | None:
    link = lab.state / NODE / "state/view/sys/bus/pci/devices" / address / "driver"
    return link.readlink().name if link.is_symlink() else None


@pytest.fixture(scope="module")
def igpu(tmp_path_factory):
    def change(inv):
        set_vars(inv, "pve", {"pve_gpus": [{**g, "boot_display": False} for g in _gpus(inv)]})

    yield from _site(tmp_path_factory, "igpu-boot-vga", change)


def test_an_igpu_as_the_boot_display_keeps_i915_and_the_lab_converges(igpu):
    lab, run = igpu
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "nomodeset off for pve: no passed-through card is the boot display (0000:00:02.0 is)" in run.stdout
    assert "nomodeset" not in _node_file(lab, "/etc/kernel/cmdline")
    assert _driver(lab, "0000:00:02.0") == "i915" and _driver(lab, "0000:02:00.0") == "vfio-pci"
    boots = (lab.state / NODE / "upper/var/lib/gpulab-sim/boot/boots.jsonl").read_text().splitlines()
    assert len(boots) >= 2 and json.loads(boots[-1])["state"] == "vfio"  # gpulab's reboot happened
    rows = {r["vm"]: r for r in json.loads((lab.state / "lab-table.json").read_text())}
    assert "NVIDIA GeForce RTX 3090" in rows["vm-gpu"]["driver"], rows["vm-gpu"]


@pytest.fixture(scope="module")
def turing(tmp_path_factory):
    def change(inv):
        set_vars(inv, "pve", {"pve_gpus": [*_gpus(inv), FIXTURE_CARDS["rtx2080"]]})
        set_vars(inv, "vm-gpu", {"vm_gpu": "rtx2080"})

    yield from _site(tmp_path_factory, "turing-usbc", change)


def test_a_builtin_xhci_function_is_accepted_and_the_lab_converges(turing):
    lab, run = turing
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert (
        "0000:05:00.2 (slot 0000:05:00) is held by xhci_hcd, built into the kernel (xhci_pci in" in run.stdout
    )
    assert _driver(lab, "0000:05:00.2") == "xhci_hcd"
    assert {_driver(lab, f"0000:05:00.{f}") for f in (0, 1, 3)} == {"vfio-pci"}
    vm = lab.pve_state()["vms"]["102"]["config"]
    assert vm["hostpci0"].startswith("mapping=rtx2080")
    rows = {r["vm"]: r for r in json.loads((lab.state / "lab-table.json").read_text())}
    assert "NVIDIA GeForce RTX 2080" in rows["vm-gpu"]["driver"], rows["vm-gpu"]


@pytest.fixture(scope="module")
def stray(tmp_path_factory):
    yield from _site(tmp_path_factory, "grub-stray-cmdline", lambda inv: None)


def test_a_stray_kernel_cmdline_stops_the_run_before_any_write(stray):
    lab, run = stray
    assert run.returncode != 0
    out = " ".join(run.stdout.split())
    assert "the boot loader signals disagree: /etc/kernel/cmdline exists" in out, run.stdout[-4000:]
    assert "remove the stray /etc/kernel/cmdline" in out and "proxmox-boot-tool init" in out
    assert (
        _node_file(lab, "/etc/kernel/cmdline")
        == "root=/dev/mapper/pve-root ro quiet intel_iommu=on iommu=pt\n"
    )
    assert not (lab.state / NODE / "upper/etc/modprobe.d/vfio.conf").exists()
    assert "blacklist nouveau" not in _node_file(lab, "/etc/modprobe.d/pve-blacklist.conf")
    boots = (lab.state / NODE / "upper/var/lib/gpulab-sim/boot/boots.jsonl").read_text().splitlines()
    assert len(boots) == 1  # no reboot
    assert lab.pve_state()["vms"] == {} or "102" not in lab.pve_state()["vms"]  # stage vms never ran

"""The demo with the Blackwell fixture (labsim fixture rtx5090-narrow-iommu: an RTX 5090 at 0000:05:00 beside the
reference RTX 3090, on a CPU with more address bits than its IOMMU maps) through the whole site.yml once, on the
network lab: `gpulab doctor` over real SSH names the card's traps
and nothing blocks; with nvidia_driver_flavour unset gpulab picks the open modules, and with Secure Boot on
(pre-enrolled keys) stage guests installs Canonical's signed precompiled ones instead of DKMS and proves they
load (mokutil, modinfo's signer); stage vms gives the VM the guest address width the card's 32 GiB BAR needs
(the doctor's finding, no inventory variable); the guest's nvidia-smi sees the RTX 5090, which the proprietary
modules would not. One converge only (CI time): idempotence is proven by the reference runs."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
import yaml
from builders import FIXTURE_CARDS

from labsim.fixture import fixtures_dir

from .helpers import GPULAB, inventory_copy, lab_down, lab_up, need_root, playbook_env, run_playbook, set_vars

pytestmark = [pytest.mark.root, pytest.mark.slow]


def _inventory(dest):
    """inventory/demo with the RTX 5090 on vm-gpu, Secure Boot on, the flavour and the guest address width unset."""
    inv = inventory_copy(dest)
    gpus = yaml.safe_load((inv / "host_vars" / "pve.yml").read_text())["pve_gpus"]
    set_vars(inv, "pve", {"pve_gpus": [*gpus, FIXTURE_CARDS["rtx5090"]]})
    set_vars(inv, "all", {"nvidia_driver_flavour": KeyError})  # unset: gpulab picks per card
    set_vars(inv, "vm-gpu", {"vm_gpu": "rtx5090", "vm_efi_pre_enrolled_keys": True})
    return inv


def _doctor(lab, home):
    """`gpulab doctor root@NODE` over SSH, the node's host key trusted as a user would after checking it."""
    address = lab.info["node_host"]["address"]
    scan = subprocess.run(["ssh-keyscan", "-t", "ed25519", address], capture_output=True, text=True,
                          timeout=30, check=True)  # fmt: skip
    home.mkdir()
    (home / "known_hosts").write_text(scan.stdout)
    return subprocess.run(
        [GPULAB, "doctor", "-i", lab.info["ssh_private_key"], "--known-hosts", str(home / "known_hosts"),
         f"root@{address}"],
        capture_output=True, text=True, timeout=120, check=False, env={**os.environ, "HOME": str(home)},
    )  # fmt: skip


@pytest.fixture(scope="module")
def blackwell(tmp_path_factory):
    need_root()
    root = tmp_path_factory.mktemp("blackwell")
    inv = _inventory(root / "inventory")
    lab = lab_up(root / "lab", fixtures_dir() / "rtx5090-narrow-iommu.yml")
    try:
        doctor = _doctor(lab, root / "home")
        plan = subprocess.run([GPULAB, "plan", str(inv)], capture_output=True, text=True, check=False,
                              env=playbook_env(lab))  # fmt: skip
        yield lab, doctor, plan, run_playbook(lab, inv, timeout=900), inv
    finally:
        lab_down(lab.state)


def test_doctor_over_ssh_names_the_blackwell_cards_traps(blackwell):
    _, doctor, _, _, _ = blackwell
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr  # nothing blocks passthrough
    out = doctor.stdout
    assert (
        "Card 0000:05:00: GB202 [GeForce RTX 5090] (10de:2b85, Blackwell), open kernel modules required"
        in out
    )
    assert "Blackwell cards are known to hang on the reset after a VM stops" in out
    assert "a BAR of 32 GiB needs a guest physical address width above 40 bits" in out
    assert "the IOMMU's address width (39 bits) is below the CPU's (46)" in out
    assert "stage vms gives the VM that gets this card guest-phys-bits=39" in out
    # the node's own package database (not this machine's) gives the PVE version
    assert "[ok    ] PVE: qemu-server 9.2.6, pve-manager 9.2.11" in out
    assert "[ok    ] interrupt remapping: on" in out and "Nothing blocks passthrough." in out


def test_the_plan_shows_the_signed_open_modules(blackwell):
    _, _, plan, _, _ = blackwell
    assert (
        "Driver vm-gpu: linux-modules-nvidia-580-server-open-<series of the running kernel> "
        "nvidia-headless-no-dkms-580-server-open" in (plan.stdout)
    )


def test_it_converges_with_the_open_signed_modules_under_secure_boot(blackwell):
    lab, _, _, run, _ = blackwell
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    # the role's proof ran on vm-gpu and held (modinfo's signer is Canonical's, mokutil says Secure Boot is on)
    proof = run.stdout.split(
        "TASK [gpulab.homelab.nvidia_driver : Prove the signed NVIDIA module loads with Secure Boot on]", 1
    )
    assert len(proof) == 2, run.stdout[-3000:]
    assert "ok: [vm-gpu]" in proof[1].split("TASK [", 1)[0], proof[1][:2000]
    vm = lab.pve_state()["vms"]["102"]["config"]
    # the address width came from the node's read in stage host, said in the run
    assert vm["hostpci0"].startswith("mapping=rtx5090") and vm["cpu"] == "host,guest-phys-bits=39"
    assert (
        "vm-gpu: cpu host,guest-phys-bits=39: GB202 [GeForce RTX 5090] (10de:2b85, Blackwell) at 0000:05:00 "
        "(BAR 32 GiB): the node's IOMMU maps 39 address bits and its CPU has 46" in run.stdout
    )
    assert "pre-enrolled-keys=1" in vm["efidisk0"]
    guest = lab.state / "net/hosts"
    markers = [
        p.read_text().split()[:2] for p in guest.glob("*/upper/usr/lib/gpulab-sim/nvidia-module-installed")
    ]
    assert markers == [["open", "signed"]]
    rows = {r["vm"]: r for r in json.loads((lab.state / "lab-table.json").read_text())}
    assert "NVIDIA GeForce RTX 5090, 32607 MiB" in rows["vm-gpu"]["driver"], rows["vm-gpu"]


def test_stage_vms_alone_reads_the_width_itself_and_keeps_it(blackwell):
    """Without stage host in the run, stage vms makes the doctor's read on the node itself: the VM keeps its
    width, and nothing changes."""
    lab, _, _, run, inv = blackwell
    assert run.returncode == 0
    again = run_playbook(lab, inv, "--tags", "vms", timeout=600)
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-2000:]
    assert (
        "TASK [gpulab.homelab.pve_vms : Read what its cards need of their VMs (read-only, gpulab doctor's read), node pve]"
        in (again.stdout)
    )
    assert "vm-gpu: cpu host,guest-phys-bits=39:" in again.stdout
    assert re.search(r"^localhost\s+: ok=\d+\s+changed=0\s", again.stdout, re.M), again.stdout[-3000:]
    assert lab.pve_state()["vms"]["102"]["config"]["cpu"] == "host,guest-phys-bits=39"

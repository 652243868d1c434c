"""Hardware as users have it (issue 43): a GPU guest with Secure Boot on that runs a kernel Ubuntu ships no
Canonical-signed NVIDIA modules for (the kvm flavour). Stage guests reads the running kernel's series and stops
before it installs any NVIDIA package, saying which kernel, why, and the two fixes (Secure Boot off for the DKMS
build, or a kernel that has signed modules), where today's main would install the GA kernel's -generic modules
and reboot into a kernel without an nvidia module. One site.yml (CI time)."""

from __future__ import annotations

import re

import pytest

from .helpers import lab_down, lab_up, need_root, run_playbook
from .test_gpu_server_hwe import UPPER, _inventory

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture(scope="module")
def kvm_guest(tmp_path_factory):
    need_root()
    root = tmp_path_factory.mktemp("kvm-guest")
    inv = _inventory(root / "inventory")
    fixture = root / "kvm-guest.yml"
    fixture.write_text("extends: reference\nname: kvm-guest\nguest_kernels:\n  vm-gpu: kvm\n")
    lab = lab_up(root / "lab", fixture)
    try:
        yield lab, run_playbook(lab, inv, timeout=1200)
    finally:
        lab_down(lab.state)


def test_a_kernel_without_signed_modules_stops_stage_guests_before_any_nvidia_package(kvm_guest):
    lab, run = kvm_guest
    assert run.returncode != 0, run.stdout[-4000:]
    out = " ".join(run.stdout.split())
    assert "vm-gpu runs kernel 6.8.0-1020-kvm (series kvm, linux-image-kvm), and apt has no" in out, (
        run.stdout[-4000:]
    )
    assert "Ubuntu ships no Canonical-signed NVIDIA modules for this kernel" in out
    assert "(1) turn Secure Boot off for this VM (vm_efi_pre_enrolled_keys false, then the DKMS build)" in out
    assert (
        "TASK [gpulab.homelab.nvidia_driver : Refuse a kernel without Canonical's signed NVIDIA modules]"
        in (run.stdout)
    )
    status = (lab.state / UPPER / "var/lib/dpkg/status").read_text()
    installed = set(re.findall(r"^Package: (\S+)\nStatus: install ok installed", status, re.M))
    assert not {p for p in installed if p.startswith(("linux-modules-nvidia-", "nvidia-"))}, installed
    assert "linux-image-kvm" in installed  # the guest still runs its own kernel's series

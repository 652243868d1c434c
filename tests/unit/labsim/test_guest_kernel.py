"""The kernel a lab VM runs (labsim.net.guest_kernel, issue 43): its release and packages as the guest shows them,
the lab archive's packages of each series, and the signed module that loads only on the kernel it was built for."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

from labsim import network_lab
from labsim.net import command_standins, guest_kernel, package_archive

ROOT = Path(__file__).resolve().parents[3]


def _gpu_facts():
    spec = importlib.util.spec_from_file_location("gpu_facts", ROOT / "plugins/modules/gpu_facts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_vm_of_the_hwe_series_shows_its_kernel_packages_to_dpkg(tmp_path):
    """dpkg-query on the VM's status (what gpu_facts asks) gives the HWE series for its release."""
    lower, upper = tmp_path / "image", tmp_path / "upper"
    (lower / "var/lib/dpkg").mkdir(parents=True)
    (lower / "var/lib/dpkg/status").write_text(
        "Package: sudo\nStatus: install ok installed\nArchitecture: amd64\nVersion: 1.9\nDescription: x\n"
    )
    assert guest_kernel.series_of({"guest_kernels": {"vm-gpu": "generic-hwe-24.04"}}, "vm-gpu", 102) == (
        "generic-hwe-24.04"
    )
    assert guest_kernel.series_of({}, "vm-1", 100) == "generic"
    guest_kernel.install(upper, lower, "generic-hwe-24.04")
    guest_kernel.install(upper, lower, "generic-hwe-24.04")  # a restart adds nothing twice
    fmt = "${Package}\t${db:Status-Abbrev}\t${Depends}\n"
    out = subprocess.run(
        ["dpkg-query", f"--admindir={upper}/var/lib/dpkg", "-W", "-f", fmt, "linux-image-*"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    facts = _gpu_facts()
    metas = facts.parse_kernel_metas(out)
    assert metas == {"linux-image-generic-hwe-24.04": "6.17.0-14-generic"}
    assert facts.kernel_series("6.17.0-14-generic", metas)[0] == "generic-hwe-24.04"
    assert (upper / "etc/gpulab-sim/kernel").read_text() == "6.17.0-14-generic\n"
    assert "Package: sudo\n" in (upper / "var/lib/dpkg/status").read_text()
    view, target = guest_kernel.osrelease_view(tmp_path / "state", "generic-hwe-24.04")
    assert Path(view).read_text() == "6.17.0-14-generic\n" and target == "/proc/sys/kernel/osrelease"
    with pytest.raises(guest_kernel.GuestKernelError, match="'lowlatency' is no kernel series of the lab"):
        guest_kernel.series_of({"guest_kernels": {"vm-gpu": "lowlatency"}}, "vm-gpu", 102)


def test_the_lab_archive_has_each_series_headers_and_signed_modules_where_ubuntu_has_them(tmp_path):
    paths = package_archive.build(tmp_path / "srv", tmp_path / "gnupg", kernel="6.8.0-90-generic")
    index = (tmp_path / "srv" / paths["ubuntu"] / "Packages").read_text()
    stanzas = {s.split("\n", 1)[0].removeprefix("Package: "): s for s in index.split("\n\n") if s.strip()}
    assert "Depends: linux-headers-6.17.0-14-generic" in stanzas["linux-headers-generic-hwe-24.04"]
    assert "Depends: linux-headers-6.8.0-90-generic" in stanzas["linux-headers-generic"]
    assert {"linux-headers-6.17.0-14-generic", "linux-headers-6.8.0-1020-kvm"} <= set(stanzas)
    for name in (
        "linux-modules-nvidia-580-server-generic-hwe-24.04",
        "linux-modules-nvidia-580-server-open-generic",
    ):
        assert name in stanzas
    assert not [n for n in stanzas if n.startswith("linux-modules-nvidia-") and n.endswith("-kvm")]
    (deb,) = (tmp_path / "srv" / paths["ubuntu"]).glob(
        "linux-modules-nvidia-580-server-open-generic-hwe-24.04_*.deb"
    )
    files = tmp_path / "x"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(files)], check=True)
    marker = (files / package_archive.NVIDIA_MODULE_MARKER.lstrip("/")).read_text().splitlines()
    assert marker[:2] == [
        "open signed 580.173.02 6.17.0-14-generic",
        "signer: Canonical Ltd. Kernel Module Signing 2025 Kmod",
    ]


def _boot(root: Path, marker: str, kernel: str, secure_boot: bool = True) -> bool:
    """The VM boot hook on a root with this module marker and kernel: whether the nvidia module loaded."""
    for d in ("usr/lib/gpulab-sim", "run/gpulab", "etc/gpulab-sim"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "usr/lib/gpulab-sim/nvidia-module-installed").write_text(marker)
    (root / "etc/gpulab-sim/kernel").write_text(kernel + "\n")
    (root / "etc/gpulab-sim/firmware.json").write_text(json.dumps({"efi": True, "secure_boot": secure_boot}))
    loaded = root / "run/gpulab/nvidia-loaded"
    loaded.unlink(missing_ok=True)
    subprocess.run(network_lab.VM_BOOT_HOOK, env={**os.environ, "GPULAB_HOST_ROOT": str(root)}, check=True)
    return loaded.exists()


def test_a_signed_module_loads_only_on_the_kernel_it_was_built_for(tmp_path, monkeypatch, capsys):
    """The GA series' modules on a VM that boots the HWE kernel: no module (what a guest on main got)."""
    ga = "proprietary signed 580.173.02 6.8.0-90-generic\nsigner: Canonical Ltd. Kernel Module Signing\n"
    hwe = "proprietary signed 580.173.02 6.17.0-14-generic\nsigner: Canonical Ltd. Kernel Module Signing 2025 Kmod\n"
    assert not _boot(tmp_path, ga, "6.17.0-14-generic")
    monkeypatch.setenv("GPULAB_STANDIN_ROOT", str(tmp_path))
    assert (
        command_standins.cmd_modinfo(["-F", "signer", "nvidia"]) == 1
    )  # not in /lib/modules/6.17.0-14-generic
    assert _boot(tmp_path, hwe, "6.17.0-14-generic")
    assert _boot(tmp_path, ga, "6.8.0-90-generic")
    assert _boot(
        tmp_path, "open dkms 580.173.02\n", "6.17.0-14-generic", secure_boot=False
    )  # DKMS: any kernel
    _boot(tmp_path, hwe, "6.17.0-14-generic")
    capsys.readouterr()
    assert command_standins.cmd_modinfo(["-F", "signer", "nvidia"]) == 0
    assert capsys.readouterr().out == "Canonical Ltd. Kernel Module Signing 2025 Kmod\n"

"""The stand-ins' behaviours for the cards of issue 31, one test per row of library/labsim/UPSTREAM.md, named after
its id: nvidia-smi sees only the cards the loaded kernel modules support, the boot refuses a DKMS module under
Secure Boot, modinfo names the module's signer, and the node's /sys and /proc show reset methods, BARs and
interrupt remapping as the fixture gives them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from labsim import network_lab, sysfs_tree
from labsim.fixture import load_fixture, resolve_fixture
from labsim.net import command_standins, package_archive

CARD = {
    "uuid": "GPU-e1924eea-b9bb-d537-39f2-b345087fa145",
    "memory_mib": 8192,
    "pci_bus_id": "00000000:01:00.0",
}


def smi(tmp_path, loaded, cards):
    """The nvidia-smi stand-in's (rc, stdout) for a query, with `loaded` as the module the boot loaded."""
    (tmp_path / "nvidia-loaded").write_text(loaded)
    (tmp_path / "gpus.json").write_text(json.dumps(cards))
    script = package_archive.NVIDIA_SMI.replace(
        package_archive.NVIDIA_LOADED, str(tmp_path / "nvidia-loaded")
    )
    script = script.replace("/etc/gpulab-sim/gpus.json", str(tmp_path / "gpus.json"))
    script = script.replace("/var/log/gpulab-standins.log", str(tmp_path / "standins.log"))
    script = script.replace('os.makedirs("/var/log", exist_ok=True)', "pass")
    path = tmp_path / "nvidia-smi"
    path.write_text(script.replace("#!/usr/bin/python3", f"#!{sys.executable}", 1))
    path.chmod(0o755)
    out = subprocess.run(
        [str(path), "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True
    )
    return out.returncode, out.stdout


def test_nvidia_smi_kernel_modules_mismatch(tmp_path):
    pascal = {**CARD, "name": "NVIDIA GeForce GTX 1080", "kernel_modules": "proprietary"}
    blackwell = {**CARD, "name": "NVIDIA GeForce RTX 5090", "kernel_modules": "open"}
    assert smi(tmp_path, "open dkms\n", [pascal]) == (6, "No devices were found\n")
    assert smi(tmp_path, "proprietary signed\n", [blackwell]) == (6, "No devices were found\n")
    assert smi(tmp_path, "proprietary dkms\n", [pascal]) == (0, "NVIDIA GeForce GTX 1080\n")
    assert smi(tmp_path, "open signed\n", [blackwell, {**CARD, "name": "NVIDIA GeForce RTX 3090"}]) == (
        0,
        "NVIDIA GeForce RTX 5090\nNVIDIA GeForce RTX 3090\n",
    )


def test_nvidia_smi_secure_boot_dkms(tmp_path):
    marker = tmp_path / "usr/lib/gpulab-sim/nvidia-module-installed"
    marker.parent.mkdir(parents=True)
    (tmp_path / "run/gpulab").mkdir(parents=True)
    (tmp_path / "etc/gpulab-sim").mkdir(parents=True)
    env = {**os.environ, "GPULAB_HOST_ROOT": str(tmp_path)}
    loaded = tmp_path / "run/gpulab/nvidia-loaded"
    for kind, secure_boot, loads in (
        ("open dkms", True, False),
        ("open dkms", False, True),
        ("open signed", True, True),
    ):
        marker.write_text(f"{kind}\n")
        fw = {"efi": True, "secure_boot": secure_boot}
        (tmp_path / "etc/gpulab-sim/firmware.json").write_text(json.dumps(fw) + "\n")
        loaded.unlink(missing_ok=True)
        subprocess.run(network_lab.VM_BOOT_HOOK, env=env, check=True)
        assert loaded.exists() is loads, (kind, secure_boot)
        if loads:
            assert loaded.read_text().split()[0] == kind.split()[0]


def test_modinfo_signer(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GPULAB_STANDIN_ROOT", str(tmp_path))
    assert command_standins.cmd_modinfo(["-F", "signer", "nvidia"]) == 1
    assert capsys.readouterr().err.strip() == "modinfo: ERROR: Module nvidia not found."
    marker = tmp_path / "usr/lib/gpulab-sim/nvidia-module-installed"
    marker.parent.mkdir(parents=True)
    marker.write_text("open signed\n")
    assert command_standins.cmd_modinfo(["-F", "signer", "nvidia"]) == 0
    assert capsys.readouterr().out == "Canonical Ltd. Kernel Module Signing\n"
    marker.write_text("proprietary dkms\n")
    assert command_standins.cmd_modinfo(["-F", "license", "nvidia"]) == 0
    assert capsys.readouterr().out == "NVIDIA\n"


def _rtx5090_tree(**hardware):
    node = load_fixture(resolve_fixture("rtx5090"))["nodes"][0]
    return sysfs_tree.build_tree("vfio", pci=node["pci"], hardware=hardware)


def test_sysfs_reset_method(tmp_path):
    tree = _rtx5090_tree()
    dev = "/sys/devices/pci0000:00/0000:05:00.0"
    assert tree[f"{dev}/reset_method"].data == b"bus\n" and f"{dev}/reset" in tree
    assert tree["/sys/devices/pci0000:00/0000:02:00.0/reset_method"].data == b"flr bus\n"
    node = load_fixture(resolve_fixture("rtx5090"))["nodes"][0]
    none = [{**d, "reset_method": ""} if d["id"] == "0000:05:00.0" else d for d in node["pci"]]
    tree = sysfs_tree.build_tree("vfio", pci=none)
    assert tree[f"{dev}/reset_method"].data == b"\n" and f"{dev}/reset" not in tree


def test_sysfs_resource_bars():
    lines = _rtx5090_tree()["/sys/devices/pci0000:00/0000:05:00.0/resource"].data.decode().splitlines()
    assert len(lines) == 13
    sizes = [int(e, 16) - int(s, 16) + 1 if int(e, 16) else 0 for s, e, _f in (x.split() for x in lines)]
    assert sizes[:6] == [64 << 20, 32 << 30, 0, 32 << 20, 0, 128]
    assert lines[1].endswith("0x000000000014220c") and lines[5].endswith("0x0000000000040101")
    assert int(lines[1].split()[0], 16) % (32 << 30) == 0  # a BAR is aligned to its size


def test_sysfs_interrupt_remapping():
    on = _rtx5090_tree()["/proc/interrupts"].data.decode()
    off = _rtx5090_tree(interrupt_remapping=False)["/proc/interrupts"].data.decode()
    assert " IR-PCI-MSI-0000:00:17.0 " in on and " IR-IO-APIC " in on
    assert " IR-" not in off and " PCI-MSI-0000:00:17.0 " in off
